import CHiredis
import Foundation

/// Leases and reads, for `FeedReplica`, on the loop: taking and renewing a feed's lease, its meta, reading it in
/// chunks, and following it (`RedisFollowReads`).
extension RedisEventStore {
  /// Takes the lease of `feed` when nobody holds it, or renews it when `token` holds it.
  func lease(feed: String, token: String?, milliseconds: Int, completion: @escaping (LeaseAnswer) -> Void) {
    guard let command, command.isConnected else {
      completion(.failed(connection.error ?? "redis unreachable"))
      return
    }
    command.send(
      RedisEventStore.arguments([
        "EVAL", RedisEventStore.leaseScript, "3", key(feed, "lease"), key(feed, "epoch"), key(feed, "meta"),
        "\(nodeID)/\(instance)", String(milliseconds), token ?? "", source ?? "",
        String(UInt64.random(in: 1...UInt64.max), radix: 36),
      ])
    ) { reply in
      guard let elements = reply?.elements, elements.count == 2, case .integer(let code) = elements[0],
        let holder = elements[1].text
      else {
        completion(.failed(reply.map { "\($0)" } ?? "redis connection lost"))
        return
      }
      switch code {
      case 0: completion(.heldBy(holder))
      case 3: completion(.foreign(holder))
      case 4: completion(.heldBy(holder, repaired: true))
      default: completion(.held(token: holder, fresh: code == 2))
      }
    }
  }

  /// Lets commits of `feed` through with `token` (this node leads it), or stops them (nil).
  func setToken(_ token: String?, feed: String) { tokens[feed] = token }

  /// The stored head, floor and position of `feed`.
  func meta(feed: String, completion: @escaping (Result<StoredFeed, StoreError>) -> Void) {
    guard let command, command.isConnected else {
      completion(.failure(address.unavailable("redis unreachable")))
      return
    }
    command.send(RedisEventStore.arguments(["HMGET", key(feed, "meta")] + RedisEventStore.metaFields)) {
      [self] reply in
      guard let fields = reply?.elements, fields.count == RedisEventStore.metaFields.count else {
        completion(.failure(address.unavailable("redis: \(String(describing: reply))")))
        return
      }
      completion(Result { () throws(StoreError) in try parseMeta(fields, feed: feed) })
    }
  }

  /// One chunk of `feed`'s events after `id` (at most `chunk`), on the command connection.
  func read(feed: String, after id: UInt64, completion: @escaping (Result<StoreChunk, StoreError>) -> Void) {
    guard let command, command.isConnected else {
      completion(.failure(address.unavailable("redis unreachable")))
      return
    }
    command.send(
      RedisEventStore.arguments([
        "XRANGE", key(feed, "events"), "(\(id)-0", "+", "COUNT", String(RedisEventStore.chunk),
      ])
    ) { [self] reply in
      guard let reply else {
        completion(.failure(address.unavailable("redis connection lost")))
        return
      }
      completion(Result { () throws(StoreError) in try parseEntries(reply, skipping: true) })
    }
  }

  /// Waits (a blocking `XREAD` on the reader connection, shared by every feed followed: `RedisFollowReads`) for
  /// `feed`'s events after `id`, until some come or reading fails.
  func follow(feed: String, after id: UInt64, completion: @escaping (Result<StoreChunk, StoreError>) -> Void) {
    followReads.follow(feed: feed, after: id, completion: completion)
  }

  /// `feed` is no longer followed here (this node leads it now, or stopped serving it).
  func unfollow(feed: String) { followReads.unfollow(feed: feed) }

  static let chunk = 500
  static let blockSeconds = 1.0
}
