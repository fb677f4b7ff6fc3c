import Foundation

/// Admission control for streams, in every auth mode: a global cap (503), and per-address and per-subject caps
/// (429), plus a throttle on failed credential checks per address (429). A plain value: it decides and counts,
/// the server performs. Loop-confined through its owner.
public struct Admission: Sendable {
  public struct Limits: Sendable, Equatable {
    /// Streams open at once, overall; 0 = no limit.
    public var maxConnections: Int
    /// Streams open at once from one client address; 0 = no limit.
    public var maxPerAddress: Int
    /// Streams open at once for one token subject (`sub`), or one account; 0 = no limit.
    public var maxPerSubject: Int
    /// Failed credential checks one address may make per minute before it gets 429; 0 = no limit.
    public var maxFailuresPerMinute: Int
    /// Addresses whose failures are remembered at once (the table's fixed bound).
    public var failureTableSize: Int

    public init(
      maxConnections: Int = 0, maxPerAddress: Int = 0, maxPerSubject: Int = 0, maxFailuresPerMinute: Int = 0,
      failureTableSize: Int = 10_000
    ) {
      self.maxConnections = maxConnections
      self.maxPerAddress = maxPerAddress
      self.maxPerSubject = maxPerSubject
      self.maxFailuresPerMinute = maxFailuresPerMinute
      self.failureTableSize = failureTableSize
    }
  }

  /// Why a stream was refused; the metric's `reason` label.
  public enum Refusal: String, Sendable, CaseIterable {
    case maxConnections = "max_connections"
    case perAddress = "per_address"
    case perSubject = "per_subject"
    case authThrottled = "auth_throttled"
    /// Per-user relaying: no room for another account (active or kept).
    case maxAccounts = "max_accounts"
    /// Per-user relaying: the legacy API could not check a key.
    case upstreamUnavailable = "upstream_unavailable"
    /// Too many credential checks waiting (a token's signature, a legacy key).
    case busy

    /// 503 when the server cannot serve anyone now, 429 for a client's own caps.
    public var status: Int32 {
      switch self {
      case .perAddress, .perSubject, .authThrottled: 429
      case .maxConnections, .maxAccounts, .upstreamUnavailable, .busy: 503
      }
    }
  }

  public var limits: Limits
  public private(set) var open = 0
  private var byAddress: [String: Int] = [:]
  private var bySubject: [String: Int] = [:]
  private var failures: [String: (windowStart: Double, count: Int)] = [:]
  public private(set) var refusals: [Refusal: Int] = [:]

  public init(limits: Limits) { self.limits = limits }

  /// Whether `address` has used up its failed checks for this minute (checked before any credential work).
  public mutating func throttled(_ address: String, now: Double) -> Refusal? {
    guard limits.maxFailuresPerMinute > 0, let entry = failures[address] else { return nil }
    if now - entry.windowStart >= 60 {
      failures[address] = nil
      return nil
    }
    guard entry.count >= limits.maxFailuresPerMinute else { return nil }
    refusals[.authThrottled, default: 0] += 1
    return .authThrottled
  }

  /// Seconds until `address`'s failure window ends (for Retry-After).
  public func throttleRemaining(_ address: String, now: Double) -> Double {
    guard let entry = failures[address] else { return 0 }
    return max(0, 60 - (now - entry.windowStart))
  }

  /// Records a failed credential check from `address`. The table keeps at most `failureTableSize` addresses:
  /// when full, windows that ended are dropped, then the oldest half, so a flood from many addresses costs
  /// bounded memory and at worst forgets some counts early.
  public mutating func recordFailure(_ address: String, now: Double) {
    guard limits.maxFailuresPerMinute > 0 else { return }
    if var entry = failures[address], now - entry.windowStart < 60 {
      entry.count += 1
      failures[address] = entry
      return
    }
    if failures.count >= limits.failureTableSize {
      failures = failures.filter { now - $0.value.windowStart < 60 }
      if failures.count >= limits.failureTableSize {
        let sorted = failures.sorted { $0.value.windowStart < $1.value.windowStart }
        for (key, _) in sorted.prefix(failures.count / 2 + 1) { failures[key] = nil }
      }
    }
    failures[address] = (now, 1)
  }

  public var failureTableCount: Int { failures.count }

  /// Counts a refusal decided elsewhere (the account hub, the token checker).
  public mutating func count(_ refusal: Refusal) { refusals[refusal, default: 0] += 1 }

  /// Admits a stream from `address` for `subject` (nil when the mode has none), or says why not.
  public mutating func admit(address: String, subject: String?) -> Refusal? {
    let refusal: Refusal? =
      if limits.maxConnections > 0 && open >= limits.maxConnections {
        .maxConnections
      } else if limits.maxPerAddress > 0 && byAddress[address, default: 0] >= limits.maxPerAddress {
        .perAddress
      } else if let subject, limits.maxPerSubject > 0 && bySubject[subject, default: 0] >= limits.maxPerSubject {
        .perSubject
      } else {
        nil
      }
    if let refusal {
      refusals[refusal, default: 0] += 1
      return refusal
    }
    open += 1
    byAddress[address, default: 0] += 1
    if let subject { bySubject[subject, default: 0] += 1 }
    return nil
  }

  /// A stream admitted with these keys ended.
  public mutating func release(address: String, subject: String?) {
    open = max(0, open - 1)
    if let count = byAddress[address] { byAddress[address] = count > 1 ? count - 1 : nil }
    if let subject, let count = bySubject[subject] { bySubject[subject] = count > 1 ? count - 1 : nil }
  }

  /// A jittered Retry-After in whole seconds: spread over [base, 2·base] so refused clients do not return at once.
  public static func retryAfter(base: Double, random: inout SeededRandom) -> Int {
    let low = max(1, base)
    return Int(Double.random(in: low...(2 * low), using: &random).rounded(.up))
  }
}
