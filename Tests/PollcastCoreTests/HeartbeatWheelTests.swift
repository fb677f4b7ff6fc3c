import Foundation
import Testing

@testable import PollcastCore

@Suite struct HeartbeatWheelTests {
  /// Small feeds sharing settings with a wheel run their heartbeat rounds in it, one timer for all: every reader
  /// still hears a heartbeat once an interval. A feed grown past one slice moves to a timer of its own (and back
  /// when it shrinks); a paused feed, a dropped one and one that moved out leave only entries the wheel sweeps
  /// within an interval, after which its timer stops.
  @Test func smallFeedsShareOneTimerAndLeaveIt() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let interval = 0.4
    let common = FeedCommon(FeedSettings(heartbeatInterval: interval), wheelOn: loop)
    let wheel = try #require(common.wheel)
    #expect(wheel.slots == 40, "at least 40 turns an interval: a round is never later than 1/40 of it")
    // 120 turns at most; none more often than every 10 ms, whatever the configured interval.
    let slots = [15, 5, 0.2, 0.001, 1e19, 1e-300].map { HeartbeatWheel.slots(for: $0) }
    #expect(slots == [120, 50, 20, 1, 120, 1])
    let feeds = (0..<2).map { index in
      Feed(
        loop: loop, common: common, ids: EventIDAllocator(), store: MemoryEventStore(), storeKey: "f\(index)",
        restored: nil)
    }
    let third = FeedBox(
      Feed(
        loop: loop, common: common, ids: EventIDAllocator(), store: MemoryEventStore(), storeKey: "f2", restored: nil))
    let sinks = try await loop.submit { () -> [CountingSink] in
      var sinks: [CountingSink] = []
      for feed in feeds + [third.feed!] {
        feed.assumeIsolated { feed in
          feed.start()
          for _ in 0..<2 {
            let sink = CountingSink()
            _ = feed.attach(sink: sink, requestedID: nil, streams: nil)
            sinks.append(sink)
          }
        }
      }
      #expect(wheel.entryCount == 3)
      for feed in feeds + [third.feed!] {
        feed.assumeIsolated { #expect($0.heartbeatWheelToken != nil && $0.heartbeatTimer == nil) }
      }
      return sinks
    }
    try await Task.sleep(for: .seconds(interval * 3.5))
    let counts = await loop.submit { sinks.map(\.heartbeats) }
    // Three intervals: three rounds each (a loaded machine may make one late, never two more).
    #expect(counts.allSatisfy { $0 >= 2 && $0 <= 4 }, "\(counts)")

    // Feed 0 grows past one slice: its own timer; feed 1 pauses; feed 2 goes away.
    let grown = await loop.submit { () -> [CountingSink] in
      feeds[0].assumeIsolated { feed in
        let more = (0..<(Feed.heartbeatsPerSlice * 2)).map { _ in CountingSink() }
        for sink in more { _ = feed.attach(sink: sink, requestedID: nil, streams: nil) }
        #expect(feed.heartbeatWheelToken == nil && feed.heartbeatTimer != nil)
        return more
      }
    }
    await loop.submit {
      feeds[1].assumeIsolated { feed in
        for subscriber in feed.subscribers { feed.detach(subscriber) }
        feed.pause()
        let running = feed.heartbeatRunning
        #expect(!running)
      }
    }
    weak var gone = third.feed
    await loop.submit { third.feed = nil }
    try await Task.sleep(for: .seconds(interval * 2.5))
    let (entries, grownCounts) = await loop.submit { (wheel.entryCount, grown.map(\.heartbeats)) }
    #expect(gone == nil, "the wheel holds feeds weakly")
    #expect(entries == 0, "stale entries are swept within an interval")
    #expect(grownCounts.allSatisfy { $0 >= 1 }, "the grown feed's own timer runs: \(grownCounts)")

    // Feed 0 shrinks back to one slice: at its next own tick it rejoins the wheel, which turns again.
    await loop.submit {
      feeds[0].assumeIsolated { feed in
        for subscriber in feed.subscribers.dropFirst(2) { feed.detach(subscriber) }
      }
    }
    try await Task.sleep(for: .seconds(interval))
    let (rejoined, entriesAfter) = await loop.submit {
      (feeds[0].assumeIsolated { $0.heartbeatWheelToken != nil && $0.heartbeatTimer == nil }, wheel.entryCount)
    }
    #expect(rejoined, "a feed back to one slice runs in the wheel again")
    #expect(entriesAfter == 1)
  }
}

final class FeedBox: @unchecked Sendable {  // loop only
  var feed: Feed?
  init(_ feed: Feed) { self.feed = feed }
}

/// Counts the heartbeats (broadcast bytes, the only ones a feed without events sends) a reader gets. Loop only.
final class CountingSink: SubscriberSink, @unchecked Sendable {
  var heartbeats = 0
  var pendingBytes: Int { 0 }
  func write(_ slices: [ByteSlice]) {}
  func write(_ bytes: BroadcastBytes) { heartbeats += 1 }
  func write(_ slices: [ByteSlice], whenDrained drained: @escaping () -> Void) { drained() }
  func finish() {}
  func abort() {}
}
