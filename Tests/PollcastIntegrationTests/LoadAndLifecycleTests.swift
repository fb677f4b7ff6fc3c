import Foundation
import PollcastCore
import Synchronization
import Testing

/// Many clients, races, slow and vanishing clients, over real sockets.
@Suite(.serialized, .timeLimit(.minutes(5))) struct LoadAndLifecycleTests {
  @Test func aThousandConcurrentSubscribersReceiveTheSameEventsInTheSameOrder() async throws {
    try await RelayHarness.start().run { harness in
      let clients = try (0..<1000).map { _ in try TestSSEClient(port: harness.port) }
      try await harness.waitForSubscribers(timeout: 30) { $0 == 1000 }
      var ids: [UInt64] = []
      for batch in 0..<10 { ids += await harness.publish(10, prefix: "b\(batch)-") }
      try TestClientGroup(clients: clients).waitUntilAll(timeout: 60, "100 messages") { $0.messageIDs.count >= 100 }
      for client in clients {
        #expect(client.messageIDs == ids)
      }
      let stats = await harness.statistics()
      #expect(stats.subscribersConnected == 1000)
      #expect(stats.slowConsumerDisconnects == 0)
    }
  }

  @Test func resumesRacingAPublishBurstSeeEveryLaterEventOnceAndInOrder() async throws {
    // A tiny replay step makes every resume span many loop turns, interleaved with the publisher's batches.
    try await RelayHarness.start(
      feed: FeedSettings(
        ring: .init(maxEvents: 100_000, maxBytes: 1 << 30), maxPendingBytes: 8 << 20, heartbeatInterval: 5,
        replayChunkBytes: 512)
    ).run { harness in
      let published = Locked<[UInt64]>([])
      let seed = await harness.publish(50, prefix: "seed")
      published.withLock { $0 = seed }
      let total = 4000
      let publisher = Task {
        var sent = 0
        while sent < total {
          let ids = await harness.publish(20, prefix: "burst\(sent)-")
          published.withLock { $0 += ids }
          sent += 20
          try? await Task.sleep(for: .microseconds(300))
        }
      }
      var clients: [(TestSSEClient, UInt64)] = []
      for index in 0..<40 {
        let known = published.withLock { $0 }
        let resumeFrom = known[(index * 7919) % known.count]
        clients.append(
          (try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(resumeFrom))]), resumeFrom))
        try await Task.sleep(for: .milliseconds(5))
      }
      await publisher.value
      let all = published.withLock { $0 }
      try TestClientGroup(clients: clients.map(\.0)).waitUntilAll(timeout: 60, "the last event") {
        $0.messageIDs.last == all.last
      }
      for (client, resumeFrom) in clients {
        let expected = all.filter { $0 > resumeFrom }
        let got = client.messageIDs
        #expect(got.count == expected.count, "resumed after \(resumeFrom)")
        #expect(
          got == expected,
          "resumed after \(resumeFrom): first difference at \(Array(zip(got, expected)).firstIndex { $0.0 != $0.1 } ?? -1)"
        )
        #expect(!client.events.contains { $0.type == "reset" })
      }
    }
  }

  @Test func aClientThatNeverReadsIsDisconnectedWhileOthersKeepUp() async throws {
    try await RelayHarness.start(
      feed: FeedSettings(maxPendingBytes: 256 << 10, heartbeatInterval: 5)
    ).run { harness in
      let stalled = try TestSSEClient(port: harness.port)  // never read from
      // The keeping-up client is curl writing to a file: fast enough to never fall 256 KiB behind.
      let reader = try CurlReader(url: "http://127.0.0.1:\(harness.port)/events", maxTime: 120)
      try await harness.waitForSubscribers { $0 == 2 }
      let payload = String(repeating: "x", count: 4096)
      var ids: [UInt64] = []
      // ~16 MB: more than the kernel buffers of the stalled client can absorb.
      for _ in 0..<400 {
        ids += await harness.relay.feed.publish((0..<10).map { _ in FeedEvent(stream: "101", data: payload) })
        try await Task.sleep(for: .milliseconds(1))
      }
      let received = try await reader.waitFor("id: \(ids.last!)\n", timeout: 60)
      var parser = SSEParser()
      let events = parser.feed(Array(received.utf8))
      #expect(events.filter { $0.type == "message" }.compactMap { UInt64($0.lastEventID) } == ids)
      let stats = await harness.statistics()
      #expect(stats.slowConsumerDisconnects == 1)
      #expect(stats.subscribersConnected == 1)
      // The stalled client finds its connection gone once it reads what the kernel had buffered.
      try stalled.waitForEOF(timeout: 30)
    }
  }

  /// Regression: every stream the client closed leaked ~1.7 kB (libevent detaches, rather than frees, a request
  /// whose chunked reply never ended when the peer goes away), 8 MB per 5,000 reconnects.
  @Test func fiveThousandConnectResetCyclesLeakNoSocketsOrMemory() async throws {
    try await RelayHarness.start().run { harness in
      await harness.publish(20)
      // Warm up allocators and the loop before taking the baseline.
      for _ in 0..<500 {
        let client = try TestSSEClient(port: harness.port)
        try client.waitForHead()
        client.reset()
      }
      try await harness.waitForSubscribers { $0 == 0 }
      let descriptorsBefore = openDescriptorCount()
      let memoryBefore = liveMemory()
      let cycles = 5000
      for cycle in 0..<cycles {
        let client = try TestSSEClient(port: harness.port, headers: cycle % 2 == 0 ? [("Last-Event-ID", "0")] : [])
        try client.waitForHead()
        if cycle % 3 == 0 {
          // An orderly close (FIN) instead of a reset.
          shutdown(client.fd, Int32(SHUT_RDWR))
        } else {
          client.reset()
        }
      }
      try await harness.waitForSubscribers(timeout: 20) { $0 == 0 }
      let stats = await harness.statistics()
      #expect(stats.subscribersTotal == cycles + 500)
      // Closed sockets are reaped at once: no CLOSE_WAIT on the relay's port.
      let deadline = MonotonicClock.seconds() + 10
      while closeWaitCount(port: harness.port) > 0 && MonotonicClock.seconds() < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      #expect(closeWaitCount(port: harness.port) == 0)
      #expect(openDescriptorCount() <= descriptorsBefore + 2)
      let growth = liveMemory().bytes - memoryBefore.bytes
      print("connect/close cycles: \(cycles), \(memoryBefore.measure): grew \(growth) bytes")
      #expect(
        growth < 3 << 20,
        "\(memoryBefore.measure) grew by \(growth) bytes over \(cycles) cycles (a leak of 1.7 kB each is 8 MB)")
    }
  }
}

/// Sockets in CLOSE_WAIT whose local port is `port` (from /proc/net/tcp and tcp6).
func closeWaitCount(port: Int) -> Int {
  var count = 0
  let hexPort = String(format: "%04X", port)
  for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
    guard let text = try? String(contentsOfFile: file, encoding: .utf8) else { continue }
    for line in text.split(separator: "\n").dropFirst() {
      let fields = line.split(separator: " ")
      guard fields.count > 3 else { continue }
      if fields[1].hasSuffix(":" + hexPort) && fields[3] == "08" { count += 1 }
    }
  }
  return count
}
