import Foundation

/// What a lease owner (`FeedReplica`) needs of a store several nodes share (`sharedAcrossNodes`): a fenced lease
/// per feed, the feed's stored head and position, its events in chunks, and a way to follow what another node
/// commits. `RedisEventStore` is the one today; the replica never names it. Everything runs on the store's loop.
protocol SharedStore: EventStore {
  /// This process's name in leases.
  var nodeID: String { get }
  /// Who fills the feeds (`Configuration.sourceIdentity`); nil: not checked.
  var source: String? { get }
  /// The namespace of this deployment's feeds in the store (`store.redis_prefix`).
  var prefix: String { get }
  /// Whether the command connection is up, and the last error while it is not.
  var connection: (connected: Bool, error: String?) { get }
  /// Whether the connection that follows feeds is up.
  var readerConnected: Bool { get }
  /// Events per `read` at most: a shorter chunk is the end of the feed.
  var readChunk: Int { get }

  /// Takes the lease of `feed` when nobody holds it, or renews it when `token` holds it.
  func lease(feed: String, token: String?, milliseconds: Int, completion: @escaping (LeaseAnswer) -> Void)
  /// Lets commits of `feed` through with `token` (this node leads it), or stops them (nil).
  func setToken(_ token: String?, feed: String)
  /// Gives up `feed`'s lease if this node holds it.
  func release(feed: String)
  /// The stored head, floor, position and generation of `feed`.
  func meta(feed: String, completion: @escaping (Result<StoredFeed, StoreError>) -> Void)
  /// One chunk of `feed`'s events after `id`.
  func read(feed: String, after id: UInt64, completion: @escaping (Result<StoreChunk, StoreError>) -> Void)
  /// Tells `completion` of `feed`'s events after `id` once some are stored (or reading failed).
  func follow(feed: String, after id: UInt64, completion: @escaping (Result<StoreChunk, StoreError>) -> Void)
  /// `feed` is no longer followed here.
  func unfollow(feed: String)
  /// Calls `observer` whenever a connection comes up or goes down, until `unobserve(feed:)`.
  func observe(feed: String, _ observer: @escaping () -> Void)
  /// Calls `observer` when a commit of `feed` was refused because this node may not write it.
  func observeFencing(feed: String, _ observer: @escaping () -> Void)
  func unobserve(feed: String)
}

/// The answer to a lease request.
public enum LeaseAnswer: Sendable, Equatable {
  /// This node holds the lease with `token` (`fresh`: newly taken, not renewed).
  case held(token: String, fresh: Bool)
  /// Another node holds it (`repaired`: the lease had no expiry, and now has one).
  case heldBy(String, repaired: Bool = false)
  /// The feed was filled from another source than this node's: it must not be led, followed or served.
  case foreign(String)
  /// The store did not answer.
  case failed(String)
}

/// A chunk of a shared feed's entries as read while running: the Pollcast events, the entries that are not
/// (written by hand or by another tool, cut short, out of order), which are skipped and counted, never relayed,
/// and the highest entry id seen, so a reader goes on after it and a new leader above it.
struct StoreChunk {
  var events: [StoredEvent] = []
  var skipped: [String] = []
  var highest: UInt64?
  var count: Int { events.count + skipped.count }
}
