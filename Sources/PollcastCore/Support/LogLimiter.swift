/// Rate-limits repeated log lines: the first of a kind is written at once, further ones within `interval` are
/// only counted, and the next line written says how many were suppressed. A hostile answer with 100,000 bad
/// messages then costs a handful of lines, not 100,000. Loop-confined (owned by one actor).
public struct LogLimiter: Sendable {
  public let interval: Double
  private var windows: [String: (opened: Double, suppressed: Int)] = [:]

  public init(interval: Double = 10) { self.interval = interval }

  /// Whether a line of `kind` may be written now; when it may, `suppressed` is how many were held back since the
  /// last one written.
  public mutating func admit(_ kind: String, now: Double = MonotonicClock.seconds()) -> (write: Bool, suppressed: Int) {
    if let window = windows[kind], now - window.opened < interval {
      windows[kind] = (window.opened, window.suppressed + 1)
      return (false, 0)
    }
    let suppressed = windows[kind]?.suppressed ?? 0
    windows[kind] = (now, 0)
    if windows.count > 256 { windows = windows.filter { now - $0.value.opened < interval } }
    return (true, suppressed)
  }
}

extension Logger {
  /// Logs through `limiter`: at most one line of this message per interval, with the count held back.
  public func limited(
    _ level: Level, _ message: String, metadata: [String: String] = [:], limiter: inout LogLimiter
  ) {
    guard level >= self.level else { return }
    let (write, suppressed) = limiter.admit(message)
    guard write else { return }
    var fields = metadata
    if suppressed > 0 { fields["suppressed"] = String(suppressed) }
    log(level, message, fields)
  }
}
