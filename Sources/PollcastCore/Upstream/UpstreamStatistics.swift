/// What the worker counts, for `/metrics` and tests.
public struct UpstreamStatistics: Sendable {
  public var state = "stopped"
  public var pollsByOutcome: [String: Int] = [:]
  public var pollsInFlight = 0
  public var maxPollsInFlight = 0
  public var sessionsStarted = 0
  public var messagesRelayed = 0
  public var backlogMessages = 0
  public var duplicatesDropped = 0
  public var unknownStreams = 0
  public var rejectedMessages = 0
  public var repairedMessages = 0
  public var cursorRewinds = 0
  /// Batches (or positions) the store refused: relayed again once it accepts them.
  public var storeFailures = 0
  public var backoffAttempt = 0
  public var nextRetryDelay = 0.0
  /// Pauses before a poll because the previous ones came back at once with nothing new (`PollSpacing`).
  public var spacedPolls = 0
  /// The current pause before the next poll for that reason (0: not spacing).
  public var pollSpacing = 0.0
  public var lastPollCompleted: Double?
  /// When the latest poll was sent.
  public var pollStarted: Double?
  public var pollDurations = Histogram(bounds: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60])
  public var cursors: [String: UInt64] = [:]
  /// The API's own cursor per stream for an opaque-cursor recipe, as `UpstreamAdapter.shownCursor` shows it.
  public var apiCursors: [String: String] = [:]
  public var hasSession = false
  public var transportInFlight = 0
  /// Requests over the kept-alive connection and through libcurl (the transport's, since start).
  public var requestsKeptAlive = 0
  public var requestsThroughLibcurl = 0
}

/// A Prometheus-style histogram with fixed upper bounds.
public struct Histogram: Sendable {
  public let bounds: [Double]
  public private(set) var counts: [Int]
  public private(set) var sum = 0.0
  public private(set) var count = 0

  public init(bounds: [Double]) {
    self.bounds = bounds
    counts = Array(repeating: 0, count: bounds.count)
  }

  public mutating func record(_ value: Double) {
    for (index, bound) in bounds.enumerated() where value <= bound { counts[index] += 1 }
    sum += value
    count += 1
  }
}
