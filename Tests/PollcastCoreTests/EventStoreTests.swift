import CSQLite
import Foundation
import Testing

@testable import PollcastCore

/// The SQLite store on its own: what a commit writes is what a later open loads, trims follow the ring's floor,
/// and a damaged, foreign or busy file is a clear error (never an empty start).
@Suite struct SQLiteEventStoreTests {
  let directory: URL

  init() throws {
    directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-store-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
  }

  var path: String { directory.appendingPathComponent("pollcast.db").path }

  private func event(_ id: UInt64, stream: String? = "101", upstream: UInt64? = nil, type: String? = nil)
    -> StoredEvent
  {
    let bytes = SSEEncoder.event(id: id, type: type, data: "{\"n\":\(id)}")
    return StoredEvent(id: id, stream: stream, upstreamID: upstream, unixTime: 1_000, bytes: ByteSlice(bytes))
  }

  private func commit(_ store: SQLiteEventStore, _ batch: StoreBatch) throws {
    let done = Locked<Result<Void, StoreError>?>(nil)
    let semaphore = DispatchSemaphore(value: 0)
    store.commit(batch) { result in
      done.withLock { $0 = result }
      semaphore.signal()
    }
    semaphore.wait()
    try done.withLock { $0! }.get()
  }

  /// A file whose events index misses a row passes `quick_check` but not `integrity_check`: it is refused as
  /// corrupt, never loaded without that row (the store fuzzer's find, kept as a seed).
  @Test func aFileWhoseIndexMissesARowIsRefusedAsCorrupt() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let seed = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
      "../../Fuzz/corpus/store/index-missing-a-row")
    try FileManager.default.copyItem(at: seed, to: URL(fileURLWithPath: path))
    do {
      _ = try SQLiteEventStore.open(path: path)
      Issue.record("a damaged file opened")
    } catch {
      #expect(error.kind == .corrupt)
      #expect(error.description.contains("missing from index"), "\(error)")
    }
  }

  /// Accounts without a user id are named by HMAC-SHA256 of their key: the secret is made once and kept, so the
  /// same key names the same account after a reopen; another store's secret names it differently.
  @Test func theAccountKeySecretIsMadeOnceAndKept() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let first = try SQLiteEventStore.open(path: path)
    let secret = try #require(try first.accountKeySecret())
    #expect(secret.count == 32)
    #expect(try first.accountKeySecret() == secret)
    first.close()
    let reopened = try SQLiteEventStore.open(path: path)
    #expect(try reopened.accountKeySecret() == secret)
    reopened.close()
    let keys = AccountKeys(secret: secret)
    let name = keys.key(for: "key-1000")
    #expect(name.hasPrefix("credential:") && name.count == "credential:".count + 32)
    #expect(keys.key(for: "key-1000") == name && keys.key(for: "key-1001") != name)
    #expect(AccountKeys(secret: AccountKeys.freshSecret()).key(for: "key-1000") != name)
    #expect(try MemoryEventStore().accountKeySecret() == nil)
    // RFC 4231 test case 2: HMAC-SHA256("Jefe", "what do ya want for nothing?"), first 16 bytes.
    #expect(
      AccountKeys(secret: Array("Jefe".utf8)).key(for: "what do ya want for nothing?")
        == "credential:5bdcc146bf60754e6a042426089575c7")
  }

  @Test func aCommitIsLoadedBackWithItsCursorsAndHead() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    do {
      let store = try SQLiteEventStore.open(path: path)
      #expect(try store.load(feed: "shared") == nil)
      let position = FeedPosition(streams: ["101", "202"], cursors: ["101": 7, "202": UInt64.max])
      try commit(
        store,
        StoreBatch(
          feed: "shared",
          events: [event(10, upstream: 6), event(11, upstream: 7), event(12, stream: nil, type: "stream-attached")],
          position: position, headID: 12, floorID: 9))
      store.close()
    }
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    let loaded = try #require(try store.load(feed: "shared"))
    #expect(loaded.headID == 12)
    #expect(loaded.floorID == 9)
    #expect(loaded.events.map(\.id) == [10, 11, 12])
    #expect(loaded.events.map(\.upstreamID) == [6, 7, nil])
    #expect(loaded.events.map(\.stream) == ["101", "101", nil])
    #expect(loaded.position == FeedPosition(streams: ["101", "202"], cursors: ["101": 7, "202": UInt64.max]))
    let bytes = loaded.events[0].bytes
    #expect(
      Array(UnsafeRawBufferPointer(start: bytes.block.base + bytes.offset, count: bytes.count))
        == SSEEncoder.event(id: 10, type: nil, data: "{\"n\":10}"))
    #expect(try store.load(feed: "other") == nil)
    // A typed event (the relay's stream notices) keeps its `event:` line before its id.
    let notice = loaded.events[2].bytes
    #expect(
      Array(UnsafeRawBufferPointer(start: notice.block.base + notice.offset, count: notice.count))
        == SSEEncoder.event(id: 12, type: "stream-attached", data: "{\"n\":12}"))
  }

  @Test func storedBytesMustNameTheirOwnID() {
    #expect(StoredEvent.isFrame(id: 7, Array("id: 7\ndata: x\n\n".utf8)))
    #expect(StoredEvent.isFrame(id: 7, Array("event: stream-attached\nid: 7\ndata: x\n\n".utf8)))
    #expect(!StoredEvent.isFrame(id: 7, Array("id: 8\ndata: x\n\n".utf8)))
    #expect(!StoredEvent.isFrame(id: 7, Array("id: 70\ndata: x\n\n".utf8)))
    #expect(!StoredEvent.isFrame(id: 7, Array("event: x\ndata: id: 7\n\n".utf8)))
    // A frame cut short (no blank line at its end) would run into the next event on the wire.
    #expect(!StoredEvent.isFrame(id: 7, Array("id: 7\ndata: x\n".utf8)))
    #expect(!StoredEvent.isFrame(id: 7, Array("id: 7\ndata: x".utf8)))
    #expect(!StoredEvent.isFrame(id: 7, []))
  }

  @Test func theFloorAndForgottenStreamsTrimTheFileAndTheHeadNeverGoesDown() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    try commit(
      store,
      StoreBatch(
        feed: "shared", events: (1...100).map { event($0, stream: $0 % 2 == 0 ? "a" : "b") }, position: nil,
        headID: 100, floorID: 0))
    try commit(
      store, StoreBatch(feed: "shared", events: [], position: nil, headID: 50, floorID: 60, forgetStreams: ["a"]))
    let loaded = try #require(try store.load(feed: "shared"))
    #expect(loaded.headID == 100)
    #expect(loaded.floorID == 60)
    #expect(loaded.events.map(\.id) == Array(stride(from: UInt64(61), through: 99, by: 2)))
    #expect(store.statistics().eventsTrimmed == 80)
    #expect(store.statistics().commits == 2)
  }

  /// 3,000 commits of one 2 KB event each, the ring keeping the newest 100: the trims keep the file near the
  /// ring's size (SQLite reuses freed pages) instead of growing with everything ever written.
  @Test func theFileStaysNearTheRingsSizeUnderSteadyTrims() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try SQLiteEventStore.open(path: path)
    let payload = String(repeating: "x", count: 2000)
    for id in UInt64(1)...3000 {
      let bytes = ByteSlice(SSEEncoder.event(id: id, type: nil, data: payload))
      let event = StoredEvent(id: id, stream: "s", upstreamID: id, unixTime: 0, bytes: bytes)
      try commit(
        store,
        StoreBatch(
          feed: "shared", events: [event], position: FeedPosition(streams: ["s"], cursors: ["s": id]), headID: id,
          floorID: id > 100 ? id - 100 : 0))
    }
    let stats = store.statistics()
    store.close()
    #expect(stats.eventsWritten == 3000)
    #expect(stats.eventsTrimmed == 2900)
    // 100 events of 2 KB are 200 KB; everything written is 6 MB. Allow room for the b-tree and free pages.
    #expect(stats.fileBytes < 1_500_000, "database file \(stats.fileBytes) bytes")
    // Checkpointed every 1,000 pages (4 MB), so the WAL restarts from its beginning instead of growing.
    #expect(stats.walBytes < 5_000_000, "WAL \(stats.walBytes) bytes")
    let reopened = try SQLiteEventStore.open(path: path)
    defer { reopened.close() }
    let loaded = try #require(try reopened.load(feed: "shared"))
    #expect(loaded.events.map(\.id) == Array(2901...3000))
    #expect(loaded.position?.cursors == ["s": 3000])
  }

  /// An evicted account's feed: events and cursors go, the head stays (its ids are never handed out again) and
  /// the floor rises to it (a resume into it is too old). Other feeds are untouched.
  @Test func aDroppedFeedKeepsOnlyItsHead() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    for feed in ["account:user:1", "account:user:2"] {
      try commit(
        store,
        StoreBatch(
          feed: feed, events: [event(5), event(6)], position: FeedPosition(streams: ["101"], cursors: ["101": 2]),
          headID: 6, floorID: 4))
    }
    store.drop(feed: "account:user:1")
    let loaded = Locked<Result<StoredFeed?, StoreError>?>(nil)
    let done = DispatchSemaphore(value: 0)
    store.load(feed: "account:user:1") { result in
      loaded.withLock { $0 = result }
      done.signal()
    }
    done.wait()
    let dropped = try #require(try loaded.withLock { $0! }.get())
    #expect(dropped.headID == 6 && dropped.floorID == 6)
    #expect(dropped.events.isEmpty && dropped.position == nil)
    let other = try #require(try store.load(feed: "account:user:2"))
    #expect(other.events.map(\.id) == [5, 6] && other.position != nil)
  }

  @Test func aFileThatIsNotAStoreIsCorruptAndLeftAlone() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    #expect(FileManager.default.createFile(atPath: path, contents: Data("not a database at all\n".utf8)))
    #expect(throws: StoreError.self) { _ = try SQLiteEventStore.open(path: path) }
    do {
      _ = try SQLiteEventStore.open(path: path)
    } catch {
      #expect(error.kind == .corrupt)
      #expect(error.description.contains(path))
    }
    #expect(try String(contentsOfFile: path, encoding: .utf8) == "not a database at all\n")
  }

  @Test func anotherApplicationsDatabaseIsRefused() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    var db: OpaquePointer?
    #expect(sqlite3_open(path, &db) == SQLITE_OK)
    #expect(sqlite3_exec(db, "CREATE TABLE users(id INTEGER)", nil, nil, nil) == SQLITE_OK)
    sqlite3_close(db)
    do {
      _ = try SQLiteEventStore.open(path: path)
      Issue.record("a foreign database was opened")
    } catch {
      #expect(error.kind == .corrupt)
      #expect(error.message.contains("not a Pollcast store"))
    }
  }

  /// An SQLite file of another program is never adopted, even one without tables (its application_id used to be
  /// overwritten); only a missing or zero-length file becomes a store.
  @Test func anotherProgramsEmptyDatabaseIsRefusedAndAZeroLengthFileAdopted() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    for setup in ["PRAGMA application_id = 7", "PRAGMA user_version = 3"] {
      try? FileManager.default.removeItem(atPath: path)
      var db: OpaquePointer?
      #expect(sqlite3_open(path, &db) == SQLITE_OK)
      #expect(sqlite3_exec(db, setup, nil, nil, nil) == SQLITE_OK)
      sqlite3_close(db)
      let before = try Data(contentsOf: URL(fileURLWithPath: path))
      #expect(!before.isEmpty)
      do {
        _ = try SQLiteEventStore.open(path: path)
        Issue.record("\(setup): an empty foreign database was adopted")
      } catch {
        #expect(error.kind == .corrupt)
        #expect(error.message.contains("never adopted"), "\(error)")
      }
      #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == before, "\(setup): the file was changed")
    }
    try? FileManager.default.removeItem(atPath: path)
    #expect(FileManager.default.createFile(atPath: path, contents: Data()))
    let store = try SQLiteEventStore.open(path: path)
    store.close()
    let reopened = try SQLiteEventStore.open(path: path)
    reopened.close()
  }

  /// A store records the source that filled it: another source is refused naming both (exit 78 in the CLI), and
  /// only `resetOnSourceChange` moves it aside to start empty.
  @Test func aStoreIsBoundToTheSourceThatFilledIt() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let chatA = "chat http://legacy-a:8081"
    let chatB = "chat http://legacy-b:8081"
    do {
      let store = try SQLiteEventStore.open(path: path, source: chatA)
      try commit(store, StoreBatch(feed: "shared", events: [event(5)], position: nil, headID: 5, floorID: 0))
      store.close()
    }
    let same = try SQLiteEventStore.open(path: path, source: chatA)
    #expect(try same.load(feed: "shared")?.headID == 5)
    same.close()
    do {
      _ = try SQLiteEventStore.open(path: path, source: chatB)
      Issue.record("a store of another source was opened")
    } catch {
      #expect(error.kind == .sourceMismatch)
      #expect(error.message.contains(chatA) && error.message.contains(chatB), "\(error)")
    }
    let reset = try SQLiteEventStore.open(path: path, source: chatB, resetOnSourceChange: true)
    #expect(try reset.load(feed: "shared") == nil)
    reset.close()
    let moved = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
      $0.hasPrefix("pollcast.db.source-")
    }
    #expect(moved.count == 1, "the old store is kept aside: \(moved)")
    // And the new one is now chatB's.
    #expect(throws: StoreError.self) { _ = try SQLiteEventStore.open(path: path, source: chatA) }
  }

  /// Unissued ranges go with a commit and come back with the feed; a dropped feed forgets them.
  @Test func unissuedRangesAreStoredWithTheFeed() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try SQLiteEventStore.open(path: path)
    try commit(
      store,
      StoreBatch(feed: "shared", events: [event(50)], position: nil, headID: 50, floorID: 0, unissued: [11...49]))
    try commit(store, StoreBatch(feed: "shared", events: [event(51)], position: nil, headID: 51, floorID: 0))
    #expect(try store.load(feed: "shared")?.unissued == [11...49])
    store.close()
    #expect(UnissuedRanges.decode(UnissuedRanges.encode([1...2, 7...9])) == [1...2, 7...9])
    for bad in ["x", "3-1", "1-", "1-2,", "-5"] { #expect(UnissuedRanges.decode(bad) == nil, "\(bad)") }
  }

  /// A store holding event 5 of the shared feed (head 5, floor 0), closed.
  private func storeOfOneEvent() throws {
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    try commit(store, StoreBatch(feed: "shared", events: [event(5)], position: nil, headID: 5, floorID: 0))
  }

  /// Runs `sql` on the closed store file, as damage from outside the relay would.
  private func damage(_ sql: String) {
    var db: OpaquePointer?
    #expect(sqlite3_open(path, &db) == SQLITE_OK)
    #expect(sqlite3_exec(db, sql, nil, nil, nil) == SQLITE_OK)
    sqlite3_close(db)
  }

  /// A stored head beyond any id the relay issues is damage (it used to crash the relay at start: SIGILL).
  @Test func aStoredHeadBeyondAnyIDIsCorruptNotACrash() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    try storeOfOneEvent()
    damage("UPDATE feeds SET head_id = -1")
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    do {
      _ = try store.load(feed: "shared")
      Issue.record("a head of 2^64-1 loaded")
    } catch {
      #expect(error.kind == .corrupt)
      #expect(error.message.contains("18446744073709551615"))
    }
  }

  /// A floor above the head is damage: loaded as it was, the next commit (above the head, below the floor) would never
  /// be read back. CI's store fuzzer found such a file (a precondition trap, reported by ASan in the crash handler).
  @Test func aStoredFloorAboveTheHeadIsCorruptNotAHiddenCommit() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    try storeOfOneEvent()
    for floor in ["9", "-3"] {
      damage("UPDATE feeds SET floor_id = \(floor)")
      let store = try SQLiteEventStore.open(path: path)
      defer { store.close() }
      do {
        _ = try store.load(feed: "shared")
        Issue.record("a floor of \(floor) above head 5 loaded")
      } catch {
        #expect(error.kind == .corrupt)
        #expect(error.message.contains("above the head id 5"), "\(error.message)")
      }
    }
  }

  @Test func aDamagedStoreIsCorruptAndResetOnlyWhenAsked() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    do {
      let store = try SQLiteEventStore.open(path: path)
      try commit(
        store,
        StoreBatch(feed: "shared", events: (1...300).map { event($0) }, position: nil, headID: 300, floorID: 0))
      store.close()
    }
    // Overwrite a page in the middle of the file (the events' b-tree).
    let handle = try #require(FileHandle(forUpdatingAtPath: path))
    try handle.seek(toOffset: 4096 * 2)
    try handle.write(contentsOf: Data(repeating: 0xA5, count: 4096 * 2))
    try handle.close()
    do {
      _ = try SQLiteEventStore.open(path: path)
      Issue.record("a damaged store was opened")
    } catch {
      #expect(error.kind == .corrupt)
    }
    let store = try SQLiteEventStore.open(path: path, resetIfCorrupt: true)
    defer { store.close() }
    #expect(try store.load(feed: "shared") == nil)
    let moved = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter {
      $0.hasPrefix("pollcast.db.corrupt-")
    }
    #expect(moved.count == 1, "the damaged file is kept aside: \(moved)")
  }

  @Test func aSecondOpenOfTheSameFileIsRefusedWhileTheFirstHoldsIt() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let first = try SQLiteEventStore.open(path: path)
    do {
      _ = try SQLiteEventStore.open(path: path)
      Issue.record("two stores opened one file")
    } catch {
      #expect(error.kind == .unavailable)
      #expect(error.message.contains("another process"))
    }
    first.close()
    let again = try SQLiteEventStore.open(path: path)
    again.close()
  }

  @Test func aCommitAfterCloseFailsAndChangesNothing() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let store = try SQLiteEventStore.open(path: path)
    store.close()
    #expect(throws: StoreError.self) {
      try commit(store, StoreBatch(feed: "shared", events: [event(1)], position: nil, headID: 1, floorID: 0))
    }
    #expect(store.statistics().commitFailures == 1)
  }

  @Test func opaqueCursorsAreStoredAndAnOlderFileGainsTheirColumn() throws {
    defer { try? FileManager.default.removeItem(at: directory) }
    let position = FeedPosition(
      streams: ["changes", "other"], cursors: ["changes": 41, "other": 0],
      tokens: ["changes": "41-g1AAAA\u{1F}\"quoted\"", "other": ""])
    do {
      let store = try SQLiteEventStore.open(path: path)
      try commit(
        store, StoreBatch(feed: "shared", events: [event(5, upstream: 41)], position: position, headID: 5, floorID: 0))
      store.close()
    }
    do {
      let store = try SQLiteEventStore.open(path: path)
      #expect(try store.load(feed: "shared")?.position == position, "tokens, empty ones included, load back")
      store.close()
    }
    // A store written before opaque cursors existed: no token column. It opens, gains it, and loads no tokens.
    var db: OpaquePointer?
    #expect(sqlite3_open(path, &db) == SQLITE_OK)
    #expect(sqlite3_exec(db, "ALTER TABLE cursors DROP COLUMN token", nil, nil, nil) == SQLITE_OK)
    sqlite3_close(db)
    let store = try SQLiteEventStore.open(path: path)
    defer { store.close() }
    let loaded = try #require(try store.load(feed: "shared"))
    #expect(loaded.position == FeedPosition(streams: ["changes", "other"], cursors: ["changes": 41, "other": 0]))
    try commit(store, StoreBatch(feed: "shared", events: [], position: position, headID: 5, floorID: 0))
    #expect(try store.load(feed: "shared")?.position == position)
  }
}

