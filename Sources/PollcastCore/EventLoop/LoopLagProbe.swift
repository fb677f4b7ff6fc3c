/// Measures how late the loop runs a timer: a busy or blocked loop shows here before clients notice. Loop-
/// confined.
public final class LoopLagProbe: @unchecked Sendable {
  private var timer: LoopTimer?
  private var expected = 0.0
  private let interval: Double
  /// Lateness of the last tick, in seconds.
  public private(set) var lastLag = 0.0
  /// The largest lateness seen.
  public private(set) var maxLag = 0.0

  public init(loop: EventLoop, interval: Double = 0.5) {
    self.interval = interval
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.tick() }
    expected = MonotonicClock.seconds() + interval
    timer.schedule(after: interval)
    self.timer = timer
  }

  private func tick() {
    let now = MonotonicClock.seconds()
    lastLag = max(0, now - expected)
    maxLag = max(maxLag, lastLag)
    expected = now + interval
  }

  public func stop() { timer = nil }
}
