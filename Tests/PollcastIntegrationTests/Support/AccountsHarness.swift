import Foundation
import LegacyFixture
import PollcastCore

/// `auth.mode = upstream`: the reference fixture with `--accounts N` and a relay relaying each subscriber's own
/// account, both in-process on their own loops, over loopback.
struct AccountsHarness: StoppableHarness {
  let fixture: LegacyFixture
  let relay: Relay
  var port: Int { relay.port }
  var hub: AccountHub { relay.hub! }

  static func start(
    accounts: Int = 4, hub settings: AccountHub.Settings = fastSettings(), admission: Admission.Limits = .init(),
    generic: GenericAdapter.Settings? = nil, fixtureURL: String? = nil, fixtureHost: String? = nil,
    charset: CredentialCharset = .b64token, feed: FeedSettings = FeedSettings(),
    logger: Logger = Logger(
      label: "test", level: .critical), fixtureOptions: (inout LegacyFixture.Options) -> Void = { _ in }
  ) async throws -> AccountsHarness {
    var options = LegacyFixture.Options()
    options.accounts = accounts
    fixtureOptions(&options)
    let fixture = try await LegacyFixture.start(options)
    // `fixtureHost`: the fixture by a name (it listens on 127.0.0.1), as a relay in a container names its API.
    let named = fixtureHost.map { "http://\($0):\(fixture.address.split(separator: ":").last ?? "")" }
    let base = fixtureURL ?? named ?? "http://\(fixture.address)"
    var worker = UpstreamWorker.Settings()
    worker.backoff = Backoff(base: 0.05, cap: 0.2)
    worker.minPollInterval = 0.25
    let makeAdapter: @Sendable (String) -> UpstreamAdapter
    if var generic {
      generic.urlTemplate = generic.urlTemplate.replacingOccurrences(of: "FIXTURE", with: fixture.address)
      let settings = generic
      makeAdapter = { GenericAdapter(settings: settings, credential: $0) }
    } else {
      makeAdapter = {
        ChatAdapter(baseURL: base, holdSeconds: 1, marginSeconds: 1, requestTimeout: 3, credential: $0)
      }
    }
    var server = ServerSettings(host: "127.0.0.1", port: 0)
    server.access = AccessSettings(allowQueryToken: true, admission: admission)
    server.access.perUser = true
    server.access.credentialCharset = charset
    let relay = try await Relay.start(
      server: server, feed: FeedSettings(heartbeatInterval: 5), logger: logger,
      accounts: (AccountHub.Upstream(makeAdapter: makeAdapter, worker: worker, feed: feed), settings))
    return AccountsHarness(fixture: fixture, relay: relay)
  }

  static func fastSettings(grace: Double = 30, credentialCache: Double = 30, maxPendingChecks: Int = 1000)
    -> AccountHub.Settings
  {
    var settings = AccountHub.Settings()
    settings.grace = grace
    settings.credentialCacheSeconds = credentialCache
    settings.maxPendingChecks = maxPendingChecks
    return settings
  }

  func stop() async {
    await relay.shutdown(deadline: 2)
    await fixture.shutdown()
  }

  /// A stream opened with `key` as a bearer token.
  func client(_ key: String, path: String = "/events", lastEventID: String? = nil) throws -> TestSSEClient {
    var headers = [("Authorization", "Bearer \(key)")]
    if let lastEventID { headers.append(("Last-Event-ID", lastEventID)) }
    return try TestSSEClient(port: port, path: path, headers: headers)
  }

  /// Waits until `account` (`user:<id>`) is polling (or, with `active: false`, stopped).
  func waitForAccount(_ key: String, active: Bool = true, timeout: Double = 10) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while await hub.accountIsActive(key) != active {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(description: "account \(key) did not become \(active ? "active" : "idle")")
      }
      try await Task.sleep(for: .milliseconds(10))
    }
  }

  /// Waits until the fixture has a poll of `user` parked.
  func waitForParkedPoll(user: String, timeout: Double = 10) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while await fixture.statistics().users[user]?.pollsInFlight ?? 0 == 0 {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(description: "no poll of \(user) parked")
      }
      try await Task.sleep(for: .milliseconds(5))
    }
  }
}

extension AccountHub {
  func accountIsActive(_ key: String) -> Bool { account(key)?.isActive ?? false }
  func accountIsKept(_ key: String) -> Bool { account(key) != nil }
  func ringEvents(of key: String) -> Int? { account(key)?.feed.assumeIsolated { $0.statistics().ringEvents } }

  /// Weak references to an account's feed and loop, for leak checks.
  func watch(account key: String) -> AccountWatch {
    let watch = AccountWatch()
    watch.feed = account(key)?.feed
    watch.worker = account(key)?.worker
    return watch
  }
}

/// Weak references to what an account held.
final class AccountWatch: @unchecked Sendable {
  weak var feed: Feed?
  weak var worker: UpstreamWorker?
}
