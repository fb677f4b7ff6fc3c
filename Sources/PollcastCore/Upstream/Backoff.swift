import Foundation

/// Exponential backoff with full jitter: the n-th delay is drawn uniformly from [0, min(cap, base·2ⁿ)], and
/// `reset()` after a success starts again from n = 0. Full jitter spreads the retries of many clients instead
/// of synchronising them.
public struct Backoff: Sendable, Equatable {
  public var base: Double
  public var cap: Double
  /// Failures since the last success.
  public private(set) var attempt = 0

  public init(base: Double = 2, cap: Double = 30) {
    self.base = base
    self.cap = cap
  }

  /// The upper bound of the delay for `attempt`.
  public func ceiling(attempt: Int) -> Double {
    min(cap, base * pow(2, Double(min(attempt, 62))))
  }

  /// The next delay in seconds; counts one more failure.
  public mutating func nextDelay(using random: inout some RandomNumberGenerator) -> Double {
    let ceiling = ceiling(attempt: attempt)
    attempt += 1
    return ceiling > 0 ? Double.random(in: 0...ceiling, using: &random) : 0
  }

  public mutating func reset() { attempt = 0 }

  /// The wait after a failure: the backoff's draw, lengthened (never shortened) by a delay the server asked for
  /// (`Retry-After`, a recipe's `after`), which is then also at least `floor` (the minimum poll interval) and at
  /// most `UpstreamError.maxRetryAfter`. A server that asks for 0, a negative or a non-number delay, or a date in the
  /// past, cannot make the relay re-poll a failing API at once.
  public static func wait(drawn: Double, serverAsked: Double?, floor: Double) -> Double {
    let drawn = drawn.isFinite ? max(0, drawn) : 0
    guard let asked = serverAsked else { return drawn }
    let bounded = asked.isNaN ? 0 : min(max(asked, 0), UpstreamError.maxRetryAfter)
    return max(drawn, bounded, floor.isFinite ? max(0, floor) : 0)
  }
}

/// Spaces polls whose answers came back at once and brought nothing new (an API that does not hold its poll: a
/// misconfigured timeout parameter, an overloaded server, no server-side waiting), so the relay never hammers it.
///
/// A poll that brought nothing and returned in less than `minimum` seconds is followed by a pause: the interval
/// from its start to the next poll is `minimum` the first time, then drawn with full jitter from
/// [`minimum`, min(`cap`, `minimum`·2ⁿ)] while such answers go on. A held answer (one that took `minimum` or
/// more) or one with something new resets it: a busy feed that answers with events at once is re-polled at once.
public struct PollSpacing: Sendable, Equatable {
  public var minimum: Double
  public var cap: Double
  /// Instant empty answers in a row.
  public private(set) var streak = 0

  public init(minimum: Double = 1, cap: Double = 30) {
    self.minimum = minimum
    self.cap = cap
  }

  /// How long to wait before the next poll, after one that took `duration` seconds and did (`brought`) or did
  /// not bring anything new.
  public mutating func delay(
    afterPollTaking duration: Double, brought: Bool, using random: inout some RandomNumberGenerator
  ) -> Double {
    guard minimum > 0, !brought, duration < minimum else {
      streak = 0
      return 0
    }
    let ceiling = min(max(cap, minimum), minimum * pow(2, Double(min(streak, 30))))
    streak += 1
    let interval = ceiling > minimum ? Double.random(in: minimum...ceiling, using: &random) : minimum
    return max(0, interval - duration)
  }
}
