import CSQLite
import Foundation

/// `store.kind = sqlite`: the ring, the id high-water mark and the upstream cursors of every feed in one SQLite
/// file, in WAL mode.
///
/// - **One writer thread.** The connection is used only on `queue` (a serial dispatch queue): commits run there,
///   and their results go back to the loop through the completion, so no SQLite call ever blocks the loop.
///   `load` also runs there, once per feed at start, before the feed serves anyone.
/// - **One transaction per batch.** A batch's events, the cursors that produced them, the id high-water mark and
///   the trim of what the ring evicted commit together (`BEGIN IMMEDIATE` … `COMMIT`), or not at all.
/// - **`synchronous`.** `normal` (the default): a commit is written to the WAL (in the OS's page cache) before it
///   completes, so a process crash, `kill -9` included, loses nothing committed; a power loss or kernel crash can
///   lose the last commits before a checkpoint, but never leaves the file inconsistent (SQLite's WAL guarantee).
///   `full`: every commit also fsyncs the WAL, so it survives a power loss too, at the cost of one fsync per batch.
/// - **Bounded file.** Events the ring evicts (count, bytes, age, a detached stream) are deleted in the next
///   commit; SQLite reuses the freed pages, so the file stays near the ring's bounds. The WAL is checkpointed
///   every `checkpointPages` pages and truncated to `journal_size_limit`.
/// - **One process.** The file is opened in exclusive locking mode: a second relay on the same file gets a clear
///   error instead of interleaving its ids with ours.
public final class SQLiteEventStore: EventStore, @unchecked Sendable {
  public enum Synchronous: String, Sendable, CaseIterable {
    case normal, full
  }

  public let path: String
  public let synchronous: Synchronous
  public var kind: String { "sqlite" }
  public var isDurable: Bool { true }

  /// `PRAGMA application_id` of a Pollcast store ("PCST").
  static let applicationID: Int32 = 0x5043_5354
  static let schemaVersion: Int32 = 1
  static let checkpointPages = 1000

  let queue = DispatchQueue(label: "pollcast.store.writer")
  // Confined to `queue`.
  var db: OpaquePointer?
  var statements: [String: OpaquePointer] = [:]
  var feedIDs: [String: Int64] = [:]
  var floors: [String: UInt64] = [:]
  let stats = Locked(StoreStatistics(kind: "sqlite"))

