import Foundation

/// Where a feed's events, ids and upstream cursors live: the one seam between the feed and its storage.
///
/// The feed keeps its replay ring in memory in every case (fan-out and replay read only memory, so no store call
/// ever runs on the loop while clients wait). A store adds what survives a restart: every batch the feed
/// publishes is committed, with the upstream position that produced it, in one atomic step *before* any
/// subscriber sees it, and the feed is rebuilt from `load` at the next start.
///
/// - `MemoryEventStore`: nothing survives (the default); commits complete at once.
/// - `SQLiteEventStore`: one SQLite file in WAL mode, written by its own thread.
/// - `RedisEventStore`: one Redis Stream per feed, shared by several relays; one of them (the lease holder)
///   commits, the others follow the stream (`FeedReplica`).
public protocol EventStore: AnyObject, Sendable {
  /// `memory`, `sqlite`: for logs and metrics.
  var kind: String { get }
  /// Whether `commit` does any work: the feed skips the round trip for a store that keeps nothing.
  var isDurable: Bool { get }
  /// What is stored for `feed`, nil when nothing is. Called before the feed serves anyone.
  func load(feed: String) throws(StoreError) -> StoredFeed?
  /// Commits `batch` atomically and calls `completion` (on any thread) once it is durable, or with the error that
  /// left the store as it was before the batch. Batches are committed in the order they are given.
  func commit(_ batch: StoreBatch, completion: @escaping @Sendable (Result<Void, StoreError>) -> Void)
  /// `load(feed:)` off the caller's thread (the writer's), for a feed that starts while the relay serves (an
  /// account's, in per-user relaying): `completion` runs on any thread.
  func load(feed: String, completion: @escaping @Sendable (Result<StoredFeed?, StoreError>) -> Void)
  /// Drops a feed's events and cursors (an evicted account's), after the commits already given. Its id
  /// high-water mark stays, so ids are never reused if the feed starts again.
  func drop(feed: String)
  /// Counters for `/metrics`.
  func statistics() -> StoreStatistics
  /// Waits for the commits already given and closes the store. Later commits fail.
  func close()
  /// The secret that keys the names of accounts without a user id (`AccountKeys`): created once and kept with the
  /// store, so such an account finds its stored feed after a restart. Nil for a store that keeps nothing.
  func accountKeySecret() throws(StoreError) -> [UInt8]?

  // Capabilities: the relay asks these, never which store it has.

  /// Several relays read and write it: a node shows what the store holds and issues ids only while it owns the
  /// feed (above the stored head), and the store closes (releasing leases) before the streams end.
  var sharedAcrossNodes: Bool { get }
  /// Connects to `loop` (called once, on the loop, before anything is committed or followed).
  func attach(to loop: EventLoop)
  /// Who polls `feed`'s upstream with `worker`: this node (`LocalOwner`), or whichever node holds its lease.
  func owner(of feed: Feed, worker: UpstreamWorker?, leaseSeconds: Double, logger: Logger, restored: StoredFeed?)
    -> any FeedOwner
}

extension EventStore {
  public func accountKeySecret() throws(StoreError) -> [UInt8]? { nil }
  public var sharedAcrossNodes: Bool { false }
  public func attach(to loop: EventLoop) {}
  public func owner(
    of feed: Feed, worker: UpstreamWorker?, leaseSeconds: Double, logger: Logger, restored: StoredFeed?
  ) -> any FeedOwner {
    LocalOwner(worker: worker)
  }
}

/// Where the upstream loop stands: the streams it polls and the cursor of each (the newest upstream id whose
/// message is stored). Restored at start, so polling goes on from there.
///
/// The one position type: the worker's (`UpstreamWorker.Position`) is this, with `recent` filled in memory.
public struct FeedPosition: Sendable, Equatable {
  public var streams: [String]
  public var cursors: [String: UInt64]
  /// Per stream, the API's own opaque cursor (a recipe with `cursor.type` opaque: CouchDB's `last_seq`, nchan's
  /// `Last-Modified` + `Etag`); `cursors` then counts the stream's relayed events.
  public var tokens: [String: String] = [:]
  /// The ids relayed lately per stream (in memory only, never stored: rebuilt from the stored events): an
  /// upstream that resends its last page after a restart is then recognised as resending (dropped), not as ids
  /// going backwards (relayed again).
  var recent: [String: RecentIDs] = [:]
  /// The dedupe keys stored lately per stream (opaque-cursor recipes; in memory only, rebuilt from the stored
  /// events' messages): an API that redelivers right after a restart is not relayed twice.
  var recentKeys: [String: RecentKeys] = [:]

