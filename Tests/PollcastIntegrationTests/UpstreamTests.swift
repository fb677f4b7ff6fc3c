import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// The worker against the real fixture, observed through real SSE clients.
@Suite(.serialized, .timeLimit(.minutes(5))) struct UpstreamTests {
  @Test func messagesFlowFromTheFixtureVerbatimToSubscribers() async throws {
    try await UpstreamHarness.start().run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["hi", "there"])
      await harness.fixture.append(user: "202", texts: ["linked"])
      try client.waitUntil(timeout: 10, "three messages") { $0.relayedMessages.count == 3 }
      #expect(
        client.relayedMessages == [
          .init(stream: "101", upstreamID: 1, backlog: false, text: "hi"),
          .init(stream: "101", upstreamID: 2, backlog: false, text: "there"),
          .init(stream: "202", upstreamID: 1, backlog: false, text: "linked"),
        ])
      // The upstream message is embedded byte for byte.
      let first = try #require(client.events(ofType: "message").first)
      #expect(first.data.contains(#""message":{"id":1,"chat_id":"c1","from":"alice","text":"hi","sent_at":""#))
    }
  }

  @Test(arguments: [
    ("status 503", [FixtureFault.status(503)]),
    ("status 500 twice", [FixtureFault.status(500), .status(502)]),
    ("reset mid body", [FixtureFault.resetMidBody]),
    ("malformed json", [FixtureFault.malformedJSON]),
    ("delay", [FixtureFault.delay(milliseconds: 300)]),
    ("duplicate", [FixtureFault.duplicate, .duplicate]),
    ("hang", [FixtureFault.hang]),
    (
      "storm",
      [
        FixtureFault.status(503), .resetMidBody, .duplicate, .malformedJSON, .hang, .delay(milliseconds: 100),
        .status(429),
        .duplicate, .resetMidBody,
      ]
    ),
  ])
  func everyMessageArrivesExactlyOnceInOrderThroughFaults(name: String, faults: [FixtureFault]) async throws {
    try await UpstreamHarness.start().run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["before"])
      try client.waitUntil(timeout: 10, "the first message") { $0.relayedMessages.count == 1 }
      await harness.fixture.queue(faults)
      var expected = ["before"]
      // Keep messages coming until every fault has been applied to a poll (and a few rounds more).
      var round = 0
      var calmRounds = 0
      while calmRounds < 3 && round < 200 {
        let texts = (0..<3).map { "r\(round)-\($0)" }
        await harness.fixture.append(user: round % 2 == 0 ? "101" : "202", texts: texts)
        expected += texts
        round += 1
        if await harness.fixture.statistics().faultsPending == 0 { calmRounds += 1 }
        try await Task.sleep(for: .milliseconds(150))
      }
      try client.waitUntil(timeout: 30, "\(expected.count) messages") { $0.relayedMessages.count >= expected.count }
      try client.pump(timeout: 0.3)
      let got = client.relayedMessages
      #expect(got.map(\.text).sorted() == expected.sorted(), "\(name)")
      #expect(got.count == expected.count, "\(name): duplicates reached subscribers")
      for stream in ["101", "202"] {
        let ids = got.filter { $0.stream == stream }.map(\.upstreamID)
        #expect(ids == ids.sorted() && Set(ids).count == ids.count, "\(name): stream \(stream) out of order")
      }
      let stats = await harness.fixture.statistics()
      #expect(stats.faultsPending == 0, "\(name): not every fault was exercised")
      #expect(stats.maxPollsInFlightPerToken == 1, "\(name)")
      let worker = await harness.worker.snapshot()
      #expect(worker.maxPollsInFlight == 1)
      if faults.contains(.duplicate) { #expect(worker.duplicatesDropped > 0) }
    }
  }

  @Test func sessionExpiryStartsANewSessionAndLosesNothing() async throws {
    try await UpstreamHarness.start().run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try await harness.waitForParkedPoll()
      var expected: [String] = []
      for round in 0..<4 {
        await harness.fixture.expireTokens()
        let texts = ["e\(round)a", "e\(round)b"]
        await harness.fixture.append(user: "101", texts: texts)
        expected += texts
        try client.waitUntil(timeout: 10, "round \(round)") { $0.relayedMessages.count == expected.count }
      }
      #expect(client.relayedMessages.map(\.text) == expected)
      let stats = await harness.fixture.statistics()
      #expect(stats.sessions >= 5)
      #expect(stats.maxPollsInFlightPerToken == 1)
      let worker = await harness.worker.snapshot()
      #expect(worker.backoffAttempt == 0)
    }
  }

  @Test func aWrongAPIKeyBacksOffInsteadOfStorming() async throws {
    var options = LegacyFixture.Options()
    options.apiKey = "right"
    let fixture = try await LegacyFixture.start(options)
    var settings = UpstreamHarness.fastSettings()
    settings.backoff = Backoff(base: 0.2, cap: 0.4)
    let relay = try await Relay.start(
      server: ServerSettings(host: "127.0.0.1", port: 0), feed: FeedSettings(),
      logger: Logger(label: "test", level: .critical),
      upstream: .init(
        adapter: ChatAdapter(baseURL: "http://\(fixture.address)", credential: "wrong"), settings: settings,
        apiKey: "wrong", seed: 3))
    try await Task.sleep(for: .seconds(1.5))
    let unauthorized = await fixture.statistics().unauthorized
    // Full jitter over [0, 0.2..0.4] s for 1.5 s: a handful of attempts, not hundreds.
    #expect(unauthorized >= 3 && unauthorized <= 40, "\(unauthorized) session attempts")
    #expect(await relay.worker!.state == .backoff)
    let ready = try run(
      "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://\(relay.address)/readyz"])
    #expect(ready.stdout == "503")
    await relay.shutdown()
    await fixture.shutdown()
  }

  /// While the API fails, the `upstream` status stays `backoff` from one retry to the next: a retry that has no
  /// session step to send does not show the API `live` before its poll fails again.
  @Test func theStatusStaysBackoffBetweenFailedRetries() async throws {
    let server = try CapturingServer(status: 500, body: "{}")
    defer { server.stop() }
    let recipe = try Recipe.parse(
      #"{"recipe":1,"poll":{"url":"\#(server.url)/poll","events":{"pointer":"/e","id":{"event":"/id"}}}}"#,
      context: Recipe.Context(environment: [:], hasCredential: false)
    ).get()
    var settings = UpstreamHarness.fastSettings()
    settings.backoff = Backoff(base: 0.05, cap: 0.1)
    settings.minPollInterval = 0.05
    let relay = try await Relay.start(
      server: ServerSettings(host: "127.0.0.1", port: 0), feed: FeedSettings(),
      logger: Logger(label: "test", level: .critical),
      upstream: .init(
        adapter: RecipeAdapter(recipe: recipe, environment: [:], credential: nil), settings: settings, apiKey: "",
        seed: 3))
    let client = try TestSSEClient(port: Int(relay.address.split(separator: ":").last!)!)
    let deadline = MonotonicClock.seconds() + 1.5
    while MonotonicClock.seconds() < deadline { _ = try? client.pump(timeout: 0.05) }
    let states = client.events.filter { $0.type == "upstream" }.compactMap { event in
      (try? RawJSON.parse(event.data))?["state"]?.stringValue
    }
    #expect(server.received.count >= 4, "\(server.received.count) polls")
    let firstBackoff = try #require(states.firstIndex(of: "backoff"), "\(states)")
    #expect(!states[firstBackoff...].contains("live"), "\(states)")
    await relay.shutdown()
  }

  @Test func linkedAccountAttachAndDetachAreEventsAndDetachPurgesTheRing() async throws {
    var options = LegacyFixture.Options()
    options.linkedUserID = nil
    try await UpstreamHarness.start(fixture: options).run { harness in
      try await harness.waitForState(.live)
      let start = await harness.relay.feed.headID
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["solo"])
      try client.waitUntil(timeout: 10, "solo") { $0.relayedMessages.count == 1 }

      await harness.fixture.setLinkedUser("303")
      try client.waitUntil(timeout: 10, "attach") { !$0.events(ofType: "stream-attached").isEmpty }
      let attached = try #require(client.events(ofType: "stream-attached").first)
      #expect(attached.data == #"{"stream":"303","change":"attached"}"#)
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "303", texts: ["linked-1", "linked-2"])
      try client.waitUntil(timeout: 10, "linked messages") { $0.relayedMessages.count == 3 }
      #expect(client.relayedMessages.filter { $0.stream == "303" }.map(\.text) == ["linked-1", "linked-2"])

      await harness.fixture.setLinkedUser(nil)
      try client.waitUntil(timeout: 10, "detach") { !$0.events(ofType: "stream-detached").isEmpty }
      let cursorKeys = await harness.worker.snapshot().cursors.keys.sorted()
      #expect(cursorKeys == ["101"])
      // A client resuming from before the attach gets no message of the detached stream.
      let resumed = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(start))])
      try resumed.waitUntil(timeout: 10, "replay") { !$0.events(ofType: "stream-detached").isEmpty }
      #expect(resumed.relayedMessages.map(\.text) == ["solo"])
      #expect(!resumed.events.contains { $0.data.contains("linked-") })
    }
  }

  @Test func earliestStartRelaysExistingMessagesAsBacklogThenGoesLive() async throws {
    try await UpstreamHarness.start(
      settings: UpstreamHarness.fastSettings(startFrom: .earliest),
      prefill: ["101": ["old-1", "old-2"], "202": ["old-3"]]
    ).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", "0")])
      // Id 0 predates this run: a reset, then live; the backlog is in the ring, so resume from the head before it.
      try client.waitForEvents(1)
      #expect(client.events.first?.type == "reset")
      let all = try TestSSEClient(
        port: harness.port, path: "/events?lastEventId=\(await harness.relay.feed.headID - 3)")
      try all.waitUntil(timeout: 10, "backlog") { $0.relayedMessages.count == 3 }
      let allBacklog = all.relayedMessages.allSatisfy { $0.backlog }
      #expect(allBacklog)
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["new"])
      try all.waitUntil(timeout: 10, "live message") { $0.relayedMessages.count == 4 }
      #expect(all.relayedMessages.last == .init(stream: "101", upstreamID: 3, backlog: false, text: "new"))
      #expect(all.events(ofType: "upstream").last?.data.contains(#""state":"live""#) == true)
    }
  }

  @Test func readyWhileALongPollIsSimplyWaiting() async throws {
    try await UpstreamHarness.start(hold: 20).run { harness in
      try await harness.waitForState(.live)
      try await harness.waitForParkedPoll()
      let ready = try run("/usr/bin/curl", ["-s", "-w", " %{http_code}", "http://127.0.0.1:\(harness.port)/readyz"])
      #expect(ready.stdout.hasSuffix(" 200"), "\(ready.stdout)")
    }
  }

  @Test func latestStartSkipsExistingMessages() async throws {
    try await UpstreamHarness.start(prefill: ["101": ["old"]]).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["new"])
      try client.waitUntil(timeout: 10, "new") { $0.relayedMessages.count == 1 }
      #expect(client.relayedMessages == [.init(stream: "101", upstreamID: 2, backlog: false, text: "new")])
    }
  }

  @Test func messagesPublishedWhileStoppedArriveAsBacklogAfterARestart() async throws {
    try await UpstreamHarness.start().run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      await harness.worker.stop()
      await harness.fixture.append(user: "101", texts: ["missed-1", "missed-2"])
      await harness.worker.start()
      try client.waitUntil(timeout: 10, "catch-up") { $0.relayedMessages.count == 2 }
      #expect(client.relayedMessages.map(\.backlog) == [true, true])
      try await harness.waitForState(.live)
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["fresh"])
      try client.waitUntil(timeout: 10, "fresh") { $0.relayedMessages.count == 3 }
      #expect(client.relayedMessages.last?.backlog == false)
      #expect(await harness.fixture.statistics().maxPollsInFlightPerToken == 1)
    }
  }

  @Test func idlesWithoutSubscribersAndCatchesUpWhenOneArrives() async throws {
    try await UpstreamHarness.start(settings: UpstreamHarness.fastSettings(idleAfter: 0.3)).run { harness in
      try await harness.waitForState(.idle, timeout: 5)
      try await Task.sleep(for: .milliseconds(100))
      let pollsWhileIdle = await harness.fixture.statistics().polls
      #expect(await harness.fixture.statistics().pollsInFlight == 0)
      await harness.fixture.append(user: "101", texts: ["while-idle"])
      try await Task.sleep(for: .milliseconds(300))
      #expect(await harness.fixture.statistics().polls == pollsWhileIdle)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()  // attached before anything is published
      try client.waitUntil(timeout: 10, "catch-up") { $0.relayedMessages.count == 1 }
      #expect(client.relayedMessages.first?.text == "while-idle")
      try await harness.waitForState(.live)
      // The client leaves: idle again.
      client.reset()
      try await harness.waitForState(.idle, timeout: 5)
    }
  }

  @Test func genericAdapterPollsASingleStreamEndpoint() async throws {
    let generic = GenericAdapter.Settings(
      urlTemplate: "http://FIXTURE/api/feed?user=101&after={cursor}&timeout=1", eventsPointer: "/data/items",
      idPointer: "/seq", headers: ["X-Demo: 1"], stream: "feed", timeout: 3, initialCursor: 1)
    // Message 1 exists before the start; the initial cursor 1 skips it.
    try await UpstreamHarness.start(prefill: ["101": ["g1"]], generic: generic).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port, path: "/events?stream=feed")
      // The client's request is sent, not yet read: the messages below must not be published before it subscribes
      // (it joins live, without a Last-Event-ID, and would miss them — one run in five or so did).
      let deadline = MonotonicClock.seconds() + 10
      while await harness.relay.feed.statistics().subscribersConnected < 1 && MonotonicClock.seconds() < deadline {
        try await Task.sleep(for: .milliseconds(5))
      }
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["g2", "g3"])
      await harness.fixture.queue([.duplicate])
      await harness.fixture.append(user: "101", texts: ["g4"])
      do {
        try client.waitUntil(timeout: 10, "three events") { $0.events(ofType: "message").count >= 3 }
      } catch {
        let stats = await harness.relay.feed.statistics()
        print(
          "genericAdapterPollsASingleStreamEndpoint timed out; events: \(client.events.map { "\($0.type) \($0.data)" }) feed: \(stats) worker: \(await harness.worker.statistics)"
        )
        throw error
      }
      try client.pump(timeout: 0.3)
      let events = client.events(ofType: "message")
      #expect(events.count == 3)
      let seqs = events.compactMap { try? RawJSON.parse($0.data)["upstream_id"]?.unsignedID }
      #expect(seqs == [2, 3, 4])
      #expect(events[0].data.contains(#""stream":"feed""#))
      #expect(events[0].data.contains(#""message":{"seq":2,"message":{"id":2"#))
    }
  }
}
