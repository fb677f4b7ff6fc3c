import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// The built `pollcast` executable, as users and scripts run it.
@Suite(.serialized, .timeLimit(.minutes(5))) struct CommandLineProcessTests {
  let binary = builtProduct("pollcast")

  @Test func versionAndHelpExitZero() throws {
    let version = try run(binary, ["--version"])
    #expect(version.code == 0)
    #expect(version.stdout.hasPrefix("pollcast \(PollcastVersion.current)"))
    let help = try run(binary, ["--help"])
    #expect(help.code == 0)
    #expect(help.stdout.contains("USAGE: pollcast"))
  }

  @Test func usageErrorsExit64WithTheUsage() throws {
    let result = try run(binary, ["--bogus"])
    #expect(result.code == 64)
    #expect(result.stderr.hasPrefix("Error: unknown option --bogus"))
    #expect(result.stderr.contains("USAGE: pollcast"))
  }

  @Test func invalidConfigurationListsEveryProblemAndDoesNotStart() throws {
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-bad-\(getpid()).json")
    try #"{"ring": {"max_events": -1}, "sse": {"heartbeat_seconds": "x"}}"#.write(
      to: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(at: file) }
    let result = try run(binary, ["--config", file.path, "--listen", "nowhere", "--log-level", "loud"])
    #expect(result.code == 78)
    #expect(result.stdout.isEmpty)
    for fragment in ["ring.max_events", "sse.heartbeat_seconds", "server.listen", "log.level"] {
      #expect(result.stderr.contains(fragment), "missing \(fragment) in: \(result.stderr)")
    }
  }

  /// A refused value, key or option is quoted with its control characters escaped: an escape sequence in a flag, a
  /// file key or a value never reaches the terminal raw (it could rewrite the screen or the window title), and a
  /// long one is cut.
  @Test func refusedValuesAreShownEscapedNeverRaw() throws {
    let escape = "\u{1b}"
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-esc-\(getpid()).json")
    let text = #"{"sse": {"\u001b]0;owned\u0007": 1}, "\u001b[2J": {}, "log": {"format": "\u001b[31mred"}}"#
    try text.write(to: file, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(at: file) }
    let long = String(repeating: "9", count: 5_000) + escape
    let refused = try run(
      binary,
      [
        "--config", file.path, "--server-backlog", "1\(escape)[31m", "--listen", "\(escape)[2J:x", "--ring-max-events",
        long,
      ])
    #expect(refused.code == 78)
    let unprintable = refused.stderr.unicodeScalars.filter { $0.value < 0x20 && $0 != "\n" }
    #expect(unprintable.isEmpty, "raw control characters in: \(refused.stderr.debugDescription)")
    for fragment in [
      #"--server-backlog: expected an integer, got "1\u001b[31m""#, #"unknown key "sse.\u001b]0;owned\u0007""#,
      #"unknown section "\u001b[2J""#, #"log.format: "\u001b[31mred" is not"#, #""\u001b[2J:x""#,
    ] {
      #expect(refused.stderr.contains(fragment), "missing \(fragment) in: \(refused.stderr)")
    }
    #expect(refused.stderr.count < 4_000, "a 5,000-character value is cut: \(refused.stderr.count)")
    // What a message quotes as is (a file name) is escaped on its way to stderr.
    let missing = try run(binary, ["--config", "/nonexistent/\(escape)[2J.json"])
    #expect(missing.code == 78)
    #expect(missing.stderr.contains(#"/nonexistent/\u001b[2J.json"#), "\(missing.stderr.debugDescription)")
    let usage = try run(binary, ["--bo\(escape)[1mgus"])
    #expect(usage.code == 64)
    #expect(usage.stderr.hasPrefix(#"Error: unknown option --bo\u001b[1mgus"#), "\(usage.stderr.debugDescription)")
  }

  @Test func aPortInUseIsAClearErrorNotACrash() async throws {
    try await RelayHarness.start().run { harness in
      let result = try run(binary, ["--listen", "127.0.0.1:\(harness.port)", "--upstream-url", "http://127.0.0.1:9"])
      #expect(result.code == 69)
      #expect(result.stderr.contains("cannot listen on 127.0.0.1:\(harness.port)"))
    }
  }

  @Test func demoPrintsTheAddressStreamsAndStopsCleanlyOnSIGTERM() async throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: binary)
    process.arguments = ["--demo", "--listen", "127.0.0.1:0", "--sse-heartbeat-seconds", "1"]
    let out = Pipe()
    process.standardOutput = out
    // The relay's log, shown when anything goes wrong (a crash under a sanitizer reports there).
    let errorLog = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-demo-\(UUID().uuidString)")
    #expect(FileManager.default.createFile(atPath: errorLog.path, contents: nil))
    defer { try? FileManager.default.removeItem(at: errorLog) }
    process.standardError = try FileHandle(forWritingTo: errorLog)
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    func relayLog() -> String { (try? String(contentsOf: errorLog, encoding: .utf8)) ?? "" }
    let port = try #require(listeningPort(of: out), "the relay did not start: \(relayLog())")
    let client = try TestSSEClient(port: port)
    do {
      try client.waitUntil(timeout: 10, "a demo message") { !$0.messageIDs.isEmpty }
    } catch {
      Issue.record("\(error); received \(client.bodyText.debugDescription); relay log: \(relayLog())")
      throw error
    }
    kill(process.processIdentifier, SIGTERM)
    try client.waitForEOF(timeout: 10)
    #expect(client.endedCleanly)
    let exitDeadline = Date().addingTimeInterval(10)
    while process.isRunning && Date() < exitDeadline { usleep(20_000) }
    #expect(!process.isRunning)
    #expect(process.terminationStatus == 0)
  }
}

