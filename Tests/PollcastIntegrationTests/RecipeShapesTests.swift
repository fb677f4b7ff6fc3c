import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// The example recipes in `Config/recipes/` against the fixture's faithful shapes of other real APIs (the relay
/// binary, the SQLite store, loopback): each relays exactly once, resumes across a `kill -9`, and follows its
/// API's own signals (Telegram's 429 `retry_after` and 409 conflict; Consul's index going backwards).
@Suite(.serialized, .timeLimit(.minutes(5))) struct RecipeShapesTests {
  static func recipe(_ name: String) -> String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../Config/recipes/\(name)")
      .standardized.path
  }

  func relay(_ recipe: String, store: String, log: URL, environment: [String: String], extra: [String] = []) throws
    -> RelayProcess
  {
    try RelayProcess(
      arguments: [
        "--listen", "127.0.0.1:0", "--upstream-adapter", "recipe", "--upstream-recipe",
        recipe.hasPrefix("/") ? recipe : RecipeShapesTests.recipe(recipe),
        "--store-kind", "sqlite", "--store-path", store, "--upstream-backoff-base-seconds", "0.05",
        "--upstream-backoff-cap-seconds", "0.2", "--log-level", "info",
      ] + extra, log: log, environment: environment)
  }

  /// Waits until a line of the log holds every one of `texts` (a relay logs after it acts, and a `kill -9` right
  /// after could cut the line).
  func waitForLog(_ log: URL, _ texts: String..., timeout: Double = 5) -> Bool {
    let deadline = MonotonicClock.seconds() + timeout * timingFactor
    repeat {
      let lines = ((try? String(contentsOf: log, encoding: .utf8)) ?? "").split(separator: "\n")
      if lines.contains(where: { line in texts.allSatisfy { line.contains($0) } }) { return true }
      usleep(20_000)
    } while MonotonicClock.seconds() < deadline
    return false
  }

  /// The `upstream_id`s of the messages `client` received (of `stream` only, when given), pumping until there are
  /// `count` of them or 10 s (scaled) have passed.
  static func upstreamIDs(_ client: TestSSEClient, count: Int, stream: String? = nil) -> [UInt64] {
    let deadline = MonotonicClock.seconds() + 10 * timingFactor
    var found: [UInt64] = []
    while MonotonicClock.seconds() < deadline {
      found = client.events.filter { $0.type == "message" }.compactMap { event in
        guard let json = try? RawJSON.parse(event.data), stream == nil || json["stream"]?.stringValue == stream else {
          return nil
        }
        return json["upstream_id"]?.unsignedID
      }
      if found.count >= count { break }
      _ = try? client.pump(timeout: 0.05)
    }
    return found
  }

  func pumpUntil(_ reader: Reader, count: Int, timeout: Double = 10) {
    let deadline = MonotonicClock.seconds() + timeout * timingFactor
    while reader.messages.count < count && MonotonicClock.seconds() < deadline { reader.pump(for: 0.1) }
  }

  @Test func telegramRelaysExactlyOnceAcrossAKillAndHonoursRetryAfter() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-telegram", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = ["TELEGRAM_API": "http://\(fixture.address)", "TELEGRAM_TOKEN": fixture.options.apiKey]
    var node = try relay("telegram.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let reader = Reader()
    try reader.connect(port: node.port)
    reader.pump(for: 0.3)
    let publisher = SteadyPublisher(fixture: fixture)
    reader.pump(for: 1)
    node.kill9()
    try await Task.sleep(for: .milliseconds(300))
    // Rate limited on the first poll after the restart: the relay waits the body's retry_after, then goes on.
    await fixture.queueCanned([
      CannedAnswer(
        status: 429,
        body: #"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 1","#
          + #""parameters":{"retry_after":1}}"#)
    ])
    node = try relay("telegram.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    try reader.connect(port: node.port)
    reader.pump(for: 1.5)
    let expected = await publisher.stop()
    pumpUntil(reader, count: expected.count)
    expectExactlyOnce([reader], expected: expected, log: { logs.tails() })
    let log = logs.tails()
    #expect(log.contains("delay_ms=1000"), "the 429's retry_after is the delay: \(log)")
    let stats = await fixture.statistics()
    #expect(stats.maxPollsInFlightPerToken == 1, "never two getUpdates at once (Telegram would answer 409)")
    node.kill9()
    await fixture.shutdown()
  }

  @Test func consulRelaysEachIndexOnceAndFollowsItBackwards() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-consul", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = [
      "CONSUL_URL": "http://\(fixture.address)", "CONSUL_WAIT": "1s", "CONSUL_TOKEN": "consul-secret-1",
    ]
    var node = try relay("consul.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let client = try TestSSEClient(port: node.port)
    // Subscribed before the write: a client that joins live after the state at index 2 was relayed never sees it
    // (CI's ASan run on 4207737 saw nothing for 60 s). The preamble is written once the stream is attached.
    try client.waitUntil(timeout: 10 * timingFactor, "the stream's preamble") { $0.bodyText.contains(": pollcast") }
    _ = await fixture.append(user: "101", texts: ["a", "b"])
    func states(_ client: TestSSEClient, atLeast count: Int) throws -> [(index: UInt64, keys: Int)] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while MonotonicClock.seconds() < deadline {
        let messages = client.events.filter { $0.type == "message" }
        if messages.count >= count { break }
        _ = try? client.pump(timeout: 0.1)
      }
      return client.events.filter { $0.type == "message" }.compactMap { event in
        guard let json = try? RawJSON.parse(event.data), let index = json["upstream_id"]?.unsignedID,
          case .array(let entries)? = json["message"]?.value
        else { return nil }
        return (index, entries.count)
      }
    }
    var seen = try states(client, atLeast: 1)
    #expect(seen.last?.index == 2 && seen.last?.keys == 2, "\(seen)")
    // Held answers that time out with the same index are not news; a kill and restart resumes from the stored
    // index (the state at index 2 is not relayed again).
    try await Task.sleep(for: .milliseconds(Int(1500 * timingFactor)))
    node.kill9()
    _ = await fixture.append(user: "101", texts: ["c"])
    node = try relay("consul.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let lastRelayed = try #require(client.events.last { $0.hadID }, "no event with an id before the kill")
    let resumed = try TestSSEClient(port: node.port, headers: [("Last-Event-ID", lastRelayed.lastEventID)])
    seen = try states(resumed, atLeast: 1)
    #expect(seen.map(\.index) == [3] && seen.first?.keys == 3, "\(seen)")
    // A snapshot restore: the index goes back to 1, then a write makes it 2, below the relay's cursor (3).
    await fixture.rewind(user: "101", to: 1)
    _ = await fixture.append(user: "101", texts: ["after the restore"])
    seen = try states(resumed, atLeast: 2)
    #expect(seen.map(\.index) == [3, 2] && seen.last?.keys == 2, "\(seen)")
    let resync = resumed.events.first { $0.type == "upstream" && $0.data.contains("\"resync\"") }
    #expect(resync?.data.contains("upstream_index_went_backwards") == true, "\(resumed.events.map(\.data))")
    let log = logs.tails()
    #expect(!log.contains("consul-secret-1"), "the token is never logged")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// The fixture message ids (`message.doc.message.id`) and the seqs of the change events a client received.
  static func couchChanges(_ client: TestSSEClient) -> [(id: UInt64, seq: String)] {
    client.events.filter { $0.type == "message" }.compactMap { event in
      guard let json = try? RawJSON.parse(event.data), let seq = json["upstream_id"]?.stringValue,
        let id = json.resolve(pointer: "/message/doc/message/id")?.unsignedID
      else { return nil }
      return (id, seq)
    }
  }

  @Test func couchdbOpaqueSeqsResumeAcrossAKillAndRedeliveriesAreDroppedOnce() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-couchdb", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = ["COUCH_URL": "http://\(fixture.address)", "COUCH_AUTHORIZATION": "Basic YWRtaW46c2VjcmV0"]
    _ = await fixture.append(user: "101", texts: ["before the relay: since=now skips it"])
    var node = try relay("couchdb.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    try await Task.sleep(for: .milliseconds(300))
    let publisher = SteadyPublisher(fixture: fixture)
    try await Task.sleep(for: .milliseconds(600))
    // A cluster that redelivers the last changes: dropped by (id, rev).
    await fixture.queue([.duplicate, .duplicate])
    try await Task.sleep(for: .milliseconds(400))
    for _ in 0..<50 { _ = try? client.pump(timeout: 0.01) }
    var received = RecipeShapesTests.couchChanges(client)
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    try await Task.sleep(for: .milliseconds(300))
    // The first poll after the restart redelivers the last changes: the stored events' keys drop them.
    await fixture.queue([.duplicate])
    node = try relay("couchdb.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    try await Task.sleep(for: .milliseconds(600))
    let expected = await publisher.stop()
    let deadline = MonotonicClock.seconds() + 10 * timingFactor
    while MonotonicClock.seconds() < deadline
      && RecipeShapesTests.couchChanges(client).count + received.count < expected.count
    {
      _ = try? client.pump(timeout: 0.05)
    }
    received += RecipeShapesTests.couchChanges(client)
    let ids = received.map(\.id)
    #expect(
      ids == expected,
      "each change exactly once, in order: got \(ids.count) of \(expected.count); first ids \(ids.prefix(8)) \(logs.tails())"
    )
    #expect(received.allSatisfy { $0.seq == LegacyFixture.couchSeq($0.id) }, "upstream_id is CouchDB's own seq")
    #expect(client.events.allSatisfy { $0.type != "reset" })
    let stats = await fixture.statistics()
    #expect(stats.faultsApplied == 3, "the three redeliveries were served")
    #expect(!logs.tails().contains("YWRtaW46c2VjcmV0"), "the Authorization value is never logged")
    // /metrics shows the API's own cursor (CouchDB's last seq) beside the relay's count.
    let metrics = try httpGet(port: node.port, "/metrics").body
    let lastSeq = LegacyFixture.couchSeq(expected.last ?? 0)
    #expect(
      metrics.contains("pollcast_upstream_api_cursor_info{stream=\"changes\",cursor=\"\(lastSeq)\"} 1"),
      "\(metrics.split(separator: "\n").filter { $0.contains("cursor") })")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// Per-user relaying through a recipe (`auth.mode upstream`): the subscriber's key goes into the poll as
  /// `{credential}`, each account gets only its own messages, and a revoked key ends that account's streams alone.
  @Test func perUserRecipesSendEachSubscribersKeyAndEndRevokedAccounts() async throws {
    var options = LegacyFixture.Options()
    options.accounts = 2
    let fixture = try await LegacyFixture.start(options)
    let logs = try NodeLogs("pollcast-recipe-per-user", nodes: 1)
    defer { logs.remove() }
    let recipe = """
      {"recipe":1,"name":"feed","stream":"feed","vars":{"base":"http://\(fixture.address)"},
       "poll":{"url":"{base}/api/feed","headers":{"Authorization":"Bearer {credential}"},
         "query":{"after":"{cursor}","timeout":"2"},"events":{"pointer":"/data/items","id":{"event":"/seq"}}}}
      """
    let node = try RelayProcess(
      arguments: [
        "--listen", "127.0.0.1:0", "--auth-mode", "upstream", "--upstream-adapter", "recipe", "--upstream-recipe",
        recipe,
        "--upstream-backoff-base-seconds", "0.05", "--upstream-backoff-cap-seconds", "0.2", "--log-level", "info",
      ], log: logs.files[0])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let alice = try TestSSEClient(port: node.port, headers: [("Authorization", "Bearer key-1000")])
    let bob = try TestSSEClient(port: node.port, headers: [("Authorization", "Bearer key-1001")])
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    let aliceIDs = await fixture.append(user: "1000", texts: ["a1", "a2"])
    let bobIDs = await fixture.append(user: "1001", texts: ["b1"])
    #expect(RecipeShapesTests.upstreamIDs(alice, count: 2) == aliceIDs)
    #expect(RecipeShapesTests.upstreamIDs(bob, count: 1) == bobIDs)
    let texts = alice.events.filter { $0.type == "message" }.map(\.data)
    #expect(texts.allSatisfy { !$0.contains("\"b1\"") }, "alice never sees bob's messages")
    await fixture.revokeKey("key-1001")
    let deadline = MonotonicClock.seconds() + 10 * timingFactor
    while !bob.isEOF && MonotonicClock.seconds() < deadline { _ = try? bob.pump(timeout: 0.05) }
    #expect(bob.isEOF, "a revoked key's stream ends")
    let later = await fixture.append(user: "1000", texts: ["a3"])
    #expect(RecipeShapesTests.upstreamIDs(alice, count: 3) == aliceIDs + later, "the other account goes on")
    #expect(!logs.tails().contains("key-1000"), "keys are never logged")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// The fixture message ids (`message.object.message.id`) of the VK events a client received.
  static func vkMessages(_ client: TestSSEClient) -> [UInt64] {
    client.events.filter { $0.type == "message" }.compactMap {
      (try? RawJSON.parse($0.data))?.resolve(pointer: "/message/object/message/id")?.unsignedID
    }
  }

  /// VK Bots Long Poll: a session step returns the server URL, the key and the first ts; `failed` in a 200 body
  /// means, by its number, go on from the answer's ts with a gap (1), get a new key and keep the ts (2), or get a new
  /// key and a new ts with a gap (3).
  @Test func vkFollowsItsFailedSignalsAndResumesAcrossAKill() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-vk", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = ["VK_API": "http://\(fixture.address)", "VK_GROUP": "1", "VK_TOKEN": fixture.options.apiKey]
    // Traced: every request's URL is logged, so the check below that no session key or token shows means something.
    var node = try relay(
      "vk.json", store: store, log: logs.files[0], environment: environment, extra: ["--log-level", "trace"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    func collect(_ client: TestSSEClient, count: Int) -> [UInt64] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while RecipeShapesTests.vkMessages(client).count < count && MonotonicClock.seconds() < deadline {
        _ = try? client.pump(timeout: 0.05)
      }
      return RecipeShapesTests.vkMessages(client)
    }
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    var expected = await fixture.append(user: "101", texts: ["one", "two"])
    #expect(collect(client, count: 2) == expected)
    // failed:2 — a new key, the same ts: nothing lost, nothing twice.
    await fixture.vkExpireKey()
    try await Task.sleep(for: .milliseconds(Int(300 * timingFactor)))
    expected += await fixture.append(user: "101", texts: ["after a new key"])
    #expect(collect(client, count: 3) == expected)
    // A kill, messages meanwhile, then failed:1 on the first poll back: they are lost upstream, clients are told.
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    let lost = await fixture.append(user: "101", texts: ["lost while down"])
    await fixture.vkLoseHistory()
    node = try relay("vk.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    var later = await fixture.append(user: "101", texts: ["after the gap"])
    #expect(collect(client, count: 1) == later, "not \(lost): VK dropped it")
    #expect(client.events.contains { $0.type == "upstream" && $0.data.contains("\"resync\"") })
    // failed:3 — a new session and a new ts, with a gap.
    await fixture.vkLoseEverything()
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    later += await fixture.append(user: "101", texts: ["after failed 3"])
    #expect(collect(client, count: 2) == later)
    let resyncs = client.events.filter { $0.type == "upstream" && $0.data.contains("\"resync\"") }
    #expect(resyncs.count == 2, "\(client.events.map(\.data))")
    // Each names the API's cursor (VK's ts) the relay polls on from.
    #expect(resyncs.allSatisfy { $0.data.contains("\"api_cursor\":\"") }, "\(resyncs.map(\.data))")
    let log = (try? String(contentsOf: logs.files[0], encoding: .utf8)) ?? ""
    #expect(log.contains("upstream request"), "traced")
    #expect(
      !log.contains("key=k1") && !log.contains("key=k2") && !log.contains(fixture.options.apiKey), "\(log.suffix(2000))"
    )
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// The fixture message ids (`message.message.id`) of the Zulip events a client received.
  static func zulipMessages(_ client: TestSSEClient) -> [UInt64] {
    client.events.filter { $0.type == "message" }.compactMap {
      (try? RawJSON.parse($0.data))?.resolve(pointer: "/message/message/id")?.unsignedID
    }
  }

  /// Zulip: a register step (POST form, HTTP Basic) returns the queue and `last_event_id` -1, a signed cursor the
  /// recipe keeps as opaque text; heartbeats carry ids, move the cursor and are not relayed; the cursor survives a
  /// `kill -9` in SQLite; `BAD_EVENT_QUEUE_ID` registers a new queue, whose ids start again at the old queue's
  /// first, with a gap that clients are told about, and nothing of the new queue is dropped as a redelivery.
  @Test func zulipSkipsHeartbeatsResumesAndRegistersAgainAfterBadEventQueueID() async throws {
    var options = LegacyFixture.Options()
    options.maxPollTimeout = 0.5  // a heartbeat every half second
    let fixture = try await LegacyFixture.start(options)
    let logs = try NodeLogs("pollcast-zulip", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let basic = Data("bot@example.com:\(fixture.options.apiKey)".utf8).base64EncodedString()
    let environment = ["ZULIP_URL": "http://\(fixture.address)", "ZULIP_BASIC": basic]
    var node = try relay(
      "zulip.json", store: store, log: logs.files[0], environment: environment, extra: ["--log-level", "trace"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    func collect(_ client: TestSSEClient, count: Int) -> [UInt64] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while RecipeShapesTests.zulipMessages(client).count < count && MonotonicClock.seconds() < deadline {
        _ = try? client.pump(timeout: 0.05)
      }
      return RecipeShapesTests.zulipMessages(client)
    }
    // Heartbeats only, for a while: nothing is relayed.
    try await Task.sleep(for: .milliseconds(Int(1600 * timingFactor)))
    _ = try? client.pump(timeout: 0.1)
    #expect(RecipeShapesTests.zulipMessages(client).isEmpty)
    var expected = await fixture.append(user: "101", texts: ["one", "two"])
    #expect(collect(client, count: 2) == expected)
    // More heartbeats, then a kill: the cursor (a heartbeat's id) is stored, and what came meanwhile is relayed
    // once from it, in the same queue.
    try await Task.sleep(for: .milliseconds(Int(1200 * timingFactor)))
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    expected += await fixture.append(user: "101", texts: ["while down"])
    node = try relay("zulip.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    #expect(collect(client, count: 1) == Array(expected.suffix(1)))
    let sessionsBefore = await fixture.statistics().sessions
    #expect(sessionsBefore == 1, "the stored queue and cursor are polled on, no new register")
    // The queue is garbage-collected: a new register, a gap, and the new queue's events (ids from 1000 again).
    await fixture.zulipExpireQueue()
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    let later = await fixture.append(user: "101", texts: ["new queue 1", "new queue 2"])
    #expect(collect(client, count: 3) == Array(expected.suffix(1)) + later)
    #expect(client.events.contains { $0.type == "upstream" && $0.data.contains("\"resync\"") })
    let ids = client.events.filter { $0.type == "message" }.compactMap {
      (try? RawJSON.parse($0.data))?.resolve(pointer: "/upstream_id")?.stringValue
    }
    #expect(ids.suffix(2) == ["1000", "2000"], "the new queue's own ids: \(ids)")
    #expect(await fixture.statistics().sessions == 2)
    let log = (try? String(contentsOf: logs.files[0], encoding: .utf8)) ?? ""
    #expect(log.contains("upstream request"), "traced")
    #expect(!log.contains(basic) && !log.contains("1517975029:"), "\(log.suffix(2000))")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// The fixture message ids (`name: msg-N.json`) of the Dropbox entries a client received.
  /// A new session that no rule reset the cursor for (here `BAD_EVENT_QUEUE_ID` only says `session`): the stored
  /// cursor counts in the old queue, so the new queue polls from its own first cursor (`initial`), with one gap
  /// (`recipe_session_changed`), told once however many polls follow, and nothing of the new queue is lost.
  @Test func aNewSessionNoRuleResetStartsFromInitialWithOneGap() async throws {
    var options = LegacyFixture.Options()
    options.maxPollTimeout = 0.3  // a heartbeat, and so a poll, every 0.3 s
    let fixture = try await LegacyFixture.start(options)
    let logs = try NodeLogs("pollcast-zulip-session", nodes: 1)
    defer { logs.remove() }
    let text = try String(contentsOfFile: RecipeShapesTests.recipe("zulip.json"), encoding: .utf8)
    let variant = text.replacingOccurrences(
      of: "\"do\": [\"session\", \"reset\"],\n      \"gap\": true", with: "\"do\": \"session\"")
    #expect(variant != text)
    let path = logs.directory.appendingPathComponent("zulip-session-only.json").path
    try variant.write(toFile: path, atomically: true, encoding: .utf8)
    let basic = Data("bot@example.com:\(fixture.options.apiKey)".utf8).base64EncodedString()
    let environment = ["ZULIP_URL": "http://\(fixture.address)", "ZULIP_BASIC": basic]
    let node = try relay(
      path, store: logs.directory.appendingPathComponent("relay.db").path, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let client = try TestSSEClient(port: node.port)
    func collect(count: Int) -> [UInt64] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while RecipeShapesTests.zulipMessages(client).count < count && MonotonicClock.seconds() < deadline {
        _ = try? client.pump(timeout: 0.05)
      }
      return RecipeShapesTests.zulipMessages(client)
    }
    try await Task.sleep(for: .milliseconds(Int(600 * timingFactor)))
    var expected = await fixture.append(user: "101", texts: ["old queue"])
    #expect(collect(count: 1) == expected)
    await fixture.zulipExpireQueue()
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    expected += await fixture.append(user: "101", texts: ["new queue 1", "new queue 2"])
    #expect(collect(count: 3) == expected)
    // Several more polls (heartbeats) in the new queue: the gap is not told again.
    try await Task.sleep(for: .milliseconds(Int(1500 * timingFactor)))
    _ = try? client.pump(timeout: 0.2)
    let resyncs = client.events.filter { $0.type == "upstream" && $0.data.contains("\"resync\"") }
    #expect(resyncs.count == 1, "\(resyncs.map(\.data))")
    #expect(resyncs.first?.data.contains("recipe_session_changed") == true)
    #expect(await fixture.statistics().sessions == 2)
    node.kill9()
    await fixture.shutdown()
  }

  static func dropboxMessages(_ client: TestSSEClient) -> [UInt64] {
    client.events.filter { $0.type == "message" }.compactMap {
      guard let name = (try? RawJSON.parse($0.data))?.resolve(pointer: "/message/name")?.stringValue else { return nil }
      return UInt64(name.dropFirst(4).dropLast(5))
    }
  }

  /// Dropbox: a longpoll that only says `changes`, then `continue` pages while `has_more` (the fetch step), the
  /// pages' cursor stored in SQLite across a `kill -9`, the longpoll's `backoff` waited before the next longpoll, and
  /// a 409 `reset` answered with a new cursor from `get_latest_cursor` and a gap.
  @Test func dropboxFetchesPagesAfterTheLongpollAndFollowsBackoffAndReset() async throws {
    var options = LegacyFixture.Options()
    options.maxPollTimeout = 30
    let fixture = try await LegacyFixture.start(options)
    await fixture.dropboxPage(2)
    let logs = try NodeLogs("pollcast-dropbox", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let base = "http://\(fixture.address)"
    let environment = [
      "DROPBOX_API": base, "DROPBOX_NOTIFY": base, "DROPBOX_TOKEN": fixture.options.apiKey,
    ]
    var node = try relay(
      "dropbox.json", store: store, log: logs.files[0], environment: environment, extra: ["--log-level", "debug"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    func collect(_ client: TestSSEClient, count: Int) -> [UInt64] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while RecipeShapesTests.dropboxMessages(client).count < count && MonotonicClock.seconds() < deadline {
        _ = try? client.pump(timeout: 0.05)
      }
      return RecipeShapesTests.dropboxMessages(client)
    }
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    // Five entries: three continue pages of two, in one commit.
    var expected = await fixture.append(user: "101", texts: ["1", "2", "3", "4", "5"])
    #expect(collect(client, count: 5) == expected)
    // The next longpoll answer asks for a 1 s backoff: the relay waits it before polling again.
    await fixture.dropboxBackoff(1)
    expected += await fixture.append(user: "101", texts: ["with backoff"])
    #expect(collect(client, count: 6) == expected)
    #expect(waitForLog(logs.files[0], "upstream asked to wait before the next poll", "delay_ms=1000"))
    // A kill, entries meanwhile: polled on from the stored cursor, each once.
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    expected += await fixture.append(user: "101", texts: ["while down 1", "while down 2", "while down 3"])
    node = try relay("dropbox.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    #expect(collect(client, count: 3) == Array(expected.suffix(3)))
    // Dropbox resets the cursors: a new one from get_latest_cursor, with a gap; what comes after is relayed.
    await fixture.dropboxReset()
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    let later = await fixture.append(user: "101", texts: ["after the reset"])
    #expect(collect(client, count: 4) == Array(expected.suffix(3)) + later)
    #expect(client.events.contains { $0.type == "upstream" && $0.data.contains("\"resync\"") })
    let log = (try? String(contentsOf: logs.files[0], encoding: .utf8)) ?? ""
    #expect(!log.contains(fixture.options.apiKey), "\(log.suffix(2000))")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// The fixture message ids (`data.id`) of the CometD events a client received.
  static func cometdMessages(_ client: TestSSEClient) -> [UInt64] {
    client.events.filter { $0.type == "message" }.compactMap {
      (try? RawJSON.parse($0.data))?.resolve(pointer: "/message/data/id")?.unsignedID
    }
  }

  /// CometD (Bayeux long-polling with the ack extension): handshake and subscribe as two session steps, POSTed
  /// connects whose answer mixes the connect reply (skipped; its `ext.ack` is the cursor, sent back as a number) with
  /// the events; the client id kept with the cursor across a `kill -9`, so the same client's queue is polled on;
  /// `advice.interval` waited before the next connect; `advice.reconnect: handshake` starts a new client with a gap.
  @Test func cometdHandshakesSubscribesAcksAndFollowsItsAdvice() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-cometd", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = ["COMETD_URL": "http://\(fixture.address)/cometd"]
    var node = try relay(
      "cometd.json", store: store, log: logs.files[0], environment: environment, extra: ["--log-level", "debug"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    func collect(_ client: TestSSEClient, count: Int) -> [UInt64] {
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while RecipeShapesTests.cometdMessages(client).count < count && MonotonicClock.seconds() < deadline {
        _ = try? client.pump(timeout: 0.05)
      }
      return RecipeShapesTests.cometdMessages(client)
    }
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    var expected = await fixture.append(user: "101", texts: ["one", "two"])
    #expect(collect(client, count: 2) == expected, "subscribed: the events reach the client")
    // The next connect reply advises a 1 s interval: the relay waits it before connecting again.
    await fixture.cometdAdvise(intervalMs: 1000)
    expected += await fixture.append(user: "101", texts: ["advised"])
    #expect(collect(client, count: 3) == expected)
    #expect(waitForLog(logs.files[0], "upstream asked to wait before the next poll", "delay_ms=1000"))
    // A kill, events meanwhile: the stored client and ack poll on in the same queue, each event once.
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    expected += await fixture.append(user: "101", texts: ["while down"])
    node = try relay("cometd.json", store: store, log: logs.files[0], environment: environment)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    #expect(collect(client, count: 1) == Array(expected.suffix(1)))
    #expect(await fixture.statistics().sessions == 1, "no new handshake after the restart")
    // The server forgets the client: a new handshake and subscribe, with a gap.
    await fixture.cometdDropClient()
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    let later = await fixture.append(user: "101", texts: ["new client"])
    #expect(collect(client, count: 2) == Array(expected.suffix(1)) + later)
    #expect(client.events.contains { $0.type == "upstream" && $0.data.contains("\"resync\"") })
    #expect(await fixture.statistics().sessions == 2)
    let log = (try? String(contentsOf: logs.files[0], encoding: .utf8)) ?? ""
    #expect(!log.contains("fx1c0mEtD") && !log.contains("fx2c0mEtD"), "the client id is a session value: redacted")
    node.kill9()
    await fixture.shutdown()
  }
}

extension RecipeShapesTests {
  /// `Config/recipes/chat.json` (the built-in chat adapter's own text) run as a user's recipe through the binary:
  /// the session with the API key, the cursor sync, both streams (the account and its linked one) in one poll, each
  /// message exactly once across a `kill -9` with the SQLite store.
  @Test func theChatRecipeRelaysBothStreamsExactlyOnceAcrossAKill() async throws {
    let fixture = try await LegacyFixture.start()
    let logs = try NodeLogs("pollcast-chat-recipe", nodes: 1)
    defer { logs.remove() }
    let store = logs.directory.appendingPathComponent("relay.db").path
    let environment = ["CHAT_URL": "http://\(fixture.address)"]
    let key = ["--upstream-api-key", fixture.options.apiKey]
    var node = try relay("chat.json", store: store, log: logs.files[0], environment: environment, extra: key)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let reader = Reader()
    try reader.connect(port: node.port)
    reader.pump(for: 0.3)
    let publisher = SteadyPublisher(fixture: fixture)
    reader.pump(for: 1)
    node.kill9()
    try await Task.sleep(for: .milliseconds(300))
    node = try relay("chat.json", store: store, log: logs.files[0], environment: environment, extra: key)
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    try reader.connect(port: node.port)
    reader.pump(for: 1)
    let expected = await publisher.stop()
    pumpUntil(reader, count: expected.count)
    expectExactlyOnce([reader], expected: expected, log: { logs.tails() })
    // The linked account's stream is polled in the same request.
    let linked = await fixture.append(user: "202", texts: ["to the linked account"])
    let client = try #require(reader.client)
    #expect(RecipeShapesTests.upstreamIDs(client, count: 1, stream: "202") == linked, "\(logs.tails())")
    #expect(!logs.tails().contains(fixture.options.apiKey), "the API key is never logged")
    let stats = await fixture.statistics()
    #expect(stats.maxPollsInFlightPerToken == 1)
    node.kill9()
    await fixture.shutdown()
  }

  /// The chat recipe per user (`auth.mode upstream`): each subscriber's key opens its own session, and each
  /// account gets only its own messages.
  @Test func theChatRecipeRelaysEachSubscribersOwnAccount() async throws {
    var options = LegacyFixture.Options()
    options.accounts = 2
    let fixture = try await LegacyFixture.start(options)
    let logs = try NodeLogs("pollcast-chat-recipe-per-user", nodes: 1)
    defer { logs.remove() }
    let node = try RelayProcess(
      arguments: [
        "--listen", "127.0.0.1:0", "--auth-mode", "upstream", "--upstream-adapter", "recipe", "--upstream-recipe",
        RecipeShapesTests.recipe("chat.json"), "--upstream-backoff-base-seconds", "0.05",
        "--upstream-backoff-cap-seconds", "0.2", "--log-level", "info",
      ], log: logs.files[0], environment: ["CHAT_URL": "http://\(fixture.address)"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let alice = try TestSSEClient(port: node.port, headers: [("Authorization", "Bearer key-1000")])
    let bob = try TestSSEClient(port: node.port, headers: [("Authorization", "Bearer key-1001")])
    try await Task.sleep(for: .milliseconds(Int(800 * timingFactor)))
    let aliceIDs = await fixture.append(user: "1000", texts: ["a1", "a2"])
    let bobIDs = await fixture.append(user: "1001", texts: ["b1"])
    #expect(RecipeShapesTests.upstreamIDs(alice, count: 2) == aliceIDs)
    #expect(RecipeShapesTests.upstreamIDs(bob, count: 1) == bobIDs)
    #expect(alice.events.allSatisfy { !$0.data.contains("\"b1\"") }, "alice never sees bob's messages")
    let stats = await fixture.statistics()
    #expect(stats.users["1000"]?.sessions == 1 && stats.users["1001"]?.sessions == 1, "\(stats.users)")
    #expect(!logs.tails().contains("key-1000"), "keys are never logged")
    node.kill9()
    await fixture.shutdown()
  }
}