  /// Opens (creating it when missing) and checks the store. A file that is not a Pollcast store, or that SQLite
  /// finds damaged, throws `.corrupt`; with `resetIfCorrupt` it is moved aside (`<path>.corrupt-<unix time>`, with
  /// its WAL) and an empty store is created in its place.
  ///
  /// - Parameters:
  ///   - source: who fills the store (`Configuration.sourceIdentity`: adapter and URL without secrets). Recorded
  ///     when the store is created; a store filled from another source throws `.sourceMismatch` naming both,
  ///     unless `resetOnSourceChange`, which moves it aside (`<path>.source-<unix time>`) like a corrupt file.
  ///     nil: not checked (tools and tests that open a store by itself).
  public static func open(
    path: String, synchronous: Synchronous = .normal, resetIfCorrupt: Bool = false, source: String? = nil,
    resetOnSourceChange: Bool = false, logger: Logger? = nil
  ) throws(StoreError) -> SQLiteEventStore {
    do {
      return try SQLiteEventStore(path: path, synchronous: synchronous, source: source)
    } catch
      where !((error.kind == .corrupt && resetIfCorrupt) || (error.kind == .sourceMismatch && resetOnSourceChange))
    {
      throw hinted(error)
    } catch  where (error.kind == .corrupt && resetIfCorrupt) || (error.kind == .sourceMismatch && resetOnSourceChange)
    {
      let why = error.kind == .corrupt ? "corrupt" : "source"
      let aside = "\(path).\(why)-\(Int(Date().timeIntervalSince1970))"
      for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
        guard rename(path + suffix, aside + suffix) == 0 else {
          throw StoreError(.unavailable, path: path, "cannot move the file aside to \(aside + suffix): errno \(errno)")
        }
      }
      logger?.error(
        error.kind == .corrupt
          ? "store file is corrupt: moved aside, starting with an empty store (store.reset_if_corrupt)"
          : "store file was filled from another source: moved aside, starting with an empty store"
            + " (store.reset_on_source_change)",
        metadata: ["path": path, "moved_to": aside, "error": error.message])
      return try SQLiteEventStore(path: path, synchronous: synchronous, source: source)
    }
  }

  private init(path: String, synchronous: Synchronous, source: String?) throws(StoreError) {
    self.path = path
    self.synchronous = synchronous
    let result: Result<Void, StoreError> = queue.sync {
      do throws(StoreError) {
        try openAndCheck()
        if let source { try bind(source: source) }
        return .success(())
      } catch {
        closeConnection()
        return .failure(error)
      }
    }
    try result.get()
  }

  deinit {
    let connection = db
    let prepared = statements
    for statement in prepared.values { sqlite3_finalize(statement) }
    if let connection { sqlite3_close_v2(connection) }
  }

  // MARK: Opening

  func openAndCheck() throws(StoreError) {
    // Only a file that is missing or empty is made a store: an SQLite file of another program is never adopted
    // (its application_id was overwritten), even one without tables yet.
    let fresh = fileSize(path) == 0
    var handle: OpaquePointer?
    let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
    let status = sqlite3_open_v2(path, &handle, flags, nil)
    db = handle
    guard status == SQLITE_OK else {
      throw StoreError(.unavailable, path: path, "cannot open: \(message(status))")
    }
    sqlite3_extended_result_codes(db, 1)
    // Before the first access: WAL then needs no shared-memory index, and the lock is held for good.
    try execute("PRAGMA locking_mode = EXCLUSIVE")
    // A file that is not SQLite fails here, at the first read of its header.
    let applicationID = try integer("PRAGMA application_id")
    let tables = try integer("SELECT count(*) FROM sqlite_schema")
    if (tables > 0 || !fresh) && applicationID != Int64(SQLiteEventStore.applicationID) {
      throw StoreError(
        .corrupt, path: path,
        "not a Pollcast store (application_id \(applicationID), \(tables) schema objects): a file of another program"
          + " is never adopted")
    }
    // Marked first, so a store that crashed before its schema was made is still recognised as ours.
    if fresh { try execute("PRAGMA application_id = \(SQLiteEventStore.applicationID)") }
    if tables > 0 {
      let version = try integer("PRAGMA user_version")
      guard version == Int64(SQLiteEventStore.schemaVersion) else {
        throw StoreError(
          .corrupt, path: path,
          "schema version \(version) is not \(SQLiteEventStore.schemaVersion) (written by another Pollcast version?)")
      }
    }
    let mode = try text("PRAGMA journal_mode = WAL")
    guard mode == "wal" else {
      throw StoreError(.unavailable, path: path, "cannot use WAL mode (journal_mode is \(mode ?? "unknown"))")
    }
    try execute("PRAGMA synchronous = \(synchronous == .full ? "FULL" : "NORMAL")")
    try execute("PRAGMA wal_autocheckpoint = \(SQLiteEventStore.checkpointPages)")
    try execute("PRAGMA journal_size_limit = \(16 << 20)")
    // Takes the exclusive lock now: a second process on this file fails here, not at its first commit.
    try execute("BEGIN IMMEDIATE")
    try execute("COMMIT")
    // integrity_check, not quick_check: quick_check does not compare indexes with their tables, and a file whose
    // events index misses a row opened, loaded without that row and lost what was committed above it (found by
    // the store fuzzer). On a 58 MB store both take ~30 ms.
    let check = try text("PRAGMA integrity_check")
    guard check == "ok" else {
      throw StoreError(.corrupt, path: path, "integrity check failed: \(check ?? "no answer")")
    }
    if tables == 0 { try createSchema() }
    // Added after schema version 1 shipped: stores made before it gain it here.
    try execute("CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    // The API's opaque cursor per stream (opaque-cursor recipes), added after version 1 too.
    if try integer("SELECT count(*) FROM pragma_table_info('cursors') WHERE name = 'token'") == 0 {
      try execute("ALTER TABLE cursors ADD COLUMN token TEXT")
    }
  }

  /// Records `source` in a new store, or checks that an existing store was filled from it.
  func bind(source: String) throws(StoreError) {
    if let stored = try metaValue("source") {
      guard stored == source else {
        throw StoreError(
          .sourceMismatch, path: path,
          "this store was filled from \(stored), but this relay is configured for \(source): its events, ids and"
            + " cursors belong to that API. Point store.path at another file, or set store.reset_on_source_change"
            + " (--store-reset-on-source-change true) to move this one aside and start empty")
      }
      return
    }
    try setMeta("source", source)
  }

  func metaValue(_ key: String) throws(StoreError) -> String? {
    let select = try statement("SELECT value FROM meta WHERE key = ?1")
    defer { sqlite3_reset(select) }
    sqlite3_bind_text(select, 1, key, -1, pollcast_sqlite_transient())
    return try step(select) ? columnText(select, 0) : nil
  }

  func setMeta(_ key: String, _ value: String) throws(StoreError) {
    let upsert = try statement("INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = ?2")
    defer { sqlite3_reset(upsert) }
    sqlite3_bind_text(upsert, 1, key, -1, pollcast_sqlite_transient())
    sqlite3_bind_text(upsert, 2, value, -1, pollcast_sqlite_transient())
    _ = try step(upsert)
  }

  func createSchema() throws(StoreError) {
    try execute("BEGIN IMMEDIATE")
    try execute(
      """
      CREATE TABLE feeds(id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, head_id INTEGER NOT NULL,
        floor_id INTEGER NOT NULL);
      CREATE TABLE events(feed INTEGER NOT NULL, id INTEGER NOT NULL, stream TEXT, upstream_id INTEGER,
        time REAL NOT NULL, bytes BLOB NOT NULL, PRIMARY KEY(feed, id));
      CREATE TABLE cursors(feed INTEGER NOT NULL, ord INTEGER NOT NULL, stream TEXT NOT NULL, cursor INTEGER NOT NULL,
        PRIMARY KEY(feed, ord));
      PRAGMA application_id = \(SQLiteEventStore.applicationID);
      PRAGMA user_version = \(SQLiteEventStore.schemaVersion);
      """)
    try execute("COMMIT")
  }

  func closeConnection() {
    for statement in statements.values { sqlite3_finalize(statement) }
    statements = [:]
    if let db { sqlite3_close_v2(db) }
    db = nil
  }

  // MARK: EventStore

  public func load(feed: String) throws(StoreError) -> StoredFeed? {
    let result: Result<StoredFeed?, StoreError> = queue.sync {
      do throws(StoreError) {
        return .success(try read(feed: feed))
      } catch {
        return .failure(error)
      }
    }
    do {
      return try result.get()
    } catch {
      throw SQLiteEventStore.hinted(error)
    }
  }

  public func load(feed: String, completion: @escaping @Sendable (Result<StoredFeed?, StoreError>) -> Void) {
    queue.async { [self] in
      do throws(StoreError) {
        completion(.success(try read(feed: feed)))
      } catch {
        completion(.failure(error))
      }
    }
  }

  public func drop(feed: String) {
    queue.async { [self] in
      guard db != nil, let feedID = try? feedRowID(feed) else { return }
      do throws(StoreError) {
        try execute("BEGIN IMMEDIATE")
        for sql in ["DELETE FROM events WHERE feed = ?1", "DELETE FROM cursors WHERE feed = ?1"] {
          let delete = try statement(sql)
          defer { sqlite3_reset(delete) }
          sqlite3_bind_int64(delete, 1, feedID)
          _ = try step(delete)
        }
        let forget = try statement("DELETE FROM meta WHERE key = ?1")
        defer { sqlite3_reset(forget) }
        sqlite3_bind_text(forget, 1, "unissued:\(feed)", -1, pollcast_sqlite_transient())
        _ = try step(forget)
        // The floor rises to the head: a resume into the dropped feed is too old, and its ids stay used.
        let raise = try statement("UPDATE feeds SET floor_id = head_id WHERE id = ?1")
        defer { sqlite3_reset(raise) }
        sqlite3_bind_int64(raise, 1, feedID)
        _ = try step(raise)
        try execute("COMMIT")
        floors[feed] = nil
      } catch {
        try? execute("ROLLBACK")
        stats.withLock { $0.commitFailures += 1 }
      }
    }
  }

  /// The row id of a stored feed, nil when it has none.
  func feedRowID(_ feed: String) throws(StoreError) -> Int64? {
    if let known = feedIDs[feed] { return known }
    let select = try statement("SELECT id FROM feeds WHERE name = ?1")
    defer { sqlite3_reset(select) }
    sqlite3_bind_text(select, 1, feed, -1, pollcast_sqlite_transient())
    guard try step(select) else { return nil }
    let id = sqlite3_column_int64(select, 0)
    feedIDs[feed] = id
    return id
  }

  public func commit(_ batch: StoreBatch, completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
    let queued = MonotonicClock.seconds()
    queue.async { [self] in
      let result: Result<Void, StoreError>
      do throws(StoreError) {
        try write(batch)
        result = .success(())
      } catch {
        result = .failure(error)
      }
      let elapsed = MonotonicClock.seconds() - queued
      stats.withLock { stats in
        switch result {
        case .success:
          stats.commits += 1
          stats.eventsWritten += batch.events.count
          stats.bytesWritten += batch.events.reduce(0) { $0 + $1.bytes.count }
          stats.commitSeconds.record(elapsed)
        case .failure:
          stats.commitFailures += 1
        }
      }
      completion(result)
    }
  }

  public func statistics() -> StoreStatistics {
    var snapshot = stats.withLock { $0 }
    snapshot.fileBytes = fileSize(path)
    snapshot.walBytes = fileSize(path + "-wal")
    return snapshot
  }

  public func close() {
    queue.sync {
      guard db != nil else { return }
      // Folds the WAL into the database so the file alone holds everything.
      try? execute("PRAGMA wal_checkpoint(TRUNCATE)")
      closeConnection()
    }
  }

  // MARK: Reading

  func read(feed: String) throws(StoreError) -> StoredFeed? {
    guard db != nil else { throw StoreError(.closed, path: path, "the store is closed") }
    let row = try statement("SELECT id, head_id, floor_id FROM feeds WHERE name = ?1")
    defer { sqlite3_reset(row) }
    sqlite3_bind_text(row, 1, feed, -1, pollcast_sqlite_transient())
    guard try step(row) else { return nil }
    let feedID = sqlite3_column_int64(row, 0)
    let head = UInt64(bitPattern: sqlite3_column_int64(row, 1))
    let floor = UInt64(bitPattern: sqlite3_column_int64(row, 2))
    try StoredFeed.checkHead(head, floor: floor, feed: feed, path: path)
    feedIDs[feed] = feedID
    floors[feed] = floor

    var events: [StoredEvent] = []
    let select = try statement(
      "SELECT id, stream, upstream_id, time, bytes FROM events WHERE feed = ?1 AND id > ?2 ORDER BY id")
    defer { sqlite3_reset(select) }
    sqlite3_bind_int64(select, 1, feedID)
    sqlite3_bind_int64(select, 2, Int64(bitPattern: floor))
    while try step(select) {
      let id = UInt64(bitPattern: sqlite3_column_int64(select, 0))
      let stream = sqlite3_column_type(select, 1) == SQLITE_NULL ? nil : columnText(select, 1)
      let upstreamID =
        sqlite3_column_type(select, 2) == SQLITE_NULL ? nil : UInt64(bitPattern: sqlite3_column_int64(select, 2))
      let time = sqlite3_column_double(select, 3)
      let count = Int(sqlite3_column_bytes(select, 4))
      var bytes = [UInt8](repeating: 0, count: count)
      if count > 0, let blob = sqlite3_column_blob(select, 4) {
        bytes.withUnsafeMutableBytes { $0.baseAddress!.copyMemory(from: blob, byteCount: count) }
      }
      guard id <= head, events.last.map({ id > $0.id }) ?? true, StoredEvent.isFrame(id: id, bytes) else {
        throw StoreError(.corrupt, path: path, "feed \(feed): stored event \(id) does not match its id or the head")
      }
      events.append(
        StoredEvent(id: id, stream: stream, upstreamID: upstreamID, unixTime: time, bytes: ByteSlice(bytes)))
    }

    var streams: [String] = []
    var cursors: [String: UInt64] = [:]
    var tokens: [String: String] = [:]
    let positions = try statement("SELECT stream, cursor, token FROM cursors WHERE feed = ?1 ORDER BY ord")
    defer { sqlite3_reset(positions) }
    sqlite3_bind_int64(positions, 1, feedID)
    while try step(positions) {
      let stream = columnText(positions, 0)
      streams.append(stream)
      cursors[stream] = UInt64(bitPattern: sqlite3_column_int64(positions, 1))
      if sqlite3_column_type(positions, 2) != SQLITE_NULL { tokens[stream] = columnText(positions, 2) }
    }
    var unissued: [ClosedRange<UInt64>] = []
    if let text = try metaValue("unissued:\(feed)") {
      guard let ranges = UnissuedRanges.decode(text) else {
        throw StoreError(.corrupt, path: path, "feed \(feed): the unissued id ranges are not readable")
      }
      unissued = ranges
    }
    return StoredFeed(
      headID: head, floorID: floor, events: events,
      position: streams.isEmpty ? nil : FeedPosition(streams: streams, cursors: cursors, tokens: tokens),
      unissued: unissued)
  }

  // MARK: Writing

  func write(_ batch: StoreBatch) throws(StoreError) {
    guard db != nil else { throw StoreError(.closed, path: path, "the store is closed") }
    try execute("BEGIN IMMEDIATE")
    do throws(StoreError) {
      let feedID = try feedRow(batch.feed, head: batch.headID, floor: batch.floorID)
      if !batch.events.isEmpty {
        let insert = try statement(
          "INSERT INTO events(feed, id, stream, upstream_id, time, bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
        for event in batch.events {
          defer { sqlite3_reset(insert) }
          sqlite3_bind_int64(insert, 1, feedID)
          sqlite3_bind_int64(insert, 2, Int64(bitPattern: event.id))
          if let stream = event.stream {
            sqlite3_bind_text(insert, 3, stream, -1, pollcast_sqlite_transient())
          } else {
            sqlite3_bind_null(insert, 3)
          }
          if let upstreamID = event.upstreamID {
            sqlite3_bind_int64(insert, 4, Int64(bitPattern: upstreamID))
          } else {
            sqlite3_bind_null(insert, 4)
          }
          sqlite3_bind_double(insert, 5, event.unixTime)
          // The block is immutable and outlives the statement's step: SQLite copies it into the page as it writes.
          let bytes = event.bytes
          sqlite3_bind_blob(insert, 6, bytes.block.base + bytes.offset, Int32(bytes.count), nil)
          _ = try step(insert)
        }
      }
      if let position = batch.position {
        let clear = try statement("DELETE FROM cursors WHERE feed = ?1")
        sqlite3_bind_int64(clear, 1, feedID)
        defer { sqlite3_reset(clear) }
        _ = try step(clear)
        let insert = try statement(
          "INSERT INTO cursors(feed, ord, stream, cursor, token) VALUES (?1, ?2, ?3, ?4, ?5)")
        for (order, stream) in position.streams.enumerated() {
          defer { sqlite3_reset(insert) }
          sqlite3_bind_int64(insert, 1, feedID)
          sqlite3_bind_int64(insert, 2, Int64(order))
          sqlite3_bind_text(insert, 3, stream, -1, pollcast_sqlite_transient())
          sqlite3_bind_int64(insert, 4, Int64(bitPattern: position.cursors[stream] ?? 0))
          if let token = position.tokens[stream] {
            sqlite3_bind_text(insert, 5, token, -1, pollcast_sqlite_transient())
          } else {
            sqlite3_bind_null(insert, 5)
          }
          _ = try step(insert)
        }
      }
      var trimmed = 0
      for stream in batch.forgetStreams {
        let forget = try statement("DELETE FROM events WHERE feed = ?1 AND stream = ?2")
        defer { sqlite3_reset(forget) }
        sqlite3_bind_int64(forget, 1, feedID)
        sqlite3_bind_text(forget, 2, stream, -1, pollcast_sqlite_transient())
        _ = try step(forget)
        trimmed += Int(sqlite3_changes(db))
      }
      if let unissued = batch.unissued { try setMeta("unissued:\(batch.feed)", UnissuedRanges.encode(unissued)) }
      if batch.floorID > floors[batch.feed] ?? 0 {
        // Incremental: each commit deletes only what the ring evicted since the previous one.
        let trim = try statement("DELETE FROM events WHERE feed = ?1 AND id <= ?2")
        defer { sqlite3_reset(trim) }
        sqlite3_bind_int64(trim, 1, feedID)
        sqlite3_bind_int64(trim, 2, Int64(bitPattern: batch.floorID))
        _ = try step(trim)
        trimmed += Int(sqlite3_changes(db))
      }
      try execute("COMMIT")
      floors[batch.feed] = max(floors[batch.feed] ?? 0, batch.floorID)
      if trimmed > 0 { stats.withLock { $0.eventsTrimmed += trimmed } }
    } catch {
      try? execute("ROLLBACK")
      throw error
    }
  }

  /// The feed's row id, its head and floor raised to the batch's (never lowered).
  func feedRow(_ feed: String, head: UInt64, floor: UInt64) throws(StoreError) -> Int64 {
    let upsert = try statement(
      """
      INSERT INTO feeds(name, head_id, floor_id) VALUES (?1, ?2, ?3)
      ON CONFLICT(name) DO UPDATE SET head_id = max(head_id, excluded.head_id),
        floor_id = max(floor_id, excluded.floor_id)
      """)
    defer { sqlite3_reset(upsert) }
    sqlite3_bind_text(upsert, 1, feed, -1, pollcast_sqlite_transient())
    sqlite3_bind_int64(upsert, 2, Int64(bitPattern: head))
    sqlite3_bind_int64(upsert, 3, Int64(bitPattern: floor))
    _ = try step(upsert)
    guard let id = try feedRowID(feed) else { throw StoreError(.write, path: path, "feed row \(feed) vanished") }
    return id
  }

}