@Suite(.timeLimit(.minutes(5))) struct CommandLineUpstreamRequirementTests {
  /// The README's way: `--auth-mode jwt` with a secret file, a token from `scripts/mint-token.sh` (openssl only),
  /// streamed with curl; without the token, 401. A missing key file is a configuration error (78).
  @Test func jwtModeWithATokenFromTheMintScriptStreamsWithCurl() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
      .deletingLastPathComponent()
    let mint = try run(
      "/bin/bash", [root.appendingPathComponent("scripts/mint-token.sh").path, secret.path, #"["101"]"#])
    #expect(mint.code == 0, "\(mint.stderr)")
    let token = mint.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    let missing = try run(
      builtProduct("pollcast"), ["--demo", "--auth-mode", "jwt", "--auth-jwt-key-file", "/nonexistent/secret"])
    #expect(missing.code == 78)
    #expect(missing.stderr.contains("/nonexistent/secret"))
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
    process.arguments = ["--demo", "--listen", "127.0.0.1:0", "--auth-mode", "jwt", "--auth-jwt-key-file", secret.path]
    let out = Pipe()
    process.standardOutput = out
    process.standardError = FileHandle.nullDevice
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    let port = try #require(listeningPort(of: out))
    let refused = try run(
      "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/events"])
    #expect(refused.stdout == "401")
    let streamed = try run(
      "/usr/bin/curl",
      ["-sN", "--max-time", "6", "-H", "Authorization: Bearer \(token)", "http://127.0.0.1:\(port)/events"], timeout: 15
    )
    #expect(streamed.stdout.contains(#""stream":"101""#), "\(streamed.stdout)")
    #expect(!streamed.stdout.contains(#""stream":"202""#))
    let page = try run("/usr/bin/curl", ["-s", "http://127.0.0.1:\(port)/"])
    #expect(page.stdout.contains("openssl dgst -sha256 -hmac"))
  }

  /// Key rotation without a restart: a key added to `auth.jwt.keys_directory` verifies after SIGHUP; a bad key set
  /// is refused and the previous keys keep working; streams already open are untouched.
  @Test func sighupReloadsTheTokenKeys() async throws {
    let minter = try TokenMinter()
    let directory = minter.directory.appendingPathComponent("keys")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let old = try minter.secret("keys/2026-11.key")
    let errorLog = minter.directory.appendingPathComponent("relay.log")
    #expect(FileManager.default.createFile(atPath: errorLog.path, contents: nil))
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
    process.arguments = [
      "--demo", "--listen", "127.0.0.1:0", "--auth-mode", "jwt", "--auth-jwt-keys-directory", directory.path,
    ]
    let out = Pipe()
    process.standardOutput = out
    process.standardError = try FileHandle(forWritingTo: errorLog)
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    let port = try #require(listeningPort(of: out))
    func status(kid: String, secret: [UInt8]) throws -> Int {
      let token = try minter.mint(
        alg: "HS256", kid: kid, claims: ["exp": Int(Date().timeIntervalSince1970) + 600, "streams": ["*"]],
        signer: .hmac(secret: secret))
      let client = try TestSSEClient(port: port, headers: [("Authorization", "Bearer \(token)")])
      try client.waitForHead()
      return client.status
    }
    let open = try TestSSEClient(
      port: port,
      headers: [
        (
          "Authorization",
          "Bearer "
            + (try minter.mint(
              alg: "HS256", kid: "2026-11", claims: ["exp": Int(Date().timeIntervalSince1970) + 600, "streams": ["*"]],
              signer: .hmac(secret: old.bytes)))
        )
      ])
    try open.waitForHead()
    #expect(open.status == 200)
    #expect(try status(kid: "2026-11", secret: old.bytes) == 200)
    let new = try minter.secret("keys/2026-12.key")
    #expect(try status(kid: "2026-12", secret: new.bytes) == 401)
    kill(process.processIdentifier, SIGHUP)
    let deadline = MonotonicClock.seconds() + 10
    while try status(kid: "2026-12", secret: new.bytes) != 200 && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(100))
    }
    #expect(try status(kid: "2026-12", secret: new.bytes) == 200)
    #expect(try status(kid: "2026-11", secret: old.bytes) == 200)
    // A key too short for HS256: the reload is refused, both keys keep verifying.
    FileManager.default.createFile(atPath: directory.appendingPathComponent("bad.key").path, contents: Data("x".utf8))
    kill(process.processIdentifier, SIGHUP)
    let logged = MonotonicClock.seconds() + 10
    while !((try? String(contentsOf: errorLog, encoding: .utf8)) ?? "").contains("token keys not reloaded")
      && MonotonicClock.seconds() < logged
    {
      try await Task.sleep(for: .milliseconds(100))
    }
    #expect(((try? String(contentsOf: errorLog, encoding: .utf8)) ?? "").contains("token keys not reloaded"))
    #expect(try status(kid: "2026-12", secret: new.bytes) == 200)
    try open.pump(timeout: 0.1)
    #expect(!open.isEOF)
    kill(process.processIdentifier, SIGTERM)
    process.waitUntilExit()
  }

  @Test func withoutAnUpstreamTheRelayRefusesToStartAndSaysHow() throws {
    let result = try run(builtProduct("pollcast"), ["--listen", "127.0.0.1:0"])
    #expect(result.code == 78)
    #expect(result.stderr.contains("upstream.url is required"))
  }

  @Test func printConfigNeverShowsTheAPIKey() throws {
    let result = try run(builtProduct("pollcast"), ["--print-config", "--upstream-api-key", "s3cr3t-key"])
    #expect(result.code == 0)
    #expect(!result.stdout.contains("s3cr3t-key"))
    #expect(result.stdout.contains("[redacted]"))
  }

  /// The Redis password in store.redis_url was printed in clear by --print-config, and echoed whole by
  /// configuration errors.
  @Test func theRedisPasswordIsNeverPrinted() throws {
    let printed = try run(
      builtProduct("pollcast"), ["--print-config", "--store-redis-url", "redis://:hunter2-pass@cache.internal:6380/2"])
    #expect(printed.code == 0)
    #expect(!printed.stdout.contains("hunter2-pass"))
    #expect(printed.stdout.contains("cache.internal:6380"))
    let refused = try run(
      builtProduct("pollcast"),
      ["--demo", "--store-kind", "redis", "--store-redis-url", "redis://:hunter2-pass@cache.internal:notaport"])
    #expect(refused.code == 78)
    #expect(refused.stderr.contains("store.redis_url"))
    #expect(!refused.stderr.contains("hunter2-pass"), "\(refused.stderr)")
  }

  /// URL userinfo and a key in a generic URL template's query were printed as they were.
  @Test func printConfigNeverShowsSecretsInURLs() throws {
    let result = try run(
      builtProduct("pollcast"),
      [
        "--print-config", "--upstream-url", "https://bob:hunter2@legacy.example/api", "--generic-url-template",
        "https://legacy.example/feed?after={cursor}&api_key=k3y-in-template",
      ])
    #expect(result.code == 0)
    for secret in ["hunter2", "bob:", "k3y-in-template"] { #expect(!result.stdout.contains(secret), "\(secret)") }
    #expect(result.stdout.contains("after={cursor}"))
  }
}