  public init(streams: [String], cursors: [String: UInt64], tokens: [String: String] = [:]) {
    self.streams = streams
    self.cursors = cursors
    self.tokens = tokens
  }

  /// Equal when they stand at the same place (what is stored); `recent` is a memory of it.
  public static func == (lhs: FeedPosition, rhs: FeedPosition) -> Bool {
    lhs.streams == rhs.streams && lhs.cursors == rhs.cursors && lhs.tokens == rhs.tokens
  }
}

/// One event as stored: its SSE id, its stream and upstream id (to tell resends after a restart), when it was
/// published (Unix seconds, for the age bound) and its encoded SSE bytes.
public struct StoredEvent: Sendable {
  public var id: UInt64
  public var stream: String?
  public var upstreamID: UInt64?
  public var unixTime: Double
  public var bytes: ByteSlice
  /// The SSE event type (nil: `message`); followers act on `stream-detached` (kept by `store.kind = redis`).
  public var type: String?

  public init(
    id: UInt64, stream: String?, upstreamID: UInt64?, unixTime: Double, bytes: ByteSlice, type: String? = nil
  ) {
    self.id = id
    self.stream = stream
    self.upstreamID = upstreamID
    self.unixTime = unixTime
    self.bytes = bytes
    self.type = type
  }
}

extension StoredEvent {
  /// Whether stored bytes are one whole SSE frame of event `id`: its `id:` line (after an `event:` line, for typed
  /// events) names `id`, and it ends with the blank line that ends an event. A row or stream entry that fails this
  /// is damage or was not written by a relay, and is never replayed (every store checks what it reads back).
  public static func isFrame(id: UInt64, _ bytes: [UInt8]) -> Bool {
    guard bytes.count >= 2, bytes[bytes.count - 2] == 0x0A, bytes[bytes.count - 1] == 0x0A else { return false }
    let line = Array("id: \(id)\n".utf8)
    if bytes.starts(with: line) { return true }
    guard bytes.starts(with: Array("event: ".utf8)), let end = bytes.firstIndex(of: 0x0A) else { return false }
    return bytes[(end + 1)...].starts(with: line)
  }
}

/// What one atomic commit writes.
public struct StoreBatch: Sendable {
  public var feed: String
  public var events: [StoredEvent]
  /// The upstream position after these events (nil: unchanged).
  public var position: FeedPosition?
  /// The highest id handed out so far: the next start hands out ids above it.
  public var headID: UInt64
  /// Every event at or below this id was evicted from the ring: the store drops them too.
  public var floorID: UInt64
  /// Streams whose events the ring dropped (a detached stream must not be replayed).
  public var forgetStreams: [String]
  /// Id ranges this store never issued (nil: unchanged), kept so a resume into one gets `reset`.
  public var unissued: [ClosedRange<UInt64>]?

  public init(
    feed: String, events: [StoredEvent], position: FeedPosition?, headID: UInt64, floorID: UInt64,
    forgetStreams: [String] = [], unissued: [ClosedRange<UInt64>]? = nil
  ) {
    self.feed = feed
    self.events = events
    self.position = position
    self.headID = headID
    self.floorID = floorID
    self.forgetStreams = forgetStreams
    self.unissued = unissued
  }
}

/// Id ranges a feed never issued: between a stored head and the first id of the next run (a store restored from
/// a backup, swapped, or taken over after a clock jump). A client resuming with such an id was served by another
/// generation of the store, so the feed answers it with `reset` instead of replaying from there.
public enum UnissuedRanges {
  /// How many ranges a feed keeps (the oldest go first; ranges below the ring's floor are dropped anyway).
  public static let limit = 32

  /// `a-b,c-d`, as stored.
  public static func encode(_ ranges: [ClosedRange<UInt64>]) -> String {
    ranges.map { "\($0.lowerBound)-\($0.upperBound)" }.joined(separator: ",")
  }

  /// The stored text back; nil when it is not `a-b,…` with a ≤ b.
  public static func decode(_ text: String) -> [ClosedRange<UInt64>]? {
    if text.isEmpty { return [] }
    var ranges: [ClosedRange<UInt64>] = []
    for part in text.split(separator: ",", omittingEmptySubsequences: false) {
      let bounds = part.split(separator: "-", omittingEmptySubsequences: false)
      guard bounds.count == 2, let low = UInt64(bounds[0]), let high = UInt64(bounds[1]), low <= high else {
        return nil
      }
      ranges.append(low...high)
    }
    return ranges
  }
}