/// `store.redis_url` and the stored position's text (`store.kind = redis`).
@Suite struct RedisStoreUnitTests {
  @Test func redisURLsParse() throws {
    let plain = try RedisAddress.parse("redis://10.0.0.5").get()
    #expect(plain.host == "10.0.0.5" && plain.port == 6379 && plain.database == 0 && plain.password == nil)
    let full = try RedisAddress.parse("redis://:s%40cret@redis.internal:6380/2").get()
    #expect(full.host == "redis.internal" && full.port == 6380 && full.database == 2 && full.password == "s@cret")
    #expect(full.handshake == [["AUTH", "s@cret"], ["SELECT", "2"]])
    let user = try RedisAddress.parse("redis://default:pw@[::1]:7000").get()
    #expect(user.host == "::1" && user.port == 7000 && user.password == "pw")
    #expect(user.description == "redis://[::1]:7000")
    let socket = try RedisAddress.parse("unix:///run/redis/redis.sock?db=3").get()
    #expect(socket.socketPath == "/run/redis/redis.sock" && socket.database == 3)
    #expect(socket.description == "unix:///run/redis/redis.sock/3")
    for bad in [
      "http://x", "redis://", "redis://host:0", "redis://host:99999", "redis://host:port", "redis://host/db",
      "unix://relative.sock", "redis://[::1", "redis://:pw@",
    ] {
      guard case .failure = RedisAddress.parse(bad) else {
        Issue.record("\(bad) was accepted")
        continue
      }
    }
  }

