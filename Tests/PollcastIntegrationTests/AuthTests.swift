import Foundation
import PollcastCore
import Testing

/// `auth.mode = jwt` and admission control, over real sockets, with tokens minted by the `openssl` command line.
@Suite(.serialized, .timeLimit(.minutes(5))) struct AuthTests {
  static let audience = "pollcast-test"

  static func jwtServer(
    _ settings: JWTSettings, admission: Admission.Limits = .init(maxFailuresPerMinute: 0),
    trusted: [String] = [], allowQuery: Bool = false
  ) -> ServerSettings {
    ServerSettings(
      host: "127.0.0.1", port: 0,
      access: AccessSettings(
        jwt: settings, allowQueryToken: allowQuery, admission: admission,
        trustedProxies: trusted.compactMap(AddressBlock.init)))
  }

  static func claims(
    streams: [String] = ["*"], expiresIn: Double = 600, subject: String? = "user-1", extra: [String: Any] = [:]
  ) -> [String: Any] {
    var claims: [String: Any] = [
      "exp": Int(Date().timeIntervalSince1970 + expiresIn), "streams": streams, "aud": audience,
    ]
    if let subject { claims["sub"] = subject }
    for (key, value) in extra { claims[key] = value }
    return claims
  }

  /// Every bad token gets 401, a `WWW-Authenticate: Bearer` challenge and its reason in the JSON body; none of them
  /// hurts the relay, and a good token still streams afterwards.
  @Test func everyBadTokenIsRefusedWithItsReason() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let other = try minter.secret("other")
    let rsa = try minter.keyPair("rsa")
    let now = Date().timeIntervalSince1970
    let valid = try minter.mint(alg: "HS256", claims: Self.claims(), signer: .hmac(secret: secret.bytes))
    let pem = [UInt8](FileManager.default.contents(atPath: rsa.publicKey)!)
    let cases: [(String, String, String)] = [
      (
        "expired", "expired",
        try minter.mint(alg: "HS256", claims: Self.claims(expiresIn: -120), signer: .hmac(secret: secret.bytes))
      ),
      (
        "nbf in the future", "not_yet_valid",
        try minter.mint(
          alg: "HS256", claims: Self.claims(extra: ["nbf": Int(now + 600)]), signer: .hmac(secret: secret.bytes))
      ),
      (
        "wrong aud", "wrong_audience",
        try minter.mint(
          alg: "HS256", claims: Self.claims(extra: ["aud": "someone-else"]), signer: .hmac(secret: secret.bytes))
      ),
      (
        "wrong key", "bad_signature",
        try minter.mint(alg: "HS256", claims: Self.claims(), signer: .hmac(secret: other.bytes))
      ),
      ("alg none", "wrong_algorithm", try minter.mint(alg: "none", claims: Self.claims(), signer: .unsigned)),
      (
        "RS256 signed", "wrong_algorithm",
        try minter.mint(alg: "RS256", claims: Self.claims(), signer: .rsa(privateKey: rsa.privateKey))
      ),
      ("truncated", "bad_signature", String(valid.dropLast(12))),
      ("two segments", "malformed", valid.split(separator: ".").prefix(2).joined(separator: ".")),
      (
        "8 KiB of garbage", "malformed",
        String((0..<8192).map { _ in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdef0123456789-_.".randomElement()! })
      ),
      (
        "no exp", "missing_exp",
        try minter.mint(
          alg: "HS256", claims: ["streams": ["*"], "aud": Self.audience], signer: .hmac(secret: secret.bytes))
      ),
      (
        "no streams", "bad_streams_claim",
        try minter.mint(
          alg: "HS256", claims: ["exp": Int(now + 600), "aud": Self.audience], signer: .hmac(secret: secret.bytes))
      ),
    ]
    let settings = JWTSettings(algorithm: .hs256, keys: ["": secret.bytes], audience: Self.audience, leeway: 30)
    try await RelayHarness.start(server: Self.jwtServer(settings)).run { harness in
      let missing = try httpGet(port: harness.port, "/events")
      #expect(missing.status == 401)
      #expect(missing.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
      #expect(missing.body.contains(#""reason":"missing""#))
      for (name, expected, token) in cases {
        let answer = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(token)")])
        #expect(answer.status == 401, "\(name): \(answer.status) \(answer.body)")
        #expect(answer.body.contains(#""reason":"\#(expected)""#), "\(name): \(answer.body)")
        #expect(answer.headers["www-authenticate"]?.contains("invalid_token") == true, "\(name)")
        #expect(!answer.body.contains(token.prefix(40)), "\(name): the token was echoed")
      }
      #expect(try httpGet(port: harness.port, "/healthz").status == 200)
      let client = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(valid)")])
      try client.waitForHead()
      #expect(client.status == 200)
      let counters = await harness.relay.server.protectionCounters
      #expect(counters.authFailures["wrong_algorithm"] == 2)
      #expect(counters.authFailures["missing"] == 1)
    }
    // An RS256 relay: the HS/RS confusion (an HS256 token whose secret is the relay's public key PEM) is refused,
    // a real RS256 token passes.
    let rsaSettings = JWTSettings(algorithm: .rs256, keys: ["": pem], audience: nil, leeway: 30)
    try await RelayHarness.start(server: Self.jwtServer(rsaSettings)).run { harness in
      let confused = try minter.mint(alg: "HS256", claims: Self.claims(), signer: .hmac(secret: pem))
      let answer = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(confused)")])
      #expect(answer.status == 401)
      #expect(answer.body.contains(#""reason":"wrong_algorithm""#))
      let good = try minter.mint(alg: "RS256", claims: Self.claims(), signer: .rsa(privateKey: rsa.privateKey))
      let client = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(good)")])
      try client.waitForHead()
      #expect(client.status == 200)
    }
  }

  /// ES256 with two keys picked by `kid` (rotation): both verify; an unknown kid is refused.
  @Test func es256KeysAreSelectedByKid() async throws {
    let minter = try TokenMinter()
    let old = try minter.keyPair("ec", name: "2026-11")
    let new = try minter.keyPair("ec", name: "2026-12")
    let keys = [
      "2026-11": [UInt8](FileManager.default.contents(atPath: old.publicKey)!),
      "2026-12": [UInt8](FileManager.default.contents(atPath: new.publicKey)!),
    ]
    let settings = JWTSettings(algorithm: .es256, keys: keys, audience: nil, leeway: 30)
    try await RelayHarness.start(server: Self.jwtServer(settings)).run { harness in
      for (kid, key) in [("2026-11", old.privateKey), ("2026-12", new.privateKey)] {
        let token = try minter.mint(alg: "ES256", kid: kid, claims: Self.claims(), signer: .ec(privateKey: key))
        let client = try TestSSEClient(port: harness.port, headers: [("Cookie", "a=b; pollcast_token=\(token)")])
        try client.waitForHead()
        #expect(client.status == 200, "kid \(kid)")
      }
      let wrongKid = try minter.mint(
        alg: "ES256", kid: "2026-12", claims: Self.claims(), signer: .ec(privateKey: old.privateKey))
      #expect(
        try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(wrongKid)")]).body.contains(
          "bad_signature"))
      let unknown = try minter.mint(
        alg: "ES256", kid: "2027-01", claims: Self.claims(), signer: .ec(privateKey: new.privateKey))
      #expect(
        try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(unknown)")]).body.contains(
          "unknown_key"))
      // ES256 checks run off the loop while the request waits: clients that leave before their answer (reset or
      // close right after sending) cost nothing and break nothing.
      let token = try minter.mint(
        alg: "ES256", kid: "2026-12", claims: Self.claims(subject: nil), signer: .ec(privateKey: new.privateKey))
      for index in 0..<300 {
        let leaving = try TestSSEClient(
          port: harness.port, headers: [("Authorization", "Bearer \(token.dropLast(2))\(index % 10)A")])
        if index % 2 == 0 { leaving.reset() }
      }
      let after = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(token)")])
      try after.waitForHead()
      #expect(after.status == 200)
      #expect(try httpGet(port: harness.port, "/healthz").status == 200)
      try await harness.waitForSubscribers { $0 == 1 }
      let counters = await harness.relay.server.protectionCounters
      #expect(counters.tokenVerifications >= 5)
    }
  }

  /// The `streams` claim narrows replay and live delivery; asking for a stream outside it is 403. The query token
  /// is accepted only when enabled.
  @Test func theStreamsClaimNarrowsReplayAndLive() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let settings = JWTSettings(algorithm: .hs256, keys: ["": secret.bytes], audience: nil, leeway: 30)
    let token = try minter.mint(
      alg: "HS256", claims: Self.claims(streams: ["101"]), signer: .hmac(secret: secret.bytes))
    try await RelayHarness.start(server: Self.jwtServer(settings, allowQuery: true)).run { harness in
      let first = await harness.publish(3, stream: "101", prefix: "a")
      await harness.publish(3, stream: "202", prefix: "b")
      let forbidden = try httpGet(
        port: harness.port, "/events?stream=202", headers: [("Authorization", "Bearer \(token)")])
      #expect(forbidden.status == 403)
      #expect(forbidden.body.contains(#""stream":"202""#))
      let client = try TestSSEClient(
        port: harness.port, path: "/events?access_token=\(token)",
        headers: [("Last-Event-ID", String(first[0] - 1))])
      try client.waitForHead()
      #expect(client.status == 200)
      _ = try client.waitForEvents(3)
      await harness.publish(2, stream: "202", prefix: "c")
      await harness.publish(1, stream: "101", prefix: "d")
      try client.waitUntil(timeout: 5, "the live 101 event") { $0.events.contains { $0.data.contains("d0") } }
      let data = client.events.filter { $0.type == "message" }.map(\.data)
      #expect(data.count == 4)
      #expect(!data.contains { $0.contains(#""stream":"202""#) })
    }
    // The query token off: it is not looked at, so the request has no credential.
    try await RelayHarness.start(server: Self.jwtServer(settings, allowQuery: false)).run { harness in
      let answer = try httpGet(port: harness.port, "/events?access_token=\(token)")
      #expect(answer.status == 401)
      #expect(answer.body.contains(#""reason":"missing""#))
    }
  }

  /// A stream ends at its token's `exp` with `event: token-expired`; the client reconnects with a fresh token and
  /// its Last-Event-ID and gets every event it missed, with no gap and no duplicate.
  @Test func aStreamEndsAtExpAndResumesWithAFreshTokenWithoutAGap() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let settings = JWTSettings(algorithm: .hs256, keys: ["": secret.bytes], audience: nil, leeway: 0)
    let exp = Int(Date().timeIntervalSince1970) + 3
    let short = try minter.mint(
      alg: "HS256", claims: ["exp": exp, "streams": ["*"], "sub": "u"], signer: .hmac(secret: secret.bytes))
    try await RelayHarness.start(server: Self.jwtServer(settings)).run { harness in
      let client = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(short)")])
      try client.waitForHead()
      let publisher = Task {
        var all: [UInt64] = []
        for round in 0..<40 {
          all += await harness.publish(1, prefix: "r\(round)-")
          try? await Task.sleep(for: .milliseconds(150))
        }
        return all
      }
      try client.waitForEOF(timeout: 10 * timingFactor)
      let expired = try #require(client.events.first { $0.type == "token-expired" })
      #expect(expired.data.contains(#""expired_at":"\#(exp)""#))
      #expect(!expired.hadID)
      #expect(Date().timeIntervalSince1970 >= Double(exp))
      let before = client.messageIDs
      #expect(!before.isEmpty)
      let fresh = try minter.mint(alg: "HS256", claims: Self.claims(), signer: .hmac(secret: secret.bytes))
      // What EventSource does on reconnect: the same request with Last-Event-ID.
      let resumed = try TestSSEClient(
        port: harness.port,
        headers: [("Authorization", "Bearer \(fresh)"), ("Last-Event-ID", expired.lastEventID)])
      let sent = await publisher.value
      try resumed.waitUntil(timeout: 10, "every event") { ($0.messageIDs.last ?? 0) >= sent.last! }
      #expect(before + resumed.messageIDs == sent, "a gap or a duplicate across the token change")
      #expect(await harness.statistics().grantsEnded == 1)
    }
  }

  /// Each admission limit answers as DESIGN says, with a jittered Retry-After, and is counted by reason.
  @Test func admissionLimitsAnswer429Or503WithRetryAfter() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let settings = JWTSettings(algorithm: .hs256, keys: ["": secret.bytes], audience: nil, leeway: 30)
    func token(_ subject: String) throws -> String {
      try minter.mint(alg: "HS256", claims: Self.claims(subject: subject), signer: .hmac(secret: secret.bytes))
    }
    let limits = Admission.Limits(maxConnections: 4, maxPerAddress: 3, maxPerSubject: 2, maxFailuresPerMinute: 3)
    try await RelayHarness.start(server: Self.jwtServer(settings, admission: limits, trusted: ["127.0.0.1"])).run {
      harness in
      var open: [TestSSEClient] = []
      func connect(_ subject: String, from address: String) throws -> TestSSEClient {
        let client = try TestSSEClient(
          port: harness.port,
          headers: [("Authorization", "Bearer \(try token(subject))"), ("X-Forwarded-For", address)])
        try client.waitForHead()
        return client
      }
      // Per subject: the third stream of one subject.
      open.append(try connect("alice", from: "10.0.0.1"))
      open.append(try connect("alice", from: "10.0.0.2"))
      let third = try connect("alice", from: "10.0.0.3")
      #expect(third.status == 429)
      // Per address (the forwarded one: the peer is a trusted proxy): the fourth stream from 10.0.0.9.
      open.append(try connect("bob", from: "10.0.0.9"))
      open.append(try connect("carol", from: "10.0.0.9"))
      #expect(open.allSatisfy { $0.status == 200 })
      let sameAddress = try connect("dave", from: "198.51.100.1, 10.0.0.9")
      // 10.0.0.9 has two, so a third from it would pass; the right-most untrusted hop is what counts.
      #expect(sameAddress.status == 503, "the global cap of 4 is reached first")
      let fullAnswer = try httpGet(
        port: harness.port, "/events",
        headers: [("Authorization", "Bearer \(try token("erin"))"), ("X-Forwarded-For", "10.0.0.20")])
      #expect(fullAnswer.status == 503)
      let retry = try #require(Int(fullAnswer.headers["retry-after"] ?? ""))
      #expect((5...10).contains(retry))
      open.removeLast().reset()
      try await harness.waitForSubscribers { $0 == 3 }
      open.append(try connect("frank", from: "10.0.0.1"))
      #expect(open.last?.status == 200)
      // Failed checks from one address: after 3, even a good token gets 429 for the rest of the minute.
      for _ in 0..<3 {
        let bad = try httpGet(
          port: harness.port, "/events", headers: [("Authorization", "Bearer x.y.z"), ("X-Forwarded-For", "10.9.9.9")])
        #expect(bad.status == 401)
      }
      let throttled = try httpGet(
        port: harness.port, "/events",
        headers: [("Authorization", "Bearer \(try token("gina"))"), ("X-Forwarded-For", "10.9.9.9")])
      #expect(throttled.status == 429)
      #expect(throttled.body.contains("auth_throttled"))
      #expect(Int(throttled.headers["retry-after"] ?? "") ?? 0 >= 1)
      let counters = await harness.relay.server.protectionCounters
      #expect(counters.admissionRefusals[.perSubject] == 1)
      #expect(counters.admissionRefusals[.maxConnections] == 2)
      #expect(counters.admissionRefusals[.authThrottled] == 1)
      let metrics = try httpGet(port: harness.port, "/metrics").body
      #expect(metrics.contains(#"pollcast_admission_refusals_total{reason="per_subject"} 1"#))
    }
  }

  /// Per-address limits with `auth.mode = none`, and X-Forwarded-For ignored from a peer that is not trusted.
  @Test func perAddressLimitHoldsInModeNoneAndUntrustedForwardingIsIgnored() async throws {
    let server = ServerSettings(
      host: "127.0.0.1", port: 0, access: AccessSettings(admission: .init(maxConnections: 100, maxPerAddress: 2)))
    try await RelayHarness.start(server: server).run { harness in
      let first = try TestSSEClient(port: harness.port, headers: [("X-Forwarded-For", "203.0.113.1")])
      let second = try TestSSEClient(port: harness.port, headers: [("X-Forwarded-For", "203.0.113.2")])
      try first.waitForHead()
      try second.waitForHead()
      let third = try httpGet(port: harness.port, "/events", headers: [("X-Forwarded-For", "203.0.113.3")])
      #expect(third.status == 429, "a client named its own address")
      let retry = try #require(Int(third.headers["retry-after"] ?? ""))
      #expect((10...20).contains(retry))
      #expect(third.body.contains("per_address"))
      // A plain JSON answer: one Content-Type, not the stream's as well.
      #expect(third.headers["content-type"] == "application/json")
      let raw = try rawExchange(
        port: harness.port,
        "GET /events HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.4\r\nConnection: close\r\n\r\n")
      #expect(raw.statuses == [429])
      #expect(raw.text.lowercased().components(separatedBy: "content-type:").count == 2, "\(raw.text)")
    }
  }
}

