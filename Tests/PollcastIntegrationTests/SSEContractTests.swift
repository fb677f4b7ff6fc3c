import Foundation
import PollcastCore
import Testing

/// The downstream contract over real sockets: headers, preamble, resume, resets, filters, methods, limits.
@Suite(.serialized, .timeLimit(.minutes(5))) struct SSEContractTests {
  @Test func streamStartsWithTheContractHeadersAPreambleAndRetry() async throws {
    let harness = try await RelayHarness.start(feed: FeedSettings(heartbeatInterval: 5, retryMilliseconds: 2500))
    defer { Task { await harness.stop() } }
    let client = try TestSSEClient(port: harness.port)
    try client.waitForHead()
    #expect(client.status == 200)
    #expect(client.headers["content-type"] == "text/event-stream; charset=utf-8")
    #expect(client.headers["cache-control"] == "no-cache, no-store, no-transform")
    #expect(client.headers["x-accel-buffering"] == "no")
    let head = try #require(client.headers["x-pollcast-head-id"].flatMap(UInt64.init))
    #expect(head == (await harness.relay.feed.headID))
    // The preamble arrives at once, before any event exists.
    try client.waitUntil(timeout: 2, "retry line") { $0.parser.retry != nil }
    #expect(client.parser.retry == 2500)
    #expect(client.bodyText.hasPrefix(": pollcast "))
    await harness.stop()
  }

  @Test func liveEventsCarryIncreasingIDsStartingAtTheStartTime() async throws {
    let started = EventIDAllocator.nowMicroseconds()
    try await RelayHarness.start().run { harness in
      let client = try TestSSEClient(port: harness.port)
      try await harness.waitForSubscribers { $0 == 1 }
      let ids = await harness.publish(5)
      let events = try client.waitForEvents(5)
      #expect(events.map(\.data) == ["m0", "m1", "m2", "m3", "m4"])
      #expect(client.messageIDs == ids)
      #expect(ids.first! >= started)
      #expect(zip(ids, ids.dropFirst()).allSatisfy { $1 == $0 + 1 })
    }
  }

  @Test func resumeAfterIDKReplaysExactlyTheRestThenGoesLive() async throws {
    try await RelayHarness.start().run { harness in
      let ids = await harness.publish(10)
      var all = ids
      for k in [0, 3, 9] {
        let client = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(ids[k]))])
        let expected = Array(all[(k + 1)...])
        if !expected.isEmpty { try client.waitForEvents(expected.count) }
        #expect(client.messageIDs == expected, "resume after index \(k)")
        #expect(!client.events.contains { $0.type == "reset" })
        let live = await harness.publish(1, prefix: "live\(k)-")
        try client.waitForEvents(expected.count + 1)
        #expect(client.messageIDs == expected + live)
        all += live
      }
    }
  }

  @Test func queryParameterAliasesResumeAndTheHeaderWins() async throws {
    try await RelayHarness.start().run { harness in
      let ids = await harness.publish(6)
      for name in ["lastEventId", "last_event_id", "last-event-id"] {
        let client = try TestSSEClient(port: harness.port, path: "/events?\(name)=\(ids[3])")
        try client.waitForEvents(2)
        #expect(client.messageIDs == [ids[4], ids[5]], "\(name)")
      }
      let both = try TestSSEClient(
        port: harness.port, path: "/events?lastEventId=\(ids[0])", headers: [("Last-Event-ID", String(ids[4]))])
      try both.waitForEvents(1)
      try both.pump(timeout: 0.2)
      #expect(both.messageIDs == [ids[5]])
    }
  }

  @Test func resetWhenTheIDIsOlderThanTheRingThenNormalResumeFromTheResetID() async throws {
    try await RelayHarness.start(
      feed: FeedSettings(ring: .init(maxEvents: 5, maxBytes: 1 << 20), heartbeatInterval: 5)
    ).run { harness in
      let ids = await harness.publish(12)
      let client = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(ids[2]))])
      let events = try client.waitForEvents(1)
      let reset = try #require(events.first)
      #expect(reset.type == "reset")
      #expect(reset.lastEventID == String(ids.last!))
      #expect(client.headers["x-pollcast-head-id"] == String(ids.last!))
      let data = try #require(try JSONSerialization.jsonObject(with: Data(reset.data.utf8)) as? [String: String])
      #expect(data["reason"] == "too_old")
      #expect(data["requested"] == String(ids[2]))
      #expect(data["oldest"] == String(ids[7]))
      #expect(data["latest"] == String(ids.last!))
      // The stream continues live after the reset.
      let live = await harness.publish(1)
      try client.waitForEvents(2)
      #expect(client.messageIDs == live)
      // A reconnect from the reset's id resumes normally.
      let again = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", reset.lastEventID)])
      try again.waitForEvents(1)
      #expect(again.events.map(\.type) == ["message"])
      #expect(again.messageIDs == live)
      #expect((await harness.statistics()).resetsByReason["too_old"] == 1)
    }
  }

  @Test func resetForAnIDFromTheFuture() async throws {
    try await RelayHarness.start().run { harness in
      let ids = await harness.publish(3)
      let client = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(ids.last! + 1))])
      let reset = try #require(try client.waitForEvents(1).first)
      #expect(reset.type == "reset")
      #expect(reset.data.contains(#""reason":"future""#))
      #expect(reset.lastEventID == String(ids.last!))
    }
  }

  @Test(arguments: [
    "abc", "-1", "18446744073709551616", "%20123", "123%20", "1.5", String(repeating: "9", count: 8192),
  ])
  func resetForAnInvalidIDInTheQuery(value: String) async throws {
    try await RelayHarness.start().run { harness in
      await harness.publish(2)
      let client = try TestSSEClient(port: harness.port, path: "/events?lastEventId=\(value)")
      let reset = try #require(try client.waitForEvents(1).first)
      #expect(reset.type == "reset")
      #expect(reset.data.contains(#""reason":"invalid""#))
    }
  }

  @Test(arguments: ["abc", "-5", "99999999999999999999", "12 34", String(repeating: "7", count: 8192)])
  func resetForAnInvalidIDInTheHeader(value: String) async throws {
    try await RelayHarness.start().run { harness in
      await harness.publish(2)
      let client = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", value)])
      let reset = try #require(try client.waitForEvents(1).first)
      #expect(reset.type == "reset")
      #expect(reset.data.contains(#""reason":"invalid""#))
      // The echoed value is bounded, so an 8 KiB id does not come back whole.
      #expect(reset.data.utf8.count < 400)
    }
  }

  @Test func streamFilterAppliesToReplayAndLive() async throws {
    try await RelayHarness.start().run { harness in
      let before = await harness.relay.feed.headID
      var expected: [String] = []
      for round in 0..<3 {
        await harness.publish(1, stream: "101", prefix: "a\(round)-")
        await harness.publish(1, stream: "202", prefix: "b\(round)-")
        await harness.publish(1, stream: "303", prefix: "c\(round)-")
        expected += ["a\(round)-0", "b\(round)-0"]
      }
      let client = try TestSSEClient(
        port: harness.port, path: "/events?stream=101&stream=202", headers: [("Last-Event-ID", String(before))])
      try client.waitForEvents(6)
      #expect(client.events.map(\.data) == expected)
      await harness.publish(1, stream: "303", prefix: "x")
      await harness.publish(1, stream: "202", prefix: "y")
      try client.waitForEvents(7)
      #expect(client.events.last?.data == "y0")
    }
  }

  @Test func heartbeatsArriveAtTheConfiguredInterval() async throws {
    try await RelayHarness.start(feed: FeedSettings(heartbeatInterval: 0.2)).run { harness in
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      let started = MonotonicClock.seconds()
      try client.waitUntil(timeout: 3, "three heartbeats") {
        $0.bodyText.components(separatedBy: ": heartbeat").count > 3
      }
      // Not more often than the interval either (a spread round once visited a lone subscriber on every tick).
      try client.pump(timeout: 0.5)
      let elapsed = MonotonicClock.seconds() - started
      let count = client.bodyText.components(separatedBy: ": heartbeat").count - 1
      #expect(Double(count) <= elapsed / 0.2 + 2, "\(count) heartbeats in \(elapsed) s at a 0.2 s interval")
    }
  }

  @Test func headAnswersPromptlyWithTheStreamHeadersAndNoBody() async throws {
    try await RelayHarness.start().run { harness in
      let result = try run(
        "/usr/bin/curl", ["-sS", "-I", "--max-time", "3", "http://127.0.0.1:\(harness.port)/events"])
      #expect(result.code == 0, "curl: \(result.stderr)")
      #expect(result.stdout.hasPrefix("HTTP/1.1 200"))
      #expect(result.stdout.lowercased().contains("content-type: text/event-stream; charset=utf-8"))
    }
  }

  @Test func wrongMethodsGet405WithAllowAndUnknownPaths404() async throws {
    try await RelayHarness.start().run { harness in
      for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let client = try TestSSEClient(port: harness.port, method: method)
        try client.waitForHead()
        #expect(client.status == 405, "\(method)")
        #expect(client.headers["allow"] == "GET, HEAD, OPTIONS")
      }
      let missing = try TestSSEClient(port: harness.port, path: "/nope")
      try missing.waitForHead()
      #expect(missing.status == 404)
      let health = try TestSSEClient(port: harness.port, path: "/healthz")
      try health.waitForHead()
      #expect(health.status == 200)
    }
  }

  @Test func preflightForAnAllowedOriginAndNoneForOthers() async throws {
    try await RelayHarness.start(
      server: ServerSettings(host: "127.0.0.1", port: 0, cors: CORSPolicy(allowedOrigins: ["https://app.example"]))
    ).run { harness in
      let allowed = try TestSSEClient(
        port: harness.port, method: "OPTIONS",
        headers: [
          ("Origin", "https://app.example"), ("Access-Control-Request-Method", "GET"),
          ("Access-Control-Request-Headers", "last-event-id"),
        ])
      try allowed.waitForHead()
      #expect(allowed.status == 204)
      #expect(allowed.headers["access-control-allow-origin"] == "https://app.example")
      #expect(allowed.headers["access-control-allow-headers"] == "Last-Event-ID, Cache-Control, Authorization")
      #expect(allowed.headers["vary"] == "Origin")
      let refused = try TestSSEClient(
        port: harness.port, method: "OPTIONS",
        headers: [("Origin", "https://evil.example"), ("Access-Control-Request-Method", "GET")])
      try refused.waitForHead()
      #expect(refused.status == 403)
      #expect(refused.headers["access-control-allow-origin"] == nil)
      let stream = try TestSSEClient(port: harness.port, headers: [("Origin", "https://app.example")])
      try stream.waitForHead()
      #expect(stream.headers["access-control-allow-origin"] == "https://app.example")
      #expect(stream.headers["access-control-expose-headers"] == "X-Pollcast-Head-Id")
    }
  }

  @Test func overlongURLsAndHeadersAreRefused() async throws {
    try await RelayHarness.start(
      server: ServerSettings(host: "127.0.0.1", port: 0, maxHeaderBytes: 16 << 10, maxURLBytes: 12 << 10)
    ).run { harness in
      let longURL = try TestSSEClient(port: harness.port, path: "/events?x=" + String(repeating: "a", count: 13 << 10))
      try longURL.waitForHead()
      #expect(longURL.status == 414)
      let hugeHeader = try TestSSEClient(
        port: harness.port, headers: [("X-Big", String(repeating: "b", count: 20 << 10))])
      var status = 0
      // evhttp answers 400/413 or closes the connection: either way the request is refused, never served.
      do {
        try hugeHeader.waitForHead()
        status = hugeHeader.status
      } catch {}
      #expect(status != 200)
      #expect((await harness.statistics()).subscribersTotal == 0)
    }
  }

  @Test func malformedQueryIsABadRequest() async throws {
    try await RelayHarness.start().run { harness in
      let client = try TestSSEClient(port: harness.port, path: "/events?stream=")
      try client.waitForHead()
      #expect(client.status == 400)
    }
  }

  @Test func curlReceivesTheStreamVerbatim() async throws {
    try await RelayHarness.start().run { harness in
      let client = try TestSSEClient(port: harness.port)
      try await harness.waitForSubscribers { $0 == 1 }
      let ids = await harness.publish(3)
      let result = try run(
        "/usr/bin/curl",
        ["-sS", "-N", "--max-time", "2", "-H", "Last-Event-ID: \(ids[0])", "http://127.0.0.1:\(harness.port)/events"])
      // curl exits 28 at --max-time: the stream was still open, as it should be.
      #expect(result.code == 28)
      #expect(result.stdout.contains("id: \(ids[1])\ndata: m1\n\nid: \(ids[2])\ndata: m2\n\n"))
      #expect(!result.stdout.contains("data: m0"))
      _ = client
    }
  }

  @Test func shutdownEndsEveryStreamCleanlyWithALastComment() async throws {
    let harness = try await RelayHarness.start()
    let clients = try (0..<5).map { _ in try TestSSEClient(port: harness.port) }
    try await harness.waitForSubscribers { $0 == 5 }
    await harness.stop()
    for client in clients {
      try client.waitForEOF(timeout: 5)
      #expect(client.endedCleanly)
      #expect(client.bodyText.contains(": pollcast shutting down"))
    }
  }
}

