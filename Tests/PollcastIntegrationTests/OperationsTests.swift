import Foundation
import PollcastCore
import Testing

/// Connection age, graceful shutdown spreading, the page and the metrics endpoint.
@Suite(.serialized, .timeLimit(.minutes(5))) struct OperationsTests {
  @Test func streamsEndAtTheMaximumAgeAndTheClientResumesWithoutAGap() async throws {
    try await RelayHarness.start(
      feed: FeedSettings(heartbeatInterval: 5, maxConnectionAge: 0.5, maxConnectionAgeJitter: 0.2)
    ).run { harness in
      let started = MonotonicClock.seconds()
      let client = try TestSSEClient(port: harness.port)
      try await harness.waitForSubscribers { $0 == 1 }
      let first = await harness.publish(2)
      try client.waitForEOF(timeout: 5)
      let age = MonotonicClock.seconds() - started
      #expect(age >= 0.5 && age < 2, "ended after \(age) s")
      #expect(client.endedCleanly)
      #expect(client.bodyText.contains(": maximum connection age reached"))
      #expect(client.messageIDs == first)
      let missed = await harness.publish(2)
      let again = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", String(first.last!))])
      try again.waitForEvents(2)
      #expect(again.messageIDs == missed)
      #expect((await harness.statistics()).agedOut >= 1)
    }
  }

  @Test func shutdownSpreadsTheEndOfStreamsOverItsWindow() async throws {
    let relay = try await Relay.start(
      server: ServerSettings(host: "127.0.0.1", port: 0), feed: FeedSettings(heartbeatInterval: 5),
      logger: Logger(label: "test", level: .critical), shutdownSpread: 1)
    let clients = try (0..<40).map { _ in try TestSSEClient(port: relay.port) }
    let harness = RelayHarness(relay: relay)
    try await harness.waitForSubscribers { $0 == 40 }
    let started = MonotonicClock.seconds()
    let shutdown = Task { await relay.shutdown(deadline: 5) }
    var endTimes: [Double] = []
    var open = clients
    while !open.isEmpty && MonotonicClock.seconds() - started < 10 {
      var descriptors = open.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
      _ = poll(&descriptors, nfds_t(descriptors.count), 20)
      for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
        if try !open[index].readAvailable() { endTimes.append(MonotonicClock.seconds() - started) }
      }
      open.removeAll { $0.isEOF }
    }
    await shutdown.value
    #expect(endTimes.count == 40)
    let spread = (endTimes.max() ?? 0) - (endTimes.min() ?? 0)
    #expect(spread >= 0.6, "streams ended within \(spread) s of each other")
    #expect(clients.allSatisfy { $0.endedCleanly })
  }

  @Test func thePageMetricsAndHealthAreServed() async throws {
    try await RelayHarness.start().run { harness in
      await harness.publish(3, stream: "101")
      let page = try run("/usr/bin/curl", ["-s", "-i", "http://127.0.0.1:\(harness.port)/"])
      #expect(page.stdout.contains("Content-Type: text/html; charset=utf-8"))
      #expect(page.stdout.contains("new EventSource(\"/events\" + window.location.search)"))
      #expect(!page.stdout.contains("src=\"http"))  // self-contained
      let metrics = try run("/usr/bin/curl", ["-s", "http://127.0.0.1:\(harness.port)/metrics"]).stdout
      for name in [
        "pollcast_subscribers_connected 0", "pollcast_events_relayed_total{stream=\"101\"} 3",
        "pollcast_resets_total{reason=\"too_old\"} 0", "pollcast_event_loop_lag_seconds",
        "# TYPE pollcast_event_loop_lateness_seconds histogram",
        "pollcast_event_loop_lateness_seconds_bucket{le=\"0.02\"}",
        "# TYPE pollcast_event_loop_cut_job_passes_total counter",
        "pollcast_slow_consumer_disconnects_total 0", "# TYPE pollcast_sent_bytes_total counter",
      ] {
        #expect(metrics.contains(name), "missing \(name)")
      }
      let ready = try run("/usr/bin/curl", ["-s", "-w", " %{http_code}", "http://127.0.0.1:\(harness.port)/readyz"])
      #expect(ready.stdout.hasSuffix(" 200"))
    }
  }
}