/// 15,000 TCP connections that never send a request, against the relay as its own process at the descriptor limit
/// it raises itself to: a real subscriber still connects and receives, `/healthz` still answers, and nothing
/// pauses or is shed.
@Suite(.serialized, .timeLimit(.minutes(5))) struct IdleConnectionFloodTests {
  @Test func fifteenThousandIdleConnectionsDoNotKeepASubscriberOut() async throws {
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    // Both ends live on this machine: the test holds one descriptor per connection and the relay another; each
    // process raises its soft limit to the hard one.
    let hard = Int(clamping: limit.rlim_max)
    limit.rlim_cur = limit.rlim_max
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    let count = min(15_000, hard - 1_500)
    try #require(count >= 5_000, "the descriptor limit here (\(hard)) is too low for this test")
    if count < 15_000 { print("descriptor hard limit \(hard): flooding with \(count) idle connections") }
    let errorLog = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-idleflood-\(getpid()).log")
    #expect(FileManager.default.createFile(atPath: errorLog.path, contents: nil))
    defer { try? FileManager.default.removeItem(at: errorLog) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
    // The header deadline is long, so the idle connections stay for the whole test: the subscriber gets in by
    // headroom, not because the idle ones were closed.
    process.arguments = [
      "--demo", "--listen", "127.0.0.1:0", "--server-header-timeout-seconds", "300", "--sse-heartbeat-seconds", "5",
    ]
    let out = Pipe()
    process.standardOutput = out
    process.standardError = try FileHandle(forWritingTo: errorLog)
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    let port = try #require(
      listeningPort(of: out), "the relay did not start: \((try? String(contentsOf: errorLog, encoding: .utf8)) ?? "")")
    var idle: [TestSSEClient] = []
    idle.reserveCapacity(count)
    let started = MonotonicClock.seconds()
    for _ in 0..<count { idle.append(try TestSSEClient(rawPort: port)) }
    print("opened \(count) idle connections in \(String(format: "%.1f", MonotonicClock.seconds() - started)) s")
    // The relay has accepted them all (its descriptors are in use), none sent a byte.
    let accepted = MonotonicClock.seconds() + 20 * timingFactor
    while openDescriptors(process.processIdentifier) < count && MonotonicClock.seconds() < accepted {
      try await Task.sleep(for: .milliseconds(100))
    }
    #expect(openDescriptors(process.processIdentifier) >= count)
    let subscriber = try TestSSEClient(port: port)
    try subscriber.waitForHead(timeout: 10)
    #expect(subscriber.status == 200)
    try subscriber.waitUntil(timeout: 20 * timingFactor, "a demo message") { !$0.messageIDs.isEmpty }
    let health = try rawExchange(port: port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    #expect(health.statuses == [200])
    let metrics = try httpGet(port: port, "/metrics").body
    #expect(metrics.contains("pollcast_accept_pauses_total 0"))
    #expect(metrics.contains("pollcast_descriptor_reserve_refusals_total 0"))
    idle.removeAll()
    kill(process.processIdentifier, SIGTERM)
    process.waitUntilExit()
  }
}

/// Descriptors a process has open (entries in /proc/PID/fd).
func openDescriptors(_ pid: Int32) -> Int {
  (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd"))?.count ?? 0
}
