import Testing

@testable import PollcastCore

@Suite struct ReplayRingTests {
  private func entry(_ id: UInt64, stream: String? = "s", size: Int = 10, time: Double = 0) -> ReplayRing.Entry {
    ReplayRing.Entry(id: id, stream: stream, slice: ByteSlice([UInt8](repeating: 0x61, count: size)), time: time)
  }

  @Test func countBoundEvictsOldestFirstAndRaisesTheFloor() {
    var ring = ReplayRing(limits: .init(maxEvents: 3, maxBytes: 1000), floorID: 99)
    for id in UInt64(100)...105 { ring.append(entry(id)) }
    #expect(ring.count == 3)
    #expect(ring.oldestID == 103)
    #expect(ring.newestID == 105)
    #expect(ring.floorID == 102)
    #expect(ring.evictedCount == 3)
    #expect(ring.byteCount == 30)
  }

  @Test func byteBoundEvictsButKeepsAtLeastTheNewestEvent() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 25), floorID: 0)
    ring.append(entry(1))
    ring.append(entry(2))
    #expect(ring.count == 2)
    ring.append(entry(3))
    #expect(ring.count == 2)
    #expect(ring.oldestID == 2)
    ring.append(entry(4, size: 100))
    #expect(ring.count == 1)
    #expect(ring.oldestID == 4)
    #expect(ring.byteCount == 100)
    #expect(ring.floorID == 3)
  }

  @Test func shrinkDropsTheOldestDownToTheBytesAskedAndRaisesTheFloor() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 1000), floorID: 0)
    for id in UInt64(1)...10 { ring.append(entry(id)) }
    #expect(ring.shrink(toBytes: 35) == 70)
    #expect(ring.count == 3)
    #expect(ring.oldestID == 8)
    #expect(ring.floorID == 7)
    #expect(ring.shrink(toBytes: 100) == 0)
    #expect(ring.shrink(toBytes: 0) == 30)
    #expect(ring.isEmpty && ring.floorID == 10)
  }

  @Test func ageBoundEvictsOnlyExpiredEvents() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 1000, maxAge: 10), floorID: 0)
    ring.append(entry(1, time: 0))
    ring.append(entry(2, time: 5))
    ring.append(entry(3, time: 12))
    ring.evictExpired(now: 14)
    #expect(ring.oldestID == 2)
    ring.evictExpired(now: 100)
    #expect(ring.isEmpty)
    #expect(ring.floorID == 3)
  }

  @Test func noAgeBoundKeepsOldEvents() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 1000), floorID: 0)
    ring.append(entry(1, time: 0))
    ring.evictExpired(now: 1e9)
    #expect(ring.count == 1)
  }

  @Test func positionAfterFindsTheFirstLaterEvent() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 10_000), floorID: 0)
    for id in [UInt64(10), 11, 12, 20, 21] { ring.append(entry(id)) }
    #expect(ring[ring.position(after: 0)].id == 10)
    #expect(ring[ring.position(after: 11)].id == 12)
    #expect(ring[ring.position(after: 15)].id == 20)
    #expect(ring.position(after: 21) == ring.endIndex)
  }

  @Test func positionsStayCorrectAcrossCompaction() {
    var ring = ReplayRing(limits: .init(maxEvents: 10, maxBytes: 1 << 30), floorID: 0)
    for id in UInt64(1)...5000 { ring.append(entry(id)) }
    #expect(ring.count == 10)
    #expect(ring.oldestID == 4991)
    #expect(ring[ring.position(after: 4995)].id == 4996)
  }

  @Test func aTallyFollowsEveryChangeOfTheRingsThatCountTowardIt() {
    let tally = RingTally()
    var first = ReplayRing(limits: .init(maxEvents: 4, maxBytes: 1000, maxAge: 5), floorID: 0)
    var second = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 1000), floorID: 0)
    first.append(entry(1, size: 7))
    first.count(toward: tally)  // bytes held before joining count too
    #expect(tally.bytes == 7)
    second.count(toward: tally)
    for id in UInt64(2)...6 { first.append(entry(id, time: 10)) }  // the count bound evicts 1 and 2
    for id in UInt64(1)...5 { second.append(entry(id, stream: id % 2 == 0 ? "a" : "b", size: 3)) }
    #expect(tally.bytes == first.byteCount + second.byteCount)
    second.removeAll(stream: "a")
    #expect(tally.bytes == first.byteCount + 9)
    first.shrink(toBytes: 15)
    #expect(tally.bytes == 10 + 9)
    first.evictExpired(now: 100)
    #expect(first.isEmpty)
    #expect(tally.bytes == 9)
    second.count(toward: nil)
    #expect(tally.bytes == 0)
    second.append(entry(9, size: 50))
    #expect(tally.bytes == 0)
  }

  @Test func removingAStreamDropsOnlyItsEvents() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 10_000), floorID: 0)
    ring.append(entry(1, stream: "a"))
    ring.append(entry(2, stream: "b"))
    ring.append(entry(3, stream: "a"))
    ring.append(entry(4, stream: nil))
    #expect(ring.removeAll(stream: "a") == 2)
    #expect((ring.startIndex..<ring.endIndex).map { ring[$0].id } == [2, 4])
    #expect(ring.byteCount == 20)
    #expect(ring.floorID == 0)
  }
}

@Suite struct EventIDAllocatorTests {
  @Test func firstIDIsTheStartTimeInMicroseconds() {
    let before = EventIDAllocator.nowMicroseconds()
    var ids = EventIDAllocator()
    let first = ids.next()
    #expect(first >= before)
    #expect(ids.next() == first + 1)
    #expect(ids.head == first + 1)
  }

  @Test func firstIDIsAbovePersistedIDsEvenWhenTheClockIsBehind() {
    var ids = EventIDAllocator(startMicroseconds: 1000, persistedAtLeast: 5000)
    #expect(ids.head == 5000)
    #expect(ids.next() == 5001)
  }

  @Test func startTimeWinsWhenAhead() {
    var ids = EventIDAllocator(startMicroseconds: 9000, persistedAtLeast: 5000)
    #expect(ids.next() == 9000)
  }
}
