import CLibevent

/// Measures how late the loop runs a timer: a busy or blocked loop shows here before clients notice. Loop-
/// confined.
///
/// A tick is late only when the loop is busy at the moment it falls due, so a stall longer than the interval is
/// always seen (late by at least its length minus the interval) and a shorter one only sometimes: no tick late by
/// over B ms means no stall longer than B plus the interval. Every tick's lateness goes into a histogram: how many
/// were late by more than a bound over any window is the difference of two scrapes, where the maximum below is only
/// ever the run's. libevent times its timers on the coarse monotonic clock (a 4-ms tick on this kernel), so a few ms
/// of lateness are the clock's, not the loop's (up to 10 ms on an idle relay here; `EVENT_PRECISE_TIMER=1` in the
/// environment makes libevent use a precise clock, ~0.1 ms).
public final class LoopLagProbe: @unchecked Sendable {
  private let loop: EventLoop
  private var timer: LoopTimer?
  private var expected = 0.0
  private let interval: Double
  /// Lateness of the last tick, in seconds.
  public private(set) var lastLag = 0.0
  /// The largest lateness seen.
  public private(set) var maxLag = 0.0
  /// Every tick's lateness.
  public private(set) var lateness = Histogram(bounds: [0.001, 0.005, 0.01, 0.015, 0.02, 0.05, 0.1, 0.25, 1])

  public init(loop: EventLoop, interval: Double = 0.5) {
    self.interval = interval
    self.loop = loop
    timer = LoopTimer(loop: loop) { [weak self] in self?.tick() }
    arm()
  }

  private func tick() {
    lastLag = max(0, MonotonicClock.seconds() - expected)
    maxLag = max(maxLag, lastLag)
    lateness.record(lastLag)
    arm()
  }

  /// Re-armed from now, not repeating: libevent would time a repeating timer's next tick from when the late one
  /// was due, and from the time its pass began (cached when the loop woke), not from when the tick ran. Both would
  /// hide part of the next tick's lateness.
  private func arm() {
    LibeventCall.invariant(event_base_update_cache_time(loop.base), "event_base_update_cache_time")
    expected = MonotonicClock.seconds() + interval
    timer?.schedule(after: interval)
  }

  public func stop() { timer = nil }
}
