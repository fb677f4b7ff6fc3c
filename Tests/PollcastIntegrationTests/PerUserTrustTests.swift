import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// Per-user relaying's keys over time: a revoked secondary key's streams end while another key keeps the account
/// polling, a vanished client's key check frees its slot at once, and subscribers of one account share one legacy
/// session however they arrive.
@Suite(.serialized, .timeLimit(.minutes(3))) struct PerUserTrustTests {
  static func isLive(_ client: TestSSEClient) -> Bool {
    client.events.contains { $0.type == "upstream" && $0.data.contains("\"live\"") }
  }

  @Test func aRevokedSecondaryKeyEndsItsStreamsWhileTheAccountPollsOn() async throws {
    try await AccountsHarness.start(hub: AccountsHarness.fastSettings(credentialCache: 1)).run { harness in
      await harness.fixture.addKey("phone-1000", for: "1000")
      let main = try harness.client("key-1000")
      try main.waitUntil("live", Self.isLive)
      let phone = try harness.client("phone-1000")
      try phone.waitUntil("live", Self.isLive)
      await harness.fixture.revokeKey("phone-1000")
      let started = MonotonicClock.seconds()
      try phone.waitUntil(timeout: 8, "credential-revoked") { !$0.events(ofType: "credential-revoked").isEmpty }
      print(
        "per-user trust: a revoked secondary key's stream ended after \(Int((MonotonicClock.seconds() - started) * 1000)) ms (cache 1 s)"
      )
      // The account's own key keeps reading.
      await harness.fixture.append(user: "1000", texts: ["after"])
      try main.waitUntil("the message after") { $0.relayedMessages.map(\.text).contains("after") }
      #expect(main.events(ofType: "credential-revoked").isEmpty)
      // And the revoked key is refused from now on.
      #expect(
        try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer phone-1000")]).status == 401)
    }
  }

  /// The periodic re-check walks the accounts in loop turns: with one account per turn, the revoked secondary keys
  /// of accounts visited in later turns end their streams too, and the accounts' own keys read on.
  @Test func theReCheckWalkInTurnsReachesEveryAccount() async throws {
    var settings = AccountsHarness.fastSettings(credentialCache: 1)
    settings.accountsPerWalkTurn = 1
    try await AccountsHarness.start(accounts: 4, hub: settings).run { harness in
      let users = ["1000", "1001", "1002", "1003"]
      var mains: [TestSSEClient] = []
      var phones: [TestSSEClient] = []
      for user in users {
        await harness.fixture.addKey("phone-\(user)", for: user)
        let main = try harness.client("key-\(user)")
        try main.waitUntil("live \(user)", Self.isLive)
        let phone = try harness.client("phone-\(user)")
        try phone.waitUntil("live phone \(user)", Self.isLive)
        (mains, phones) = (mains + [main], phones + [phone])
      }
      for user in users { await harness.fixture.revokeKey("phone-\(user)") }
      for (user, phone) in zip(users, phones) {
        try phone.waitUntil(timeout: 8, "credential-revoked \(user)") {
          !$0.events(ofType: "credential-revoked").isEmpty
        }
      }
      for (user, main) in zip(users, mains) {
        await harness.fixture.append(user: user, texts: ["after \(user)"])
        try main.waitUntil("the message after, \(user)") { $0.relayedMessages.map(\.text).contains("after \(user)") }
        #expect(main.events(ofType: "credential-revoked").isEmpty)
      }
    }
  }

  @Test func aVanishedClientsKeyCheckFreesItsSlotAtOnce() async throws {
    let capture = try CapturingServer(respond: { _, request in
      if request.headers.contains(where: { $0.value.contains("slow-key") }) { Thread.sleep(forTimeInterval: 4) }
      return (401, "{\"error\":\"no\"}")
    })
    defer { capture.stop() }
    try await AccountsHarness.start(hub: AccountsHarness.fastSettings(maxPendingChecks: 1), fixtureURL: capture.url)
      .run { harness in
        let slow = try TestSSEClient(rawPort: harness.port)
        try slow.send("GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer slow-key\r\n\r\n")
        let deadline = MonotonicClock.seconds() + 5
        while capture.received.isEmpty && MonotonicClock.seconds() < deadline {
          try await Task.sleep(for: .milliseconds(10))
        }
        slow.reset()
        try await Task.sleep(for: .milliseconds(200))
        // The only slot is free again: the next key is checked (and refused by the stand-in), not 503 busy.
        let next = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer other-key")])
        #expect(next.status == 401, "\(next.status) \(next.body)")
        let statistics = await harness.hub.statistics()
        #expect(statistics.credentialChecks["abandoned"] == 1)
        #expect(statistics.pendingChecks == 0)
      }
  }

  @Test func subscribersOfOneAccountShareOneLegacySession() async throws {
    try await AccountsHarness.start(hub: AccountsHarness.fastSettings(credentialCache: 0.5)).run { harness in
      // Two at once, then one more after the key's cache time.
      let first = try harness.client("key-1000")
      let second = try harness.client("key-1000")
      try first.waitUntil("live", Self.isLive)
      try second.waitUntil("live", Self.isLive)
      try await Task.sleep(for: .milliseconds(800))
      let third = try harness.client("key-1000")
      try third.waitUntil("live", Self.isLive)
      let sessions = await harness.fixture.statistics().users["1000"]?.sessions
      #expect(sessions == 1, "\(sessions ?? -1) legacy sessions for one account")
    }
  }

  /// A stream answer after a key check carried `Connection: close` twice (once from the parked request, once from
  /// the stream): exactly once now.
  @Test func aStreamAnswerCarriesOneConnectionHeader() async throws {
    try await AccountsHarness.start().run { harness in
      let client = try TestSSEClient(rawPort: harness.port)
      try client.send("GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1000\r\n\r\n")
      try client.waitForHead(timeout: 10)
      let head = client.rawHead.lowercased()
      #expect(head.components(separatedBy: "\r\nconnection:").count - 1 == 1, "\(client.rawHead)")
    }
  }

}

