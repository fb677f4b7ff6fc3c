import Foundation
import Testing

@testable import PollcastCore

@Suite struct ConfigurationTests {
  private let loader = ConfigurationLoader()

  @Test func theUpstreamClientSwitchTakesAutoOrCurlAndRefusesAnythingElse() throws {
    #expect(throws: Never.self) {
      try loader.load(fileText: nil, environment: ["POLLCAST_UPSTREAM_CLIENT": "curl"], overrides: [])
    }
    #expect(throws: Never.self) {
      try loader.load(fileText: nil, environment: ["POLLCAST_UPSTREAM_CLIENT": "auto"], overrides: [])
    }
    #expect(throws: ConfigurationError.self) {
      try loader.load(fileText: nil, environment: ["POLLCAST_UPSTREAM_CLIENT": "fast"], overrides: [])
    }
  }

  @Test func defaultsAreValid() throws {
    #expect(Configuration().problems().isEmpty)
    let config = try loader.load(fileText: nil, environment: [:], overrides: [])
    #expect(config == Configuration())
  }

  @Test func shippedConfigFileEqualsTheDocumentedDefaults() throws {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
      .deletingLastPathComponent()
    let text = try String(contentsOf: root.appendingPathComponent("Config/pollcast.json"), encoding: .utf8)
    #expect(try loader.load(fileText: text, environment: [:], overrides: []) == Configuration())
  }

  @Test func fileThenEnvironmentThenFlagsEachOverrideTheLast() throws {
    let file = #"{"sse": {"heartbeat_seconds": 5, "retry_ms": 1000}, "ring": {"max_events": 50}}"#
    let config = try loader.load(
      fileText: file,
      environment: ["POLLCAST_SSE_RETRY_MS": "2000", "POLLCAST_RING_MAX_EVENTS": "60", "PATH": "/bin"],
      overrides: [("ring.max_events", "70")])
    #expect(config.sse.heartbeatSeconds == 5)
    #expect(config.sse.retryMilliseconds == 2000)
    #expect(config.ring.maxEvents == 70)
  }

  @Test func listsComeFromArraysOrCommaSeparatedText() throws {
    let fromFile = try loader.load(
      fileText: #"{"cors": {"allowed_origins": ["https://a.example"]}}"#, environment: [:], overrides: [])
    #expect(fromFile.cors.allowedOrigins == ["https://a.example"])
    let fromEnvironment = try loader.load(
      fileText: nil, environment: ["POLLCAST_CORS_ALLOWED_ORIGINS": "https://a.example, https://b.example:8443"],
      overrides: [])
    #expect(fromEnvironment.cors.allowedOrigins == ["https://a.example", "https://b.example:8443"])
  }

  @Test func listenAliasWorksInTheEnvironment() throws {
    let config = try loader.load(fileText: nil, environment: ["POLLCAST_LISTEN": "[::1]:0"], overrides: [])
    #expect(config.serverSettings.host == "::1")
    #expect(config.serverSettings.port == 0)
  }

  @Test func everyProblemIsReportedAtOnce() {
    let file = #"{"sse": {"heartbeat_seconds": "soon", "bogus": 1}, "nope": {}, "ring": {"max_events": 0}}"#
    #expect {
      try loader.load(
        fileText: file, environment: ["POLLCAST_SERVER_BACKLOG": "many", "POLLCAST_TYPO": "1"],
        overrides: [("server.listen", "nowhere")])
    } throws: { error in
      guard let error = error as? ConfigurationError else { return false }
      let text = error.problems.joined(separator: "\n")
      return error.problems.count >= 6 && text.contains("sse.heartbeat_seconds: expected a number")
        && text.contains("unknown key \"sse.bogus\"") && text.contains("unknown section \"nope\"")
        && text.contains("ring.max_events: must be greater than 0")
        && text.contains("POLLCAST_SERVER_BACKLOG: expected an integer")
        && text.contains("POLLCAST_TYPO: unknown") && text.contains("server.listen")
    }
  }

  @Test func malformedJSONIsAClearError() {
    #expect(throws: ConfigurationError.self) { try loader.load(fileText: "{", environment: [:], overrides: []) }
    #expect(throws: ConfigurationError.self) { try loader.load(fileText: "[1]", environment: [:], overrides: []) }
  }

  @Test func typeMismatchesAreRejectedNotCoerced() {
    for file in [
      #"{"ring": {"max_events": 1.5}}"#, #"{"ring": {"max_events": true}}"#, #"{"cors": {"allow_credentials": 1}}"#,
      #"{"cors": {"allowed_origins": "https://a.example"}}"#, #"{"server": {"listen": 8080}}"#,
    ] {
      #expect(throws: ConfigurationError.self, "\(file)") {
        try loader.load(fileText: file, environment: [:], overrides: [])
      }
    }
  }

  /// The loop probe wakes the loop every `server.loop_probe_ms`: 0 would spin it, and more than a minute would
  /// measure nothing.
  @Test func theLoopProbeIntervalIsBounded() throws {
    for bad in ["0", "-5", "60001"] {
      #expect(throws: ConfigurationError.self, "\(bad)") {
        try loader.load(fileText: nil, environment: ["POLLCAST_SERVER_LOOP_PROBE_MS": bad], overrides: [])
      }
    }
    let config = try loader.load(fileText: nil, environment: [:], overrides: [("server.loop_probe_ms", "5")])
    #expect(config.serverSettings.loopProbeInterval == 0.005)
  }

  @Test func heartbeatMustStayBelowTheServerTimeout() {
    var config = Configuration()
    config.sse.heartbeatSeconds = 60
    config.server.timeoutSeconds = 30
    #expect(config.problems().contains { $0.hasPrefix("sse.heartbeat_seconds") })
  }

  @Test(arguments: ["127.0.0.1:8080", "0.0.0.0:0", "[::1]:9000", "localhost:65535"])
  func validListenAddressesParse(text: String) throws {
    _ = try ListenAddress.parse(text)
  }

  @Test(arguments: ["127.0.0.1", ":80", "host:70000", "host:-1", "[::1]9000", "host:port"])
  func invalidListenAddressesAreRejected(text: String) {
    #expect(throws: ConfigurationError.self) { try ListenAddress.parse(text) }
  }

  @Test func badOriginsAreRejected() {
    var config = Configuration()
    config.cors.allowedOrigins = ["example.com", "https://ok.example", "https://slash.example/"]
    #expect(config.problems().filter { $0.hasPrefix("cors.allowed_origins") }.count == 2)
  }
}

