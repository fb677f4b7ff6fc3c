import Foundation

/// The followers' blocking reads on the reader connection: every feed this node follows (the shared feed, or
/// each account it serves without the account's lease) waits in **one** `XREAD BLOCK … STREAMS k1 k2 …`.
///
/// One connection runs one blocking command at a time, so a read per feed would queue: with 600 accounts
/// followed, the last would wait behind 599 blocks. Here a read names every feed waiting; when it returns, each
/// feed gets its entries (or none) and asks again, and the next read goes out once they all have. A feed that
/// starts following while a read blocks unblocks it (`CLIENT UNBLOCK`, once per read) so it waits at most a loop
/// turn, not `blockSeconds`.
///
/// Loop-confined (the store's loop), like the store's connections.
final class RedisFollowReads: @unchecked Sendable {  // loop-confined
  typealias Completion = (Result<RedisEventStore.EntryChunk, StoreError>) -> Void

  private unowned let store: RedisEventStore
  /// Feeds waiting for the next read: the id to read after, and who is told.
  private var waiting: [String: (after: UInt64, completion: Completion)] = [:]
  /// The feeds of the read in flight.
  private var inRead: [String: (after: UInt64, completion: Completion)] = [:]
  private var reading = false
  private var scheduled = false
  private var dispatching = false
  private var unblockSent = false
  /// The reader connection's `CLIENT ID` (asked on each connect), for `CLIENT UNBLOCK`.
  private var readerID: String?
  private(set) var reads = 0
  private(set) var unblocks = 0

  init(store: RedisEventStore) { self.store = store }

  /// Waits for `feed`'s events after `id`, at most `blockSeconds`: an empty chunk when none came meanwhile.
  func follow(feed: String, after id: UInt64, completion: @escaping Completion) {
    guard let reader = store.readerConnection, reader.isConnected else {
      completion(.failure(store.address.unavailable("redis unreachable")))
      return
    }
    if let replaced = waiting.updateValue((id, completion), forKey: feed) {
      replaced.completion(.success(RedisEventStore.EntryChunk()))
    }
    if reading {
      if inRead[feed] == nil { unblock() }
    } else if !dispatching && !scheduled {
      // Every feed that asks in this loop turn goes into the same read.
      scheduled = true
      store.loop?.execute { [weak self] in
        self?.scheduled = false
        self?.issue()
      }
    }
  }

  /// The reader connection came up: learn its id (asked before any read on it, so answered first).
  func readerConnected(_ reader: RedisConnection) {
    readerID = nil
    reader.send(RedisEventStore.arguments(["CLIENT", "ID"])) { [weak self] reply in
      if case .integer(let id)? = reply { self?.readerID = String(id) }
    }
  }

  private func unblock() {
    guard !unblockSent, let readerID, let command = store.commandConnection, command.isConnected else { return }
    unblockSent = true
    unblocks += 1
    command.send(RedisEventStore.arguments(["CLIENT", "UNBLOCK", readerID])) { _ in }
  }

  private func issue() {
    guard !reading, !waiting.isEmpty else { return }
    guard let reader = store.readerConnection, reader.isConnected else {
      let failed = waiting
      waiting = [:]
      for (_, entry) in failed { entry.completion(.failure(store.address.unavailable("redis unreachable"))) }
      return
    }
    inRead = waiting
    waiting = [:]
    reading = true
    unblockSent = false
    reads += 1
    let feeds = Array(inRead.keys)
    var arguments = [
      "XREAD", "COUNT", String(RedisEventStore.chunk), "BLOCK", String(Int(RedisEventStore.blockSeconds * 1000)),
      "STREAMS",
    ]
    arguments += feeds.map { store.key($0, "events") }
    arguments += feeds.map { "\(inRead[$0]!.after)-0" }
    reader.send(RedisEventStore.arguments(arguments)) { [weak self] reply in
      self?.answered(reply, feeds: feeds)
    }
  }

  private func answered(_ reply: RedisReply?, feeds: [String]) {
    let asked = inRead
    inRead = [:]
    reading = false
    var results: [String: Result<RedisEventStore.EntryChunk, StoreError>] = [:]
    switch reply {
    case nil:
      let lost = store.address.unavailable("redis connection lost")
      for feed in feeds { results[feed] = .failure(lost) }
    case .null?:
      break  // the block ran out (or was unblocked): nothing new for anyone
    case .error(let message)?:
      let error = store.address.unavailable("XREAD refused: \(message)")
      for feed in feeds { results[feed] = .failure(error) }
    case let reply?:
      // [[key, [entries…]], …]: only the streams that have entries.
      let names = Dictionary(uniqueKeysWithValues: feeds.map { (store.key($0, "events"), $0) })
      for stream in reply.elements ?? [] {
        guard let parts = stream.elements, parts.count == 2, let name = parts[0].text, let feed = names[name]
        else { continue }
        results[feed] = Result { () throws(StoreError) in try store.parseEntries(parts[1], skipping: true) }
      }
      if reply.elements == nil {
        let error = StoreError(
          .corrupt, path: store.address.description, "unexpected XREAD reply \(String(describing: reply).prefix(200))")
        for feed in feeds { results[feed] = .failure(error) }
      }
    }
    // Each feed asks again from its completion: those asks join the next read, sent once all were told.
    dispatching = true
    for feed in feeds {
      asked[feed]?.completion(results[feed] ?? .success(RedisEventStore.EntryChunk()))
    }
    dispatching = false
    issue()
  }
}