/// Made-up keys against an API that refuses them with something else than 401 (a 404, as Telegram answers a
/// malformed bot token): every failed check counts toward the address's failed-check throttle, so one address
/// cannot make the relay call the API once per made-up key.
@Suite(.serialized, .timeLimit(.minutes(2))) struct FailedCheckThrottleTests {
  @Test func failedChecksCountTowardTheThrottleLikeRefusedOnes() async throws {
    let capture = try CapturingServer(status: 404, body: "{\"ok\":false,\"error_code\":404}")
    defer { capture.stop() }
    let admission = Admission.Limits(maxFailuresPerMinute: 3)
    try await AccountsHarness.start(admission: admission, fixtureURL: capture.url).run { harness in
      var statuses: [Int] = []
      for key in 0..<8 {
        statuses.append(
          try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer made-up-\(key)")]).status)
      }
      #expect(statuses == [503, 503, 503, 429, 429, 429, 429, 429])
      #expect(capture.received.count == 3, "\(capture.received.map(\.line))")
    }
  }

  /// With no session step a key is admitted until its first poll; an API that refuses it there with a 404 (not a
  /// 401) ends that account as a refusal, and the refusals throttle the address: made-up keys do not become
  /// accounts polling forever.
  @Test func aKeyNothingAcceptedEndsOnAClientErrorOfItsFirstPoll() async throws {
    let capture = try CapturingServer(status: 404, body: "{\"error\":\"no such bot\"}")
    defer { capture.stop() }
    let generic = GenericAdapter.Settings(
      urlTemplate: "\(capture.url)/bot{credential}/updates?after={cursor}", eventsPointer: "/items", timeout: 3)
    try await AccountsHarness.start(admission: .init(maxFailuresPerMinute: 2), generic: generic).run { harness in
      for attempt in 0..<2 {
        let made = try harness.client("made-up-\(attempt)")
        try made.waitUntil("credential-revoked") { !$0.events(ofType: "credential-revoked").isEmpty }
      }
      let throttled = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer made-up-3")])
      #expect(throttled.status == 429)
      try await Task.sleep(for: .seconds(1))
      // One poll per made-up key, then nothing: no account kept polling.
      #expect(capture.received.count == 2, "\(capture.received.map(\.line))")
    }
  }
}