@Suite(.timeLimit(.minutes(5))) struct FixtureCommandTests {
  @Test func fixtureServesTheLegacyAPIAndChattersWhenAsked() throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast-legacy-fixture"))
    process.arguments = ["--listen", "127.0.0.1:0", "--chatter", "0.1", "--linked-user-id", "none"]
    let out = Pipe()
    process.standardOutput = out
    try process.run()
    defer {
      kill(process.processIdentifier, SIGTERM)
      process.waitUntilExit()
    }
    let line = String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
    #expect(line.hasPrefix("listening on 127.0.0.1:"))
    let address = String(line.split(separator: "\n")[0].dropFirst("listening on ".count))
    let session = try run(
      "/usr/bin/curl", ["-s", "-X", "POST", "-H", "Authorization: Bearer dev-key", "http://\(address)/api/session"])
    #expect(session.stdout.contains(#""linked_user_id":null"#))
    usleep(400_000)
    let stats = try run("/usr/bin/curl", ["-s", "http://\(address)/_control/stats"]).stdout
    let count = try RawJSON.parse(stats)["messages"]?["101"]?.unsignedID ?? 0
    #expect(count >= 2, "\(stats)")
    let bad = try run(
      "/usr/bin/curl", ["-s", "-w", " %{http_code}", "-X", "POST", "-d", "{", "http://\(address)/_control/messages"])
    #expect(bad.stdout.hasSuffix(" 400"))
  }

  /// `--accounts N` (DESIGN, "Who reads what"): users 1000…, keys `key-<user_id>`, each session reads only its own
  /// account (and its linked one), links per account revoke only that account's tokens, and `/_control/stats`
  /// reports every account that had a session.
  @Test func fixtureServesManyAccountsEachReadingOnlyItsOwn() throws {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast-legacy-fixture"))
    process.arguments = ["--listen", "127.0.0.1:0", "--accounts", "3"]
    let out = Pipe()
    process.standardOutput = out
    try process.run()
    defer {
      kill(process.processIdentifier, SIGTERM)
      process.waitUntilExit()
    }
    let port = try #require(listeningPort(of: out))
    let base = "http://127.0.0.1:\(port)"
    func curl(_ arguments: [String]) throws -> RawJSON {
      let result = try run("/usr/bin/curl", ["-s"] + arguments)
      return try RawJSON.parse(result.stdout)
    }
    func session(_ key: String) throws -> RawJSON {
      try curl(["-X", "POST", "-H", "Authorization: Bearer \(key)", "\(base)/api/session"])
    }
    let first = try session("key-1000")
    #expect(first["user_id"]?.stringValue == "1000")
    #expect(first["linked_user_id"]?.rawText == "null")
    #expect(try session("key-1002")["user_id"]?.stringValue == "1002")
    #expect(try session("key-1003")["error"] != nil, "key-1003 is outside --accounts 3")
    #expect(try session("dev-key")["user_id"]?.stringValue == "101", "the primary account stays")
    _ = try curl(["-X", "POST", "-d", #"{"user_id":"1000","text":"for 1000"}"#, "\(base)/_control/messages"])
    _ = try curl(["-X", "POST", "-d", #"{"user_id":"1002","text":"for 1002"}"#, "\(base)/_control/messages"])
    let token = try #require(first["token"]?.stringValue)
    // A cursor for another account is ignored: 1000 reads only its own messages.
    let answer = try curl(["\(base)/api/messages/poll?token=\(token)&cursor=1000:0,1002:0&timeout=1"])
    #expect(answer["1000"]?.rawText.contains("for 1000") == true)
    #expect(answer["1002"] == nil)
    let last = try curl(["\(base)/api/messages/last?token=\(token)"])
    #expect(last["last_ids"]?["1000"]?.unsignedID == 1)
    #expect(last["last_ids"]?["1002"] == nil)
    // Linking 1002 to 1001 revokes 1001's tokens only; its next session names the link.
    let other = try #require(try session("key-1001")["token"]?.stringValue)
    _ = try curl(["-X", "POST", "-d", #"{"user_id":"1001","linked_user_id":"1002"}"#, "\(base)/_control/link"])
    #expect(try curl(["\(base)/api/messages/last?token=\(other)"])["error"] != nil)
    #expect(try curl(["\(base)/api/messages/last?token=\(token)"])["last_ids"] != nil)
    let relinked = try session("key-1001")
    #expect(relinked["linked_user_id"]?.stringValue == "1002")
    let stats = try curl(["\(base)/_control/stats"])
    #expect(stats["users"]?["1000"]?["sessions"]?.unsignedID == 1)
    #expect(stats["users"]?["1000"]?["max_polls_in_flight"]?.unsignedID == 1)
    #expect(stats["users"]?["1001"]?["sessions"]?.unsignedID == 2)
    #expect(stats["users"]?["1000"]?["polls_in_flight"]?.unsignedID == 0)
  }

  @Test func fixtureUsageErrorsExit64() throws {
    let result = try run(builtProduct("pollcast-legacy-fixture"), ["--chatter", "-1"])
    #expect(result.code == 64)
    #expect(result.stderr.hasPrefix("Error: --chatter"))
  }
}

@Suite(.timeLimit(.minutes(5))) struct SecretsInLogsTests {
  @Test func neitherTheAPIKeyNorAnySessionTokenReachesTheLogsEvenAtTrace() async throws {
    var options = LegacyFixture.Options()
    options.apiKey = "sekrit-KEY-4711"
    let fixture = try await LegacyFixture.start(options)
    let logFile = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-log-\(getpid()).txt")
    FileManager.default.createFile(atPath: logFile.path, contents: nil)
    defer { try? FileManager.default.removeItem(at: logFile) }
    let log = try FileHandle(forWritingTo: logFile)
    let process = Process()
    process.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
    process.arguments = [
      "--listen", "127.0.0.1:0", "--upstream-url", "http://\(fixture.address)", "--log-level", "trace",
      "--upstream-poll-timeout-seconds", "1",
    ]
    process.environment = ["POLLCAST_UPSTREAM_API_KEY": "sekrit-KEY-4711"]
    process.standardOutput = FileHandle.nullDevice
    process.standardError = log
    try process.run()
    // Sessions, polls, expiries and a failure: every code path that logs.
    try await Task.sleep(for: .milliseconds(500))
    await fixture.append(user: "101", texts: ["one"])
    await fixture.expireTokens()
    await fixture.queue([.status(500)])
    await fixture.append(user: "101", texts: ["two"])
    try await Task.sleep(for: .milliseconds(2500))
    kill(process.processIdentifier, SIGTERM)
    process.waitUntilExit()
    try? log.close()
    let text = try String(contentsOf: logFile, encoding: .utf8)
    let tokens = await fixture.issuedTokens()
    #expect(tokens.count >= 2)
    #expect(text.contains("upstream session started"))
    #expect(text.contains("token=[redacted]"))
    #expect(!text.contains("sekrit-KEY-4711"))
    for token in tokens { #expect(!text.contains(token)) }
    await fixture.shutdown()
  }
}