@Suite(.serialized, .timeLimit(.minutes(5))) struct HTTP10ClientTests {
  @Test func anHTTP10ClientGetsTheSameEventsWithoutChunkFraming() async throws {
    try await RelayHarness.start().run { harness in
      let curl = Process()
      curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
      let output = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-http10-\(getpid()).txt")
      defer { try? FileManager.default.removeItem(at: output) }
      curl.arguments = [
        "-sS", "-N", "--http1.0", "--max-time", "3", "-o", output.path, "http://127.0.0.1:\(harness.port)/events",
      ]
      try curl.run()
      try await harness.waitForSubscribers { $0 == 1 }
      let ids = await harness.publish(2)
      let deadline = MonotonicClock.seconds() + 5
      var text = ""
      while MonotonicClock.seconds() < deadline {
        text = (try? String(contentsOf: output, encoding: .utf8)) ?? ""
        if text.contains("data: m1") { break }
        try await Task.sleep(for: .milliseconds(20))
      }
      #expect(text.contains("id: \(ids[0])\ndata: m0\n\nid: \(ids[1])\ndata: m1\n\n"))
      #expect(!text.contains("\r\n"))  // no chunk framing leaked into an unframed reply
      kill(curl.processIdentifier, SIGKILL)
      curl.waitUntilExit()
    }
  }
}
