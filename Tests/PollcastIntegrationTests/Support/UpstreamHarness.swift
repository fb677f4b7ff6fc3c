import Foundation
import LegacyFixture
import PollcastCore

/// The reference fixture plus a relay polling it, both in-process on their own loops, over loopback.
struct UpstreamHarness: StoppableHarness {
  let fixture: LegacyFixture
  let relay: Relay
  var port: Int { relay.port }
  var worker: UpstreamWorker { relay.worker! }

  static func fastSettings(startFrom: UpstreamWorker.StartFrom = .latest, idleAfter: Double? = nil)
    -> UpstreamWorker.Settings
  {
    var settings = UpstreamWorker.Settings()
    settings.startFrom = startFrom
    settings.backoff = Backoff(base: 0.05, cap: 0.2)
    // The fixture holds polls for about a second in tests; instant answers (faults) are spaced less than in use.
    settings.minPollInterval = 0.25
    settings.idleAfter = idleAfter
    return settings
  }

  /// - Parameters:
  ///   - hold: the poll timeout the relay asks for; the client-side deadline is hold + 1 s.
  static func start(
    fixture options: LegacyFixture.Options = LegacyFixture.Options(),
    settings: UpstreamWorker.Settings = fastSettings(),
    hold: Double = 1, prefill: [String: [String]] = [:], generic: GenericAdapter.Settings? = nil,
    feed: FeedSettings = FeedSettings(heartbeatInterval: 5), logger: Logger = Logger(label: "test", level: .critical)
  ) async throws -> UpstreamHarness {
    let fixture = try await LegacyFixture.start(options)
    for (user, texts) in prefill { await fixture.append(user: user, texts: texts) }
    let adapter: UpstreamAdapter
    if var generic {
      generic.urlTemplate = generic.urlTemplate.replacingOccurrences(of: "FIXTURE", with: fixture.address)
      adapter = GenericAdapter(settings: generic)
    } else {
      adapter = ChatAdapter(
        baseURL: "http://\(fixture.address)", holdSeconds: hold, marginSeconds: 1, requestTimeout: 3,
        credential: options.apiKey)
    }
    let relay = try await Relay.start(
      server: ServerSettings(host: "127.0.0.1", port: 0), feed: feed,
      logger: logger,
      upstream: .init(adapter: adapter, settings: settings, apiKey: options.apiKey, seed: 1))
    return UpstreamHarness(fixture: fixture, relay: relay)
  }

  func stop() async {
    await relay.shutdown(deadline: 2)
    await fixture.shutdown()
  }

  /// Waits until the worker reports `state`.
  func waitForState(_ state: UpstreamWorker.State, timeout: Double = 10) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while await worker.state != state {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(description: "worker stuck in \(await worker.state), wanted \(state)")
      }
      try await Task.sleep(for: .milliseconds(10))
    }
  }

  /// Waits until `count` subscribers are attached to the relay's feed.
  func waitForSubscribers(_ count: Int, timeout: Double = 10) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while await relay.feed.subscriberCount != count {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(description: "subscriber count is not \(count)")
      }
      try await Task.sleep(for: .milliseconds(5))
    }
  }

  /// Waits until the fixture has a poll parked (the relay is waiting for news).
  func waitForParkedPoll(timeout: Double = 10) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while await fixture.statistics().pollsInFlight == 0 {
      guard MonotonicClock.seconds() < deadline else { throw TestSSEClient.Failure(description: "no poll parked") }
      try await Task.sleep(for: .milliseconds(5))
    }
  }
}

/// The `message` events' payloads, decoded.
struct RelayedMessage: Equatable {
  var stream: String
  var upstreamID: UInt64
  var backlog: Bool
  var text: String
}

extension TestSSEClient {
  var relayedMessages: [RelayedMessage] {
    events.filter { $0.type == "message" }.compactMap { event in
      guard let json = try? RawJSON.parse(event.data), let stream = json["stream"]?.stringValue,
        let id = json["upstream_id"]?.unsignedID, let message = json["message"],
        let text = message["text"]?.stringValue
      else { return nil }
      if case .bool(let backlog) = json["backlog"]?.value {
        return RelayedMessage(stream: stream, upstreamID: id, backlog: backlog, text: text)
      }
      return nil
    }
  }

  func events(ofType type: String) -> [SSEParser.Event] { events.filter { $0.type == type } }
}