  @Test func positionsRoundTripExactly() {
    let position = FeedPosition(
      streams: ["101", "a \"quoted\" stream"], cursors: ["101": .max, "a \"quoted\" stream": 0])
    let text = RedisEventStore.encodePosition(position)
    #expect(RedisEventStore.decodePosition(text) == position)
    #expect(RedisEventStore.decodePosition("{\"streams\":[\"x\"],\"cursors\":{}}") == nil)
    #expect(RedisEventStore.decodePosition("not json") == nil)
  }

  @Test func configurationProblemsAreNamed() {
    var configuration = Configuration()
    configuration.store.kind = "redis"
    configuration.store.redisURL = "redis://:pw@"
    configuration.store.leaseSeconds = 0.1
    configuration.store.redisPrefix = "a{b}"
    configuration.upstream.idleAfterSeconds = 30
    let problems = configuration.storeProblems()
    #expect(problems.contains { $0.hasPrefix("store.redis_url:") })
    #expect(problems.contains { $0.hasPrefix("store.lease_seconds:") })
    #expect(problems.contains { $0.hasPrefix("store.redis_prefix:") })
    #expect(problems.contains { $0.hasPrefix("upstream.idle_after_seconds:") })
    configuration = Configuration()
    configuration.store.kind = "redis"
    #expect(configuration.storeProblems().isEmpty)
  }

  @Test func opaqueCursorsRoundTripInRedisPositions() {
    let plain = FeedPosition(streams: ["101"], cursors: ["101": 3])
    #expect(!RedisEventStore.encodePosition(plain).contains("tokens"), "positions without tokens read as before")
    let opaque = FeedPosition(streams: ["c"], cursors: ["c": 9], tokens: ["c": "{\"etag\":\"1\",\"lm\":\"Wed\"}"])
    #expect(RedisEventStore.decodePosition(RedisEventStore.encodePosition(opaque)) == opaque)
    #expect(
      RedisEventStore.decodePosition("{\"streams\":[\"c\"],\"cursors\":{\"c\":\"9\"},\"tokens\":{\"c\":7}}") == nil,
      "a token that is not a string is damage")
  }
}
