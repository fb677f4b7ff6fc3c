import Foundation
import Testing

@testable import PollcastCore

/// `RedisEventStore` against a real `redis-server`: the lease, the fencing of commits, the head check, trims and
/// what a load reads back.
@Suite(.serialized, .timeLimit(.minutes(2))) struct RedisEventStoreTests {
  final class Node {
    let loop: EventLoop
    let store: RedisEventStore

    init(_ name: String, redis: ClusterTests.RedisProcess, source: String? = nil) async throws {
      let address = try RedisAddress.parse(redis.url).get()
      loop = try EventLoop()
      loop.start()
      store = RedisEventStore(
        address: address, nodeID: name, commandTimeout: 2, source: source,
        logger: Logger(label: "test", level: .critical))
      let store = store
      let loop = loop
      await loop.submit { store.attach(to: loop) }
      let deadline = MonotonicClock.seconds() + 10
      // Connection state is the loop's: read it there.
      while await !loop.submit({ store.connection.connected && store.readerConnected })
        && MonotonicClock.seconds() < deadline
      {
        try await Task.sleep(for: .milliseconds(10))
      }
    }

    func lease(token: String?, milliseconds: Int) async -> LeaseAnswer {
      await withCheckedContinuation { continuation in
        loop.execute { [store] in
          store.lease(feed: "shared", token: token, milliseconds: milliseconds) { continuation.resume(returning: $0) }
        }
      }
    }

    func hold(_ token: String?) async {
      await loop.submit { [store] in store.setToken(token, feed: "shared") }
    }

    func commit(_ batch: StoreBatch) async -> Result<Void, StoreError> {
      await withCheckedContinuation { continuation in
        store.commit(batch) { continuation.resume(returning: $0) }
      }
    }

    func close() {
      store.close()
      loop.stop()
    }
  }

  static func event(_ id: UInt64, upstream: UInt64, stream: String = "101") -> StoredEvent {
    StoredEvent(
      id: id, stream: stream, upstreamID: upstream, unixTime: 1_800_000_000,
      bytes: ByteSlice(SSEEncoder.event(id: id, type: nil, data: "{\"u\":\(upstream)}")))
  }

  static func batch(_ events: [StoredEvent], cursor: UInt64, floor: UInt64 = 0, forget: [String] = []) -> StoreBatch {
    StoreBatch(
      feed: "shared", events: events,
      position: FeedPosition(streams: ["101", "202"], cursors: ["101": cursor, "202": 7]),
      headID: events.last?.id ?? 0, floorID: floor, forgetStreams: forget)
  }

  @Test func onlyTheLeaseHolderWritesAndAStaleHolderIsFenced() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-redis-\(UUID())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let redis = try ClusterTests.RedisProcess(directory: directory)
    let a = try await Node("a", redis: redis)
    let b = try await Node("b", redis: redis)
    defer {
      a.close()
      b.close()
    }

    guard case .held(let tokenA, fresh: true) = await a.lease(token: nil, milliseconds: 400) else {
      Issue.record("a did not take the free lease")
      return
    }
    #expect(tokenA.hasPrefix("a/"))
    #expect(await b.lease(token: nil, milliseconds: 400) == .heldBy(tokenA))
    #expect(await a.lease(token: tokenA, milliseconds: 400) == .held(token: tokenA, fresh: false))

    // Without the lease, b cannot commit (refused before Redis is asked).
    guard case .failure(let refused) = await b.commit(Self.batch([Self.event(100, upstream: 1)], cursor: 1)) else {
      Issue.record("b committed without the lease")
      return
    }
    #expect(refused.kind == .fenced)

    await a.hold(tokenA)
    #expect(
      (try? await a.commit(Self.batch([Self.event(100, upstream: 1), Self.event(101, upstream: 2)], cursor: 2)).get())
        != nil)

    // a's lease lapses (a stopped renewing); b takes it with a higher epoch.
    try await Task.sleep(for: .milliseconds(600))
    guard case .held(let tokenB, fresh: true) = await b.lease(token: nil, milliseconds: 5000) else {
      Issue.record("b did not take the expired lease")
      return
    }
    #expect(tokenB.hasPrefix("b/") && tokenB != tokenA)
    await b.hold(tokenB)
    #expect((try? await b.commit(Self.batch([Self.event(102, upstream: 3)], cursor: 3)).get()) != nil)

    // a's late commit (its poll completed after it lost the lease) is fenced by the script: nothing lands.
    guard case .failure(let fenced) = await a.commit(Self.batch([Self.event(103, upstream: 4)], cursor: 4)) else {
      Issue.record("a stale holder committed")
      return
    }
    #expect(fenced.kind == .fenced)
    #expect(fenced.message.contains("FENCED"))

    // An id at or below the stored head is refused before any write (XADD would fail half way otherwise).
    guard case .failure(let stale) = await b.commit(Self.batch([Self.event(101, upstream: 9)], cursor: 9)) else {
      Issue.record("an id below the head was written")
      return
    }
    #expect(stale.message.contains("STALE"))
    // A refused commit stops this node's commits until it takes the lease again (after a catch-up).
    guard case .failure(let stopped) = await b.commit(Self.batch([Self.event(103, upstream: 4)], cursor: 4)),
      !stopped.message.contains("STALE")
    else {
      Issue.record("commits went on after a refusal")
      return
    }
    #expect(stopped.kind == .fenced)
    await b.hold(tokenB)

    var loaded = try #require(try b.store.load(feed: "shared"))
    #expect(loaded.events.map(\.id) == [100, 101, 102])
    #expect(loaded.events.map(\.upstreamID) == [1, 2, 3])
    #expect(loaded.headID == 102)
    #expect(loaded.position == FeedPosition(streams: ["101", "202"], cursors: ["101": 3, "202": 7]))
    #expect(loaded.events[1].bytes.bytes == Self.event(101, upstream: 2).bytes.bytes)

    // The floor trims what the ring evicted; a forgotten stream's events go too.
    let other = Self.event(104, upstream: 5, stream: "202")
    #expect(
      (try? await b.commit(Self.batch([other, Self.event(105, upstream: 6)], cursor: 6, floor: 100)).get()) != nil)
    loaded = try #require(try b.store.load(feed: "shared"))
    #expect(loaded.events.map(\.id) == [101, 102, 104, 105])
    #expect(loaded.floorID == 100)
    #expect((try? await b.commit(Self.batch([], cursor: 6, floor: 100, forget: ["202"])).get()) != nil)
    loaded = try #require(try b.store.load(feed: "shared"))
    #expect(loaded.events.map(\.id) == [101, 102, 105])
    #expect(loaded.headID == 105)

    // Followers' reads: a chunk after an id, and a blocking read that returns what is there at once.
    let after101: [StoredEvent] = await withCheckedContinuation { continuation in
      a.loop.execute { [store = a.store] in
        store.read(feed: "shared", after: 101) { continuation.resume(returning: (try? $0.get())?.events ?? []) }
      }
    }
    #expect(after101.map(\.id) == [102, 105])
    let followed: [StoredEvent] = await withCheckedContinuation { continuation in
      a.loop.execute { [store = a.store] in
        store.follow(feed: "shared", after: 102) { continuation.resume(returning: (try? $0.get())?.events ?? []) }
      }
    }
    #expect(followed.map(\.id) == [105])
  }

  @Test func anUnreachableRedisFailsTheLoadWithAClearError() throws {
    let address = try RedisAddress.parse("unix:///nonexistent/pollcast-redis.sock").get()
    let store = RedisEventStore(address: address, logger: Logger(label: "test", level: .critical))
    #expect {
      _ = try store.load(feed: "shared")
    } throws: { error in
      (error as? StoreError)?.kind == .unavailable
        && "\(error)".contains("unix:///nonexistent/pollcast-redis.sock")
    }
  }

  /// The meta hash's head and floor are checked as the SQLite store checks them: a floor above the head is damage.
  @Test func aMetaFloorAboveTheHeadIsCorrupt() throws {
    let address = try RedisAddress.parse("unix:///nonexistent/pollcast-redis.sock").get()
    let store = RedisEventStore(address: address, logger: Logger(label: "test", level: .critical))
    func meta(head: String, floor: String) -> [RedisReply] {
      [.string(Array(head.utf8)), .string(Array(floor.utf8)), .null, .null, .null, .null]
    }
    #expect(try store.parseMeta(meta(head: "9", floor: "5"), feed: "shared").floorID == 5)
    #expect {
      _ = try store.parseMeta(meta(head: "5", floor: "9"), feed: "shared")
    } throws: { error in
      (error as? StoreError)?.kind == .corrupt && "\(error)".contains("floor id 9 is above the head id 5")
    }
  }

  /// A feed records the source that filled it: a node of another source gets `foreign` from the lease (it never
  /// leads or follows) and a load that names both; its commits are fenced by the script too.
  @Test func aFeedOfAnotherSourceIsNeverLedFollowedOrLoaded() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-redis-\(UUID())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let redis = try ClusterTests.RedisProcess(directory: directory)
    defer { redis.stop() }
    let x = try await Node("x", redis: redis, source: "chat http://api-x")
    let y = try await Node("y", redis: redis, source: "chat http://api-y")
    defer {
      x.close()
      y.close()
    }
    guard case .held(let token, fresh: true) = await x.lease(token: nil, milliseconds: 5000) else {
      Issue.record("x did not take the free lease")
      return
    }
    await x.hold(token)
    #expect(await x.commit(Self.batch([Self.event(10, upstream: 1)], cursor: 1)).isSuccess)
    #expect(await y.lease(token: nil, milliseconds: 5000) == .foreign("chat http://api-x"))
    do {
      _ = try y.store.load(feed: "shared")
      Issue.record("y loaded x's feed")
    } catch {
      #expect(error.kind == .sourceMismatch)
      #expect(error.message.contains("chat http://api-x") && error.message.contains("chat http://api-y"))
    }
    // Even holding x's token, y's commit is refused by the script: nothing of y's lands in x's feed.
    await y.hold(token)
    let refused = await y.commit(Self.batch([Self.event(11, upstream: 2)], cursor: 2))
    #expect(!refused.isSuccess)
    #expect(try x.store.load(feed: "shared")?.headID == 10)
  }

  /// A lease written without an expiry (by hand, or by a broken tool) is given one and reported, instead of
  /// stopping all polling for good; and two processes with one node id never share a lease, even after Redis lost
  /// its data and the epoch counter restarted.
  @Test func aLeaseWithoutExpiryIsRepairedAndTwoProcessesOfOneNodeIDNeverShareALease() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-redis-\(UUID())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let redis = try ClusterTests.RedisProcess(directory: directory)
    defer { redis.stop() }
    let a = try await Node("same", redis: redis)
    let b = try await Node("same", redis: redis)
    defer {
      a.close()
      b.close()
    }
    _ = try ClusterTests.RedisProcess.send("SET pollcast{shared}:lease intruder/1", to: redis.socket)
    #expect(await a.lease(token: nil, milliseconds: 300) == .heldBy("intruder/1", repaired: true))
    let ttl = try ClusterTests.RedisProcess.send("PTTL pollcast{shared}:lease", to: redis.socket)
    #expect(ttl.hasPrefix(":") && (Int(ttl.dropFirst().prefix { $0.isNumber }) ?? 0) > 0, "\(ttl)")
    // Once that expiry passes, the lease is free again.
    try await Task.sleep(for: .milliseconds(400))
    guard case .held(let first, fresh: true) = await a.lease(token: nil, milliseconds: 5000) else {
      Issue.record("the repaired lease did not free")
      return
    }
    // Redis loses everything (the epoch restarts at 1), and b takes the free lease: a's old token is not b's.
    _ = try ClusterTests.RedisProcess.send("FLUSHALL", to: redis.socket)
    guard case .held(let second, fresh: true) = await b.lease(token: nil, milliseconds: 5000) else {
      Issue.record("b did not take the free lease")
      return
    }
    #expect(first != second, "\(first) \(second)")
    #expect(await a.lease(token: first, milliseconds: 5000) == .heldBy(second))
  }

}

extension Result {
  var isSuccess: Bool {
    if case .success = self { return true }
    return false
  }
}
