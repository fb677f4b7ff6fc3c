import Testing

@testable import PollcastCore

/// The feed's decisions without sockets: who gets which bytes, replay against live, slow-consumer cuts.
@Suite struct FeedPlanTests {
  /// A batch encoded into one block, as the feed publishes it: events of `streams` with ids from `first`.
  private func batch(_ streams: [String?], first: UInt64 = 10) -> [ReplayRing.Entry] {
    var bytes: [UInt8] = []
    var bounds: [(Int, Int)] = []
    for (index, stream) in streams.enumerated() {
      let offset = bytes.count
      SSEEncoder.appendEvent(id: first + UInt64(index), type: nil, data: stream ?? "all", to: &bytes)
      bounds.append((offset, bytes.count - offset))
    }
    let block = SharedBytes(bytes)
    return streams.enumerated().map { index, stream in
      ReplayRing.Entry(
        id: first + UInt64(index), stream: stream,
        slice: ByteSlice(block: block, offset: bounds[index].0, count: bounds[index].1), time: 0)
    }
  }

  private func text(_ slices: [ByteSlice]) -> String {
    slices.map {
      String(decoding: UnsafeRawBufferPointer(start: $0.block.base + $0.offset, count: $0.count), as: UTF8.self)
    }
    .joined()
  }

  @Test func aSubscriberOfEveryStreamGetsTheWholeBatch() {
    guard case .whole = FeedPlan.delivery(of: batch(["a", "b"]), to: nil) else {
      Issue.record("expected the whole batch")
      return
    }
  }

  @Test func aFilteredSubscriberGetsItsStreamsAndNoticesMergedWhereAdjacent() {
    let events = batch(["a", "a", "b", nil, "a"])
    guard case .slices(let slices) = FeedPlan.delivery(of: events, to: ["a"]) else {
      Issue.record("expected slices")
      return
    }
    // a, a merge into one slice; b is skipped; the notice (no stream) and the last a merge.
    #expect(slices.count == 2)
    #expect(text(slices) == "id: 10\ndata: a\n\nid: 11\ndata: a\n\nid: 13\ndata: all\n\nid: 14\ndata: a\n\n")
    guard case .nothing = FeedPlan.delivery(of: batch(["b"]), to: ["a"]) else {
      Issue.record("a batch of other streams is nothing")
      return
    }
  }

  @Test func onlyBytesLeftUnsentFromEarlierWritesCut() {
    #expect(!FeedPlan.cuts(pendingBytes: 0, maxPendingBytes: 100))
    #expect(!FeedPlan.cuts(pendingBytes: 100, maxPendingBytes: 100))
    #expect(FeedPlan.cuts(pendingBytes: 101, maxPendingBytes: 100))
  }

  @Test func replayGoesInChunksThenReachesTheHeadAndGoesLive() {
    var ring = ReplayRing(limits: .init(maxEvents: 100, maxBytes: 1 << 20), floorID: 9)
    for entry in batch(["a", "b", "a", "a", "b"]) { ring.append(entry) }
    let size = ring[ring.startIndex].slice.count
    // Two events' bytes per step, filtered to a.
    var step = FeedPlan.replayStep(ring: ring, after: 9, streams: ["a"], head: 14, chunkBytes: 2 * size)
    #expect(step.events == 2)
    #expect(step.cursor == 12)
    #expect(!step.reachesHead)
    #expect(text(step.slices) == "id: 10\ndata: a\n\nid: 12\ndata: a\n\n")
    step = FeedPlan.replayStep(ring: ring, after: step.cursor, streams: ["a"], head: 14, chunkBytes: 2 * size)
    #expect(step.events == 1)
    #expect(step.reachesHead)
    #expect(step.cursor == 14, "at the ring's end the subscriber is at the head and goes live")
    // From the head itself: nothing to send, live at once.
    step = FeedPlan.replayStep(ring: ring, after: 14, streams: nil, head: 14, chunkBytes: 1)
    #expect(step.events == 0 && step.reachesHead)
  }

  @Test func aReplayThatTheRingOvertookIsCut() {
    var ring = ReplayRing(limits: .init(maxEvents: 2, maxBytes: 1 << 20), floorID: 9)
    for entry in batch(["a", "a", "a", "a"]) { ring.append(entry) }
    #expect(ring.floorID == 11)
    let step = FeedPlan.replayStep(ring: ring, after: 10, streams: nil, head: 13, chunkBytes: 1 << 20)
    #expect(step.fellBehind)
    #expect(step.slices.isEmpty)
  }
}
