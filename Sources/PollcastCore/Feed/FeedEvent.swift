/// An event handed to the feed for relaying. The feed assigns its id and encodes it once.
public struct FeedEvent: Sendable, Equatable {
  /// The SSE event type: `message`, `stream-attached`, `stream-detached`.
  public var type: String
  /// The upstream stream it belongs to; `?stream=` filters on it. Nil: every subscriber receives it.
  public var stream: String?
  /// The `data:` payload (JSON text for the relay's own events).
  public var data: String
  /// The upstream message's id, for relayed messages: stored with the event, so that after a restart an upstream
  /// resending its last page is recognised as resending.
  public var upstreamID: UInt64?

  public init(type: String = "message", stream: String?, data: String, upstreamID: UInt64? = nil) {
    self.type = type
    self.stream = stream
    self.data = data
    self.upstreamID = upstreamID
  }
}

/// Tunables of the feed, from configuration.
public struct FeedSettings: Sendable, Equatable {
  public var ring: ReplayRing.Limits
  /// A subscriber whose unsent bytes would pass this is disconnected (it resumes with `Last-Event-ID`).
  public var maxPendingBytes: Int
  /// Seconds between heartbeat comments.
  public var heartbeatInterval: Double
  /// The `retry:` value sent to each new subscriber, in milliseconds.
  public var retryMilliseconds: Int
  /// How many bytes of replay are queued for a catching-up subscriber before waiting for its socket to drain.
  public var replayChunkBytes: Int
  /// Streams older than this (plus a random 0…`maxConnectionAgeJitter`) are ended so clients reconnect; nil: never.
  public var maxConnectionAge: Double?
  public var maxConnectionAgeJitter: Double

  public init(
    ring: ReplayRing.Limits = .init(maxEvents: 10_000, maxBytes: 64 << 20, maxAge: nil),
    maxPendingBytes: Int = 1 << 20,
    heartbeatInterval: Double = 15,
    retryMilliseconds: Int = 3000,
    replayChunkBytes: Int = 256 << 10, maxConnectionAge: Double? = nil, maxConnectionAgeJitter: Double = 0
  ) {
    self.maxConnectionAge = maxConnectionAge
    self.maxConnectionAgeJitter = maxConnectionAgeJitter
    self.ring = ring
    self.maxPendingBytes = maxPendingBytes
    self.heartbeatInterval = heartbeatInterval
    self.retryMilliseconds = retryMilliseconds
    self.replayChunkBytes = replayChunkBytes
  }
}

/// Counters the feed keeps; read them through `Feed.statistics()`.
public struct FeedStatistics: Sendable, Equatable {
  public var subscribersConnected = 0
  public var subscribersTotal = 0
  public var eventsPublished = 0
  public var eventsPublishedByStream: [String: Int] = [:]
  public var replayedEvents = 0
  public var resumes = 0
  public var resetsByReason: [String: Int] = [:]
  public var slowConsumerDisconnects = 0
  /// Streams ended by the maximum connection age.
  public var agedOut = 0
  /// Heartbeat comments written (idle streams only).
  public var heartbeatsSent = 0
  /// Streams ended because their grant ended by itself (a token expired).
  public var grantsEnded = 0
  /// Batches the store could not commit (never shown to anyone; the upstream loop retries them).
  public var storeFailures = 0
  public var bytesQueued = 0
  public var ringEvents = 0
  public var ringBytes = 0
  public var ringEvicted = 0
  public var headID: UInt64 = 0

  /// Adds another feed's counts (per-user relaying reports all accounts' feeds as one). Their events count under
  /// the stream name `accounts`: one label per account would make the metric's cardinality unbounded.
  public mutating func absorb(_ other: FeedStatistics) {
    subscribersConnected += other.subscribersConnected
    subscribersTotal += other.subscribersTotal
    eventsPublished += other.eventsPublished
    if other.eventsPublished > 0 { eventsPublishedByStream["accounts", default: 0] += other.eventsPublished }
    replayedEvents += other.replayedEvents
    resumes += other.resumes
    for (reason, count) in other.resetsByReason { resetsByReason[reason, default: 0] += count }
    slowConsumerDisconnects += other.slowConsumerDisconnects
    agedOut += other.agedOut
    heartbeatsSent += other.heartbeatsSent
    grantsEnded += other.grantsEnded
    storeFailures += other.storeFailures
    bytesQueued += other.bytesQueued
    ringEvents += other.ringEvents
    ringBytes += other.ringBytes
    ringEvicted += other.ringEvicted
  }
}
