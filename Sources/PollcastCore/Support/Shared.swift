/// One immutable value shared by many objects: per-user relaying makes a feed and a worker per account, all with the
/// same settings, and a stored copy in each costs its size per account (88 bytes each, measured); a shared one costs
/// a word.
final class Shared<Value: Sendable>: Sendable {
  let value: Value
  init(_ value: Value) { self.value = value }
}

/// What every feed made with one `FeedSettings` can share: the settings, and the bytes it sends every stream (the
/// opening comment and retry line, the heartbeat comment), made once instead of per feed.
final class FeedCommon: Sendable {
  let settings: FeedSettings
  let preamble: ByteSlice
  let heartbeatBytes: BroadcastBytes
  /// Where feeds of one slice run their heartbeat rounds (`HeartbeatWheel`), when these settings are shared by many
  /// small feeds on `loop` (per-user relaying's accounts); nil: every feed runs its own timer.
  let wheel: HeartbeatWheel?
  /// The totals the feeds' counters are added to as well (per-user relaying's accounts: `AccountTotals`).
  let totals: AccountTotals?

  init(_ settings: FeedSettings, wheelOn loop: EventLoop? = nil, totals: AccountTotals? = nil) {
    self.settings = settings
    self.totals = totals
    wheel = loop.map { HeartbeatWheel(loop: $0, interval: settings.heartbeatInterval) }
    preamble = ByteSlice(
      SSEEncoder.comment("pollcast \(PollcastVersion.current)")
        + SSEEncoder.retry(milliseconds: settings.retryMilliseconds))
    heartbeatBytes = BroadcastBytes(SSEEncoder.comment("heartbeat"))
  }
}