@Suite struct CommandLineTests {
  @Test func flagsTakeSpaceOrEqualsValues() throws {
    let options = try CommandLineOptions.parse([
      "--listen", "127.0.0.1:0", "--sse-heartbeat-seconds=3", "--config", "x.json", "--upstream-api-key=k",
    ])
    #expect(options.configPath == "x.json")
    #expect(
      options.overrides == [
        .init(key: "server.listen", value: "127.0.0.1:0"), .init(key: "sse.heartbeat_seconds", value: "3"),
        .init(key: "upstream.api_key", value: "k"),
      ])
  }

  @Test func helpVersionAndDemoAreFlags() throws {
    #expect(try CommandLineOptions.parse(["-h"]).help)
    #expect(try CommandLineOptions.parse(["--version"]).version)
    #expect(try CommandLineOptions.parse(["--demo"]).demo)
  }

  @Test(arguments: [["--nope"], ["--listen"], ["stray"], ["--demo=yes"]])
  func usageErrorsAreReported(arguments: [String]) {
    #expect(throws: UsageError.self) { try CommandLineOptions.parse(arguments) }
  }

  @Test func settingsReferenceListsEveryKey() {
    let table = CommandLineOptions.settingsReference()
    for setting in Configuration.settings {
      #expect(table.contains("`\(setting.key)`"))
      #expect(table.contains("`\(setting.environmentName)`"))
    }
  }
}

@Suite struct LoggerTests {
  @Test func secretsNeverReachTheLine() {
    let line = Logger.render(
      level: .info, label: "t", message: "session", metadata: ["upstream.token": "abc123", "api_key": "k", "n": "1"],
      format: .logfmt)
    #expect(!line.contains("abc123"))
    #expect(!line.contains("=k"))
    #expect(line.contains("n=1"))
  }

  @Test func jsonFormatIsOneObject() throws {
    let line = Logger.render(level: .warning, label: "t", message: "a \"b\"", metadata: ["k": "v"], format: .json)
    let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: String]
    #expect(object?["msg"] == "a \"b\"")
    #expect(object?["level"] == "warning")
  }
}

@Suite struct ExampleConfigurationTests {
  private func load(_ name: String) throws -> Configuration {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
      .deletingLastPathComponent()
    let text = try String(contentsOf: root.appendingPathComponent("Config/\(name)"), encoding: .utf8)
    return try ConfigurationLoader().load(fileText: text, environment: [:], overrides: [])
  }

  @Test func chatExampleIsValidAndNamesTheChatAdapter() throws {
    let config = try load("chat.example.json")
    #expect(config.upstream.adapter == "chat")
    #expect(config.hasUpstream)
    #expect(config.makeAdapter() is ChatAdapter)
  }

  @Test func genericExampleIsValidAndNamesTheGenericAdapter() throws {
    let config = try load("generic.example.json")
    #expect(config.hasUpstream)
    #expect(config.makeAdapter() is GenericAdapter)
    #expect(config.generic.eventsPointer == "/data/items")
  }

