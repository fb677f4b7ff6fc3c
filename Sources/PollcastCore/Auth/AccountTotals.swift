/// Running totals over every account's feed and upstream loop, kept as they change, so that `/metrics` reads them
/// without visiting every account (a walk over 9,000 accounts took ~13 ms of CPU a scrape, 1.4 µs an account,
/// most of it retains of cold objects). Loop-confined, like the feeds and workers that change them.
///
/// The ring gauges (events and bytes held, events evicted) are kept by the rings themselves (`RingTally`), and
/// the accounts' lease owners' figures on a store shared across nodes are still summed by a walk.
final class AccountTotals: @unchecked Sendable {
  /// Every account's feed counters, evicted accounts' included (counters never go down), and the subscribers
  /// connected now. Events per stream are not kept here: every account's events count under one label.
  var feeds = FeedStatistics()
  /// Polls in flight over every account's loop, and the most one loop had at once since the relay started.
  private(set) var pollsInFlight = 0
  private(set) var maxPollsInFlight = 0

  /// A loop's polls in flight went from `before` to `now`.
  func pollsInFlightChanged(from before: Int, to now: Int) {
    pollsInFlight += now - before
    maxPollsInFlight = max(maxPollsInFlight, now)
  }
}
