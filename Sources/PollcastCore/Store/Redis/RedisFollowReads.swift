import Foundation

/// The followers' blocking reads on the reader connection: every feed this node follows (the shared feed, or
/// each account it serves without the account's lease) waits in **one** `XREAD BLOCK … STREAMS k1 k2 …`.
///
/// One connection runs one blocking command at a time, so a read per feed would queue: with 600 accounts
/// followed, the last would wait behind 599 blocks. Here a feed registers once (`follow`) and stays in every read
/// until entries come for it (it is told, and registers again from the next id) or it leaves (`unfollow`: its
/// node took the lease, or stopped serving it). A reply wakes only the feeds it has entries for: waking every
/// feed on every reply cost a completion per followed feed per message. A feed that registers while a read
/// blocks unblocks it (`CLIENT UNBLOCK`, once per read) so it joins within a loop turn, not `blockSeconds`.
///
/// Loop-confined (the store's loop), like the store's connections.
final class RedisFollowReads: @unchecked Sendable {  // loop-confined
  typealias Completion = (Result<StoreChunk, StoreError>) -> Void

  private struct Registration {
    var after: UInt64
    /// The stream's key, encoded once.
    var key: [UInt8]
    var completion: Completion
  }

  private unowned let store: RedisEventStore
  private var registered: [String: Registration] = [:]
  /// The feeds named by the read in flight (nil: none in flight), by stream key, with the id each was read after.
  private var inRead: [[UInt8]: (feed: String, after: UInt64)]?
  private var scheduled = false
  private var dispatching = false
  private var unblockSent = false
  /// The reader connection's `CLIENT ID` (asked on each connect), for `CLIENT UNBLOCK`.
  private var readerID: String?

  init(store: RedisEventStore) { self.store = store }

  /// Tells `completion` of `feed`'s events after `id`, once some are in the stream (or the read failed).
  func follow(feed: String, after id: UInt64, completion: @escaping Completion) {
    guard let reader = store.reader, reader.isConnected else {
      completion(.failure(store.address.unavailable("redis unreachable")))
      return
    }
    let key = registered[feed]?.key ?? Array(store.key(feed, "events").utf8)
    registered[feed] = Registration(after: id, key: key, completion: completion)
    if let inRead {
      if inRead[key]?.after != id { unblock() }
    } else if !dispatching && !scheduled {
      // Every feed that registers in this loop turn goes into the same read.
      scheduled = true
      store.loop?.execute { [weak self] in
        self?.scheduled = false
        self?.issue()
      }
    }
  }

  /// `feed` is no longer followed: it leaves the next read (an answer of the read in flight is dropped).
  func unfollow(feed: String) { registered[feed] = nil }

  /// The reader connection came up: learn its id (asked before any read on it, so answered first).
  func readerConnected(_ reader: RedisConnection) {
    readerID = nil
    reader.send(RedisEventStore.arguments(["CLIENT", "ID"])) { [weak self] reply in
      if case .integer(let id)? = reply { self?.readerID = String(id) }
    }
  }

  private func unblock() {
    guard !unblockSent, let readerID, let command = store.command, command.isConnected else { return }
    unblockSent = true
    command.send(RedisEventStore.arguments(["CLIENT", "UNBLOCK", readerID])) { _ in }
  }

  private func issue() {
    guard inRead == nil, !registered.isEmpty else { return }
    guard let reader = store.reader, reader.isConnected else { return fail("redis unreachable") }
    var named: [[UInt8]: (feed: String, after: UInt64)] = [:]
    named.reserveCapacity(registered.count)
    var keys: [[UInt8]] = []
    var ids: [[UInt8]] = []
    keys.reserveCapacity(registered.count)
    ids.reserveCapacity(registered.count)
    for (feed, registration) in registered {
      named[registration.key] = (feed, registration.after)
      keys.append(registration.key)
      ids.append(Array("\(registration.after)-0".utf8))
    }
    inRead = named
    unblockSent = false
    let head = RedisEventStore.arguments([
      "XREAD", "COUNT", String(RedisEventStore.chunk), "BLOCK", String(Int(RedisEventStore.blockSeconds * 1000)),
      "STREAMS",
    ])
    reader.send(head + keys + ids) { [weak self] reply in self?.answered(reply) }
  }

  /// Tells every registered feed that reading failed; each registers again once the connection is back.
  private func fail(_ why: String) {
    let failed = registered
    registered = [:]
    let error = store.address.unavailable(why)
    for (_, registration) in failed { registration.completion(.failure(error)) }
  }

  private func answered(_ reply: RedisReply?) {
    guard let named = inRead else { return }
    inRead = nil
    var woken: [(Registration, Result<StoreChunk, StoreError>)] = []
    switch reply {
    case nil:
      fail("redis connection lost")
    case .null?:
      break  // the block ran out (or was unblocked): everyone stays registered
    case .error(let message)?:
      fail("XREAD refused: \(message)")
    case let reply?:
      // [[key, [entries…]], …]: only the streams that have entries.
      guard let streams = reply.elements else {
        fail("unexpected XREAD reply \(String(describing: reply).prefix(200))")
        break
      }
      for stream in streams {
        guard let parts = stream.elements, parts.count == 2, case .string(let key) = parts[0],
          let (feed, after) = named[key], let registration = registered[feed], registration.after == after
        else { continue }
        registered[feed] = nil
        woken.append(
          (registration, Result { () throws(StoreError) in try store.parseEntries(parts[1], skipping: true) }))
      }
    }
    // Each woken feed registers again from its completion: those join the next read, sent once all were told.
    dispatching = true
    for (registration, result) in woken { registration.completion(result) }
    dispatching = false
    issue()
  }
}