  @Test func jwtExampleIsValidAndNamesItsKeyFile() throws {
    let config = try load("jwt.example.json")
    #expect(config.auth.mode == "jwt")
    #expect(config.auth.jwt.algorithm == "ES256")
    #expect(config.serverSettings.access.trustedProxies.count == 2)
    // The key file is read at start: a missing one is a configuration error naming it.
    #expect(throws: ConfigurationError.self) { try config.jwtSettings() }
  }

  @Test func perUserExampleIsValid() throws {
    let config = try load("upstream.example.json")
    #expect(config.auth.mode == "upstream")
    #expect(config.serverSettings.access.perUser)
    #expect(config.serverSettings.access.mode == "upstream")
    #expect(config.accountSettings.grace == 60)
    #expect(config.accountSettings.maxActiveAccounts == 10_000)
  }

  @Test func perUserModeNeedsTheKeyInEveryGenericRequestAndSaneBounds() throws {
    var config = Configuration()
    config.auth.mode = "upstream"
    config.upstream.adapter = "generic"
    config.generic.urlTemplate = "http://legacy/feed?after={cursor}"
    config.generic.headers = ["X-Static: 1"]
    config.upstream.maxAccounts = 0
    config.auth.credentialCacheSeconds = 0
    let problems = config.problems().joined(separator: "\n")
    #expect(problems.contains("{credential}"))
    #expect(problems.contains("upstream.max_accounts"))
    #expect(problems.contains("auth.credential_cache_seconds"))
    config.generic.headers = ["Authorization: Bearer {credential}"]
    config.upstream.maxAccounts = 10
    config.auth.credentialCacheSeconds = 30
    #expect(config.problems().isEmpty)
    // 0 for idle_after_seconds means the 30 s grace period in this mode.
    #expect(config.accountSettings.grace == 30)
    // The key is substituted in the header, and shown nowhere in the printed configuration.
    #expect(!"\(config.redacted.generic.headers)".contains("{credential}"))
  }

  @Test func storeProblemsAreReported() {
    var config = Configuration()
    config.store.kind = "bolt"
    config.store.synchronous = "sometimes"
    var problems = config.problems()
    #expect(problems.contains { $0.hasPrefix("store.kind: \"bolt\"") })
    #expect(problems.contains { $0.hasPrefix("store.synchronous") })
    config = Configuration()
    config.store.kind = "sqlite"
    problems = config.problems()
    #expect(
      problems == ["store.path: store.kind sqlite needs a file path (--store-path /var/lib/pollcast/pollcast.db)"])
    config.store.path = "/tmp/pollcast.db"
    #expect(config.problems().isEmpty)
    // Per-user relaying: the chat adapter's accounts (known by user id) are stored, and so are the generic
    // adapter's (known by a keyed hash of their key, the secret kept in the store).
    config.auth.mode = "upstream"
    config.upstream.url = "http://legacy"
    #expect(config.problems().isEmpty)
    config.upstream.adapter = "generic"
    config.generic.urlTemplate = "http://legacy/feed?after={cursor}"
    config.generic.headers = ["Authorization: Bearer {credential}"]
    #expect(config.problems().isEmpty)
    // On several nodes too: per-user relaying on redis, with an account grace of its own; the shared feed on
    // redis cannot idle (its leader polls for every node's subscribers).
    config.store.kind = "redis"
    config.upstream.idleAfterSeconds = 5
    #expect(config.problems().isEmpty)
    #expect(config.accountSettings.grace == 5)
    config.auth.mode = "none"
    #expect(config.problems().contains { $0.hasPrefix("upstream.idle_after_seconds") })
  }

  @Test func upstreamProblemsAreReported() {
    var config = Configuration()
    config.upstream.adapter = "soap"
    config.upstream.startFrom = "middle"
    config.upstream.backoffBaseSeconds = 60
    let problems = config.problems()
    #expect(problems.contains { $0.hasPrefix("upstream.adapter") })
    #expect(problems.contains { $0.hasPrefix("upstream.start_from") })
    #expect(problems.contains { $0.hasPrefix("upstream.backoff_base_seconds") })
    config = Configuration()
    config.upstream.adapter = "generic"
    config.generic.urlTemplate = "ftp://x"
    config.generic.idPointer = "seq"
    config.generic.headers = ["no colon"]
    #expect(config.problems().count == 3)
  }
}

@Suite struct ReadmeTests {
  @Test func readmeCarriesTheCurrentSettingsTable() throws {
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
      .deletingLastPathComponent()
    let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
    #expect(readme.contains(CommandLineOptions.settingsReference()), "regenerate it with: pollcast --help-config")
  }
}
