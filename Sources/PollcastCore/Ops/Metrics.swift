/// Prometheus text exposition of the relay's counters.
public enum Metrics {
  public static func render(_ stats: FeedStatistics) -> String {
    var out = ""
    func metric(_ name: String, _ type: String, _ help: String, _ samples: [(labels: String, value: String)]) {
      out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
      for sample in samples { out += "\(name)\(sample.labels) \(sample.value)\n" }
    }
    func one(_ name: String, _ type: String, _ help: String, _ value: some BinaryInteger) {
      metric(name, type, help, [("", String(value))])
    }
    one("pollcast_subscribers_connected", "gauge", "SSE subscribers connected now.", stats.subscribersConnected)
    one("pollcast_subscribers_total", "counter", "SSE subscribers accepted since start.", stats.subscribersTotal)
    metric(
      "pollcast_events_relayed_total", "counter", "Events relayed, per upstream stream.",
      stats.eventsPublishedByStream.keys.sorted().map {
        ("{stream=\(JSONText.quoted($0))}", String(stats.eventsPublishedByStream[$0]!))
      })
    one("pollcast_events_published_total", "counter", "Events given an id and relayed.", stats.eventsPublished)
    one("pollcast_resumes_total", "counter", "Subscribers that resumed from the replay ring.", stats.resumes)
    one("pollcast_replayed_events_total", "counter", "Events sent from the replay ring.", stats.replayedEvents)
    metric(
      "pollcast_resets_total", "counter", "Resets sent instead of a replay, by reason.",
      ResetReason.allCases.map { ("{reason=\"\($0.rawValue)\"}", String(stats.resetsByReason[$0.rawValue] ?? 0)) })
    one(
      "pollcast_slow_consumer_disconnects_total", "counter", "Subscribers dropped for falling too far behind.",
      stats.slowConsumerDisconnects)
    one("pollcast_sent_bytes_total", "counter", "Bytes queued to subscribers.", stats.bytesQueued)
    one("pollcast_ring_events", "gauge", "Events held in the replay ring.", stats.ringEvents)
    one("pollcast_ring_bytes", "gauge", "Encoded bytes held in the replay ring.", stats.ringBytes)
    one("pollcast_ring_evicted_total", "counter", "Events evicted from the replay ring.", stats.ringEvicted)
    metric("pollcast_head_id", "gauge", "Id of the newest event.", [("", String(stats.headID))])
    return out
  }
}