/// A feed as it was stored: the id high-water mark, the eviction floor, the retained events (ascending ids) and
/// the upstream position.
public struct StoredFeed: Sendable {
  public var headID: UInt64
  public var floorID: UInt64
  public var events: [StoredEvent]
  public var position: FeedPosition?
  /// Id ranges the store never issued (`UnissuedRanges`).
  public var unissued: [ClosedRange<UInt64>]
  /// `store.kind = redis`: the random generation of the feed's data, made when its lease is first taken. Another
  /// generation than the one a node knew means the store lost the feed (Redis restarted empty).
  public var generation: String?

  public init(
    headID: UInt64, floorID: UInt64, events: [StoredEvent], position: FeedPosition?,
    unissued: [ClosedRange<UInt64>] = [], generation: String? = nil
  ) {
    self.headID = headID
    self.floorID = floorID
    self.events = events
    self.position = position
    self.unissued = unissued
    self.generation = generation
  }

  /// Ids are clock-seeded microseconds (about 2^51 today): a stored head above 2^63 is damage, and would leave the
  /// id allocator no room (it used to crash the relay at start).
  public static let maxHeadID: UInt64 = 1 << 63

  /// Throws `.corrupt` when the stored head is beyond any id the relay hands out, or the floor (every id at or
  /// below it is gone) is above the head: a relay restored from such a feed would hide what it commits next (the
  /// store fuzzer found a file where a commit above the head was never read back).
  public static func checkHead(_ head: UInt64, floor: UInt64, feed: String, path: String) throws(StoreError) {
    guard head <= maxHeadID else {
      throw StoreError(
        .corrupt, path: path,
        "feed \(feed): the stored head id \(head) is beyond any id the relay issues (at most 2^63): damaged store")
    }
    guard floor <= head else {
      throw StoreError(
        .corrupt, path: path, "feed \(feed): the stored floor id \(floor) is above the head id \(head): damaged store")
    }
  }
}

public struct StoreStatistics: Sendable {
  public var kind = "memory"
  public var commits = 0
  public var commitFailures = 0
  public var eventsWritten = 0
  public var bytesWritten = 0
  public var eventsTrimmed = 0
  public var checkpoints = 0
  /// Seconds from handing a batch to the writer until it is durable (queueing included).
  public var commitSeconds = Histogram(bounds: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1])
  /// Bytes of the database and WAL files at the last checkpoint.
  public var fileBytes = 0
  public var walBytes = 0
  /// `store.kind = redis`: this node's role for the shared feed and what following and leading cost.
  public var role: String?
  public var connected: Bool?
  public var replication: FeedReplica.Statistics?
  /// `store.kind = redis`: stream entries skipped while reading because no relay wrote them (nil: a store that
  /// cannot hold entries no relay wrote).
  public var foreignEntries: Int?

  public init(kind: String = "memory") { self.kind = kind }
}

/// A store that cannot be opened, read or written.
public struct StoreError: Error, CustomStringConvertible, Sendable, Equatable {
  public enum Kind: String, Sendable {
    /// The file is not a Pollcast store, or SQLite found it damaged.
    case corrupt
    /// It cannot be opened or read (permissions, missing directory, another process holds it).
    case unavailable
    /// A write failed (disk full, I/O error): the batch was not committed.
    case write
    case closed
    /// `store.kind = redis`: this node does not hold the feed's lease (any more), so it may not write.
    case fenced
    /// The store was filled from another upstream source (adapter, URL) than this relay's configuration names.
    case sourceMismatch = "source_mismatch"
  }

  public var kind: Kind
  public var path: String
  public var message: String
  /// What the operator can do about it, in the store's own terms (printed under the error at start).
  public var hint: String?

  public init(_ kind: Kind, path: String, _ message: String, hint: String? = nil) {
    self.kind = kind
    self.path = path
    self.message = message
    self.hint = hint
  }

  public var description: String { "store \(path): \(message)" }
}

/// `store.kind = memory`: nothing survives a restart. Commits complete at once, so the feed skips them.
public final class MemoryEventStore: EventStore {
  public init() {}
  public var kind: String { "memory" }
  public var isDurable: Bool { false }
  public func load(feed: String) throws(StoreError) -> StoredFeed? { nil }
  public func load(feed: String, completion: @escaping @Sendable (Result<StoredFeed?, StoreError>) -> Void) {
    completion(.success(nil))
  }
  public func drop(feed: String) {}
  public func commit(_ batch: StoreBatch, completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
    completion(.success(()))
  }
  public func statistics() -> StoreStatistics { StoreStatistics(kind: "memory") }
  public func close() {}
}
