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
}
