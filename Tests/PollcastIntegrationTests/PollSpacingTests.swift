import Foundation
import PollcastCore
import Testing

/// The legacy API is never hammered: an API that answers at once with nothing (it does not hold its poll) is
/// polled at most about once per `upstream.min_poll_interval_seconds`, the pause growing with jitter, while a busy
/// API that answers with new events at once is still re-polled at once.
@Suite(.serialized, .timeLimit(.minutes(3))) struct PollSpacingTests {
  static func relay(polling url: String, minInterval: Double) async throws -> Relay {
    var settings = UpstreamWorker.Settings()
    settings.backoff = Backoff(base: 0.05, cap: 5)
    settings.minPollInterval = minInterval
    let adapter = GenericAdapter(
      settings: GenericAdapter.Settings(urlTemplate: url + "/poll?since={cursor}", timeout: 5))
    return try await Relay.start(
      server: ServerSettings(host: "127.0.0.1", port: 0), feed: FeedSettings(heartbeatInterval: 5),
      logger: Logger(label: "test", level: .critical), upstream: .init(adapter: adapter, settings: settings))
  }

  @Test func instantEmptyAnswersAreSpacedAndAHeldOrBusyAPIIsNot() async throws {
    let empty = try CapturingServer(status: 200, body: "[]")
    defer { empty.stop() }
    let relay = try await Self.relay(polling: empty.url, minInterval: 1)
    let client = try TestSSEClient(port: relay.port)
    try await Task.sleep(for: .seconds(3.2))
    let polls = empty.received.count
    // At 0 s, 1 s, then 1-2 s later, …: four at most in 3.2 s (hundreds without spacing).
    #expect((2...4).contains(polls), "\(polls) polls in 3.2 s")
    let statistics = await relay.worker?.snapshot()
    #expect((statistics?.spacedPolls ?? 0) >= 2)
    #expect((statistics?.pollSpacing ?? 0) > 0)
    let metrics = try httpGet(port: relay.port, "/metrics").body
    #expect(metrics.contains("pollcast_upstream_spaced_polls_total"))
    try client.waitUntil(timeout: 2, "the spacing status") {
      $0.events.contains { $0.type == "upstream" && $0.data.contains("instant_empty_answers") }
    }
    await relay.shutdown(deadline: 2)

    // A busy API answering at once with new events every time: polled back to back.
    let busy = try CapturingServer(respond: { number, _ in (200, "[{\"id\":\(number + 1),\"n\":\(number)}]") })
    defer { busy.stop() }
    let busyRelay = try await Self.relay(polling: busy.url, minInterval: 1)
    let reader = try TestSSEClient(port: busyRelay.port)
    try reader.waitUntil(timeout: 10, "30 events in well under the interval") {
      $0.events(ofType: "message").count >= 30
    }
    #expect(await busyRelay.worker?.snapshot().spacedPolls == 0)
    await busyRelay.shutdown(deadline: 2)
  }

  /// An API that resends the same page at once (ignoring the cursor) brings nothing new: it is spaced too.
  @Test func anInstantResendOfTheSamePageIsSpaced() async throws {
    let resend = try CapturingServer(status: 200, body: "[{\"id\":1}]")
    defer { resend.stop() }
    let relay = try await Self.relay(polling: resend.url, minInterval: 0.5)
    try await Task.sleep(for: .seconds(2.2))
    let polls = resend.received.count
    #expect((2...6).contains(polls), "\(polls) polls in 2.2 s")
    await relay.shutdown(deadline: 2)
  }
}
