import Foundation
import PollcastCore
import Testing

/// No healthy stream is ever cut by a timeout: streams held idle, busy and filtered for more than three times every
/// timeout that could meet them stay open, while a peer that stops reading is still dropped by the write-side bound.
@Suite(.serialized, .timeLimit(.minutes(3))) struct LongStreamTests {
  /// Reads for `seconds`; false when the stream ended meanwhile.
  static func hold(_ client: TestSSEClient, seconds: Double) -> Bool {
    do {
      try client.waitUntil(timeout: seconds, "the hold to pass") { _ in false }
      return true
    } catch {
      return "\(error)".contains("timed out")
    }
  }

  @Test func idleBusyAndFilteredStreamsOutliveEveryTimeout() async throws {
    let timeout = 1.0
    var server = ServerSettings(host: "127.0.0.1", port: 0)
    server.timeout = timeout
    server.headerTimeout = timeout
    // Heartbeats rarer than the timeout: the idle stream sends nothing at all for 4 timeouts.
    let feed = FeedSettings(heartbeatInterval: 10)
    try await RelayHarness.start(feed: feed, server: server).run { harness in
      let idle = try TestSSEClient(port: harness.port)
      let busy = try TestSSEClient(port: harness.port)
      let filtered = try TestSSEClient(port: harness.port, path: "/events?stream=101")
      for client in [idle, busy, filtered] { try client.waitForHead() }
      try await harness.waitForSubscribers { $0 == 3 }
      let publisher = Task {
        var published = 0
        let end = MonotonicClock.seconds() + 4 * timeout
        while MonotonicClock.seconds() < end {
          await harness.publish(1, stream: published % 2 == 0 ? "101" : "202", prefix: "p\(published)-")
          published += 1
          try? await Task.sleep(for: .milliseconds(100))
        }
        return published
      }
      // The idle stream, then the busy ones, each held past four timeouts (read concurrently with publishing).
      let started = MonotonicClock.seconds()
      #expect(Self.hold(busy, seconds: 4.5 * timeout), "the busy stream was cut")
      let published = await publisher.value
      #expect(Self.hold(filtered, seconds: 0.2), "the filtered stream was cut")
      #expect(
        Self.hold(idle, seconds: max(0.2, 4.5 * timeout - (MonotonicClock.seconds() - started))),
        "the idle stream was cut")
      #expect(busy.events(ofType: "message").count == published)
      #expect(filtered.events(ofType: "message").count == (published + 1) / 2)
      #expect(!idle.endedCleanly && !busy.endedCleanly && !filtered.endedCleanly)
      #expect(await harness.statistics().subscribersConnected == 3)
    }
  }

  /// The write-side bound stays: a peer whose TCP window stays shut while bytes wait for it is dropped after
  /// `server.timeout_seconds`, even when the slow-consumer byte bound is far away.
  @Test func aPeerThatStopsReadingIsDroppedByTheWriteTimeout() async throws {
    var server = ServerSettings(host: "127.0.0.1", port: 0)
    server.timeout = 1
    server.headerTimeout = 1
    let feed = FeedSettings(maxPendingBytes: 1 << 30, heartbeatInterval: 10)
    try await RelayHarness.start(feed: feed, server: server).run { harness in
      let stalled = try TestSSEClient(rawPort: harness.port)
      var small: Int32 = 4096
      setsockopt(stalled.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
      try stalled.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
      try await harness.waitForSubscribers { $0 == 1 }
      let chunk = String(repeating: "x", count: 60_000)
      for _ in 0..<200 { await harness.publish(1, prefix: chunk) }
      // Never read: the bytes wait, and the write timeout (1 s) drops the connection.
      try await harness.waitForSubscribers(timeout: 10) { $0 == 0 }
      #expect(await harness.statistics().slowConsumerDisconnects == 0, "the byte bound was not what cut it")
    }
  }
}
