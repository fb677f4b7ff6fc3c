import CHiredis
import Foundation

/// `store.kind = redis`: several relays share one Redis. Each feed is one Redis Stream whose entry ids are the
/// Pollcast ids (`<id>-0`), so ids are the same on every node and a client resumes on any of them.
///
/// Per feed (`<prefix>{<feed>}:…`, one hash tag so a Redis Cluster keeps a feed's keys on one shard):
/// - `events`: the stream, fields `d` (the encoded SSE bytes), `t` (Unix time), `s` (stream), `u` (upstream id),
///   `k` (event type); trimmed (`XTRIM MINID`) to what the leader's ring keeps;
/// - `meta`: a hash with `head` (the highest id handed out), `floor` (the trim point) and `position` (the
///   upstream streams and cursors, JSON);
/// - `lease` and `epoch`: the poller lease, `<node>/<epoch>` with an expiry; `epoch` only grows.
///
/// A commit is one Lua script: it checks that the lease still holds this node's token (fencing: a node whose
/// lease expired or was taken cannot write, however late its poll completes), that the first id is above the
/// stored head, then adds the events, moves the head, trims, and stores the position. Redis runs a script
/// atomically, and it checks everything before its first write, so a commit lands whole or not at all.
///
/// Two hiredis connections on the relay's event loop: `command` (commits, leases, reads) and `reader` (the
/// followers' blocking `XREAD`, which would hold up the commands behind it). Both reconnect with full-jitter
/// backoff. A commit whose reply was lost with the connection is *in doubt*: its completion waits until the
/// connection is back and the stored head tells whether it landed.
public final class RedisEventStore: SharedStore, @unchecked Sendable {
  public let address: RedisAddress
  public let prefix: String
  /// This process's name in leases (`<host>-<pid>-<random>`): a restarted node never mistakes an old lease for
  /// its own.
  public let nodeID: String
  /// Seconds a command may wait for its reply before the connection is dropped (a hung Redis), and the time
  /// budget of the sync load at start.
  public let commandTimeout: Double
  /// Who fills the feeds (`Configuration.sourceIdentity`), recorded in each feed's meta when its lease is first
  /// taken: a node of another source never leads, follows or serves it. nil: not checked (tests of the store).
  public let source: String?
  /// This process's own part of every lease token (`<node>/<instance>/<epoch>`): two processes configured with one
  /// `store.node_id` never take each other's lease for their own, even after Redis lost its data and the epoch
  /// counter restarted.
  let instance = String(UInt64.random(in: 0...UInt64.max), radix: 36)
  let logger: Logger

  public var kind: String { "redis" }
  public var isDurable: Bool { true }

  /// The loop that drives the connections (set once by `attach(to:)`; read from any thread).
  var loop: EventLoop? { attachedLoop.withLock { $0 } }
  let attachedLoop = Locked<EventLoop?>(nil)
  // Loop-confined from `attach(to:)` on.
  var command: RedisConnection?
  var reader: RedisConnection?
  var tokens: [String: String] = [:]
  var inDoubt: [(batch: StoreBatch, completion: @Sendable (Result<Void, StoreError>) -> Void)] = []
  var backoff = [String: Backoff]()
  var random = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  var reconnectTimers: [String: LoopTimer] = [:]
  var watchdog: LoopTimer?
  var closed = false
  var observers: [String: () -> Void] = [:]
  let stats = Locked(
    {
      var stats = StoreStatistics(kind: "redis")
      stats.foreignEntries = 0
      return stats
    }())
  let health = Locked<(connected: Bool, error: String?)>((false, nil))

  public init(
    address: RedisAddress, prefix: String = "pollcast", nodeID: String? = nil, commandTimeout: Double = 5,
    source: String? = nil, logger: Logger
  ) {
    self.source = source
    self.address = address
    self.prefix = prefix
    self.nodeID = nodeID ?? RedisEventStore.defaultNodeID()
    self.commandTimeout = commandTimeout
    self.logger = logger
  }

  static func defaultNodeID() -> String {
    let host = ProcessInfo.processInfo.hostName.split(separator: ".").first.map(String.init) ?? "node"
    return "\(host)-\(getpid())-\(String(UInt32.random(in: 0...UInt32.max), radix: 36))"
  }

  func key(_ feed: String, _ part: String) -> String { "\(prefix){\(feed)}:\(part)" }

  // MARK: Connections

  public var sharedAcrossNodes: Bool { true }
  var readChunk: Int { RedisEventStore.chunk }

  /// The lease owner: the node that holds the feed's lease polls with `worker`, the others follow the stream.
  public func owner(
    of feed: Feed, worker: UpstreamWorker?, leaseSeconds: Double, logger: Logger, restored: StoredFeed?
  ) -> any FeedOwner {
    FeedReplica(
      store: self, feed: feed, worker: worker, leaseSeconds: leaseSeconds, logger: logger, restored: restored)
  }

  /// Connects both connections on `loop` (called once, on the loop, before anything is committed or followed).
  public func attach(to loop: EventLoop) {
    loop.checkIsolated()
    let first = attachedLoop.withLock { attached -> Bool in
      guard attached == nil else { return false }
      attached = loop
      return true
    }
    guard first else { return }
    let command = RedisConnection(loop: loop, address: address, name: "command", connectTimeout: commandTimeout)
    let reader = RedisConnection(loop: loop, address: address, name: "reader", connectTimeout: commandTimeout)
    self.command = command
    self.reader = reader
    for connection in [command, reader] {
      connection.onConnected = { [weak self, weak connection] in
        guard let self, let connection else { return }
        self.connected(connection)
      }
      connection.onDown = { [weak self, weak connection] reason in
        guard let self, let connection else { return }
        self.lost(connection, reason: reason)
      }
      open(connection)
    }
    let watchdog = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.checkHung() }
    watchdog.schedule(after: max(0.05, min(1, commandTimeout / 4)))
    self.watchdog = watchdog
  }

  func open(_ connection: RedisConnection) {
    guard !closed else { return }
    if let error = connection.connect() { lost(connection, reason: error) }
  }

  func connected(_ connection: RedisConnection) {
    backoff[connection.name] = nil
    if connection === command {
      health.withLock { $0 = (true, nil) }
      logger.info("redis connected", metadata: ["redis": address.description, "node": nodeID])
      resolveInDoubt()
    } else if connection === reader {
      followReads.readerConnected(connection)
    }
    notify()
  }

  func lost(_ connection: RedisConnection, reason: String) {
    if connection === command {
      let wasConnected = health.withLock { state -> Bool in
        defer { state = (false, reason) }
        return state.connected
      }
      if wasConnected { logger.warning("redis connection lost", metadata: ["error": reason]) }
    }
    notify()
    guard !closed, let loop else { return }
    var schedule = backoff[connection.name] ?? Backoff(base: 0.1, cap: 2)
    let delay = schedule.nextDelay(using: &random)
    backoff[connection.name] = schedule
    let timer = LoopTimer(loop: loop) { [weak self, weak connection] in
      guard let self, let connection else { return }
      self.reconnectTimers[connection.name] = nil
      self.open(connection)
    }
    timer.schedule(after: delay)
    reconnectTimers[connection.name] = timer
  }

  /// Drops a connection whose oldest command waited past the timeout (a Redis that hangs): its commands fail or
  /// go in doubt, and the connection is made again.
  func checkHung() {
    if let command, command.isConnected, command.oldestWait > commandTimeout {
      command.drop(reason: "no reply for \(Int(commandTimeout)) s")
    }
    if let reader, reader.isConnected, reader.oldestWait > commandTimeout + RedisEventStore.blockSeconds {
      reader.drop(reason: "no reply for \(Int(commandTimeout + RedisEventStore.blockSeconds)) s")
    }
    // A connect that neither succeeds nor fails (a host that drops SYNs) is given up too.
    let now = MonotonicClock.seconds()
    for connection in [command, reader].compactMap({ $0 })
    where connection.isOpen && !connection.isConnected && connection.connectStarted > 0
      && now - connection.connectStarted > commandTimeout
    {
      connection.drop(reason: "no answer within \(Int(commandTimeout)) s of connecting")
    }
  }

  /// Calls `observer` on the loop whenever a connection comes up or goes down, until `unobserve(feed:)`.
  func observe(feed: String, _ observer: @escaping () -> Void) { observers[feed] = observer }

  /// Calls `observer` on the loop when a commit of `feed` was refused because this node may not write it.
  func observeFencing(feed: String, _ observer: @escaping () -> Void) { fencedObservers[feed] = observer }

  /// Forgets the observers of `feed` (its owner stopped: an account's grace ended).
  func unobserve(feed: String) {
    observers[feed] = nil
    fencedObservers[feed] = nil
  }

  var fencedObservers: [String: () -> Void] = [:]

  func notify() { for observer in Array(observers.values) { observer() } }

  /// Whether the command connection is up, and the last error while it is not.
  public var connection: (connected: Bool, error: String?) { health.withLock { $0 } }
  var readerConnected: Bool { reader?.isConnected ?? false }

  // MARK: EventStore

  public func load(feed: String) throws(StoreError) -> StoredFeed? {
    let client = try RedisSyncClient(address: address, timeout: commandTimeout)
    defer { client.close() }
    let meta = try client.run(["HMGET", key(feed, "meta")] + RedisEventStore.metaFields)
    guard let fields = meta.elements, fields.count == RedisEventStore.metaFields.count else { throw unexpected(meta) }
    let parsed = try parseMeta(fields, feed: feed)
    let head = fields[0].text.flatMap { UInt64($0) }
    let floor = parsed.floorID
    let position = parsed.position
    // Other nodes write while this one reads (in chunks, so not one snapshot): read only up to the head read
    // above (what comes later is followed from there), and let the floor rise to below the first entry read (what
    // lay below it was trimmed meanwhile).
    let stored = head ?? 0
    var events: [StoredEvent] = []
    var after = floor
    while after < stored {
      let chunk = try client.run([
        "XRANGE", key(feed, "events"), "(\(after)-0", "\(stored)-0", "COUNT", String(RedisEventStore.chunk),
      ])
      let parsed = try parseEntries(chunk)
      events += parsed
      guard parsed.count == RedisEventStore.chunk, let last = parsed.last else { break }
      after = last.id
    }
    guard head != nil || !events.isEmpty || position != nil else {
      return parsed.generation == nil
        ? nil
        : StoredFeed(
          headID: 0, floorID: 0, events: [], position: nil,
          generation: parsed.generation)
    }
    let lowest = events.first.map { $0.id > 0 ? $0.id - 1 : 0 } ?? stored
    return StoredFeed(
      headID: stored, floorID: max(floor, lowest), events: events, position: position, unissued: parsed.unissued,
      generation: parsed.generation)
  }

  /// What the feed's meta hash holds, in this order (`HMGET`).
  static let metaFields = ["head", "floor", "position", "source", "generation", "unissued"]

  /// The meta hash's fields (`metaFields`) checked: a position or ranges that cannot be read are damage, a stored
  /// head beyond any id is damage, and another source is refused.
  func parseMeta(_ fields: [RedisReply], feed: String) throws(StoreError) -> StoredFeed {
    let head = fields[0].text.flatMap { UInt64($0) } ?? 0
    let floor = fields[1].text.flatMap { UInt64($0) } ?? 0
    try StoredFeed.checkHead(head, floor: floor, feed: feed, path: address.description)
    var position: FeedPosition?
    if let text = fields[2].text {
      guard let decoded = RedisEventStore.decodePosition(text) else {
        throw StoreError(.corrupt, path: address.description, "\(key(feed, "meta")): the position is not readable")
      }
      position = decoded
    }
    if let source, let stored = fields[3].text, stored != source {
      throw sourceMismatch(stored: stored, feed: feed)
    }
    var unissued: [ClosedRange<UInt64>] = []
    if let text = fields[5].text {
      guard let ranges = UnissuedRanges.decode(text) else {
        throw StoreError(
          .corrupt, path: address.description, "\(key(feed, "meta")): the unissued ranges are not readable")
      }
      unissued = ranges
    }
    return StoredFeed(
      headID: head, floorID: floor, events: [], position: position,
      unissued: unissued, generation: fields[4].text)
  }

  func sourceMismatch(stored: String, feed: String) -> StoreError {
    StoreError(
      .sourceMismatch, path: address.description,
      "feed \(feed) under prefix \(prefix) was filled from \(stored), but this relay is configured for"
        + " \(source ?? "(unchecked)"): give this deployment its own store.redis_prefix")
  }

  public func load(feed: String, completion: @escaping @Sendable (Result<StoredFeed?, StoreError>) -> Void) {
    DispatchQueue.global().async { [self] in
      do throws(StoreError) {
        completion(.success(try load(feed: feed)))
      } catch {
        completion(.failure(error))
      }
    }
  }

  public func commit(_ batch: StoreBatch, completion: @escaping @Sendable (Result<Void, StoreError>) -> Void) {
    guard let loop else {
      completion(.failure(address.unavailable("not attached to an event loop")))
      return
    }
    guard loop.inLoopThread else {
      loop.execute { [self] in commit(batch, completion: completion) }
      return
    }
    let started = MonotonicClock.seconds()
    guard !closed, let command else {
      completion(.failure(StoreError(.closed, path: address.description, "the store is closed")))
      return
    }
    guard let token = tokens[batch.feed] else {
      stats.withLock { $0.commitFailures += 1 }
      completion(.failure(StoreError(.fenced, path: address.description, "this node does not hold the lease")))
      return
    }
    guard command.isConnected else {
      stats.withLock { $0.commitFailures += 1 }
      completion(
        .failure(
          StoreError(
            .unavailable, path: address.description, "redis unreachable: \(connection.error ?? "connecting")")))
      return
    }
    command.send(commitArguments(batch, token: token)) { [self] reply in
      switch reply {
      case nil:
        // Sent, and the connection ended before the reply: it may or may not have landed.
        inDoubt.append((batch, completion))
      case .error(let message)?:
        stats.withLock { $0.commitFailures += 1 }
        let kind: StoreError.Kind = message.hasPrefix("FENCED") || message.hasPrefix("STALE") ? .fenced : .write
        if kind == .fenced {
          // This node must not write: its replica steps down and takes the lease again only after a catch-up.
          tokens[batch.feed] = nil
          fencedObservers[batch.feed]?()
        }
        completion(.failure(StoreError(kind, path: address.description, message)))
      case .some:
        recordCommit(batch, seconds: MonotonicClock.seconds() - started)
        completion(.success(()))
      }
    }
  }

  func recordCommit(_ batch: StoreBatch, seconds: Double) {
    stats.withLock { stats in
      stats.commits += 1
      stats.eventsWritten += batch.events.count
      stats.bytesWritten += batch.events.reduce(0) { $0 + $1.bytes.count }
      stats.commitSeconds.record(seconds)
    }
  }

  /// Settles the commits whose replies were lost. The script writes all or nothing, so one with events landed
  /// exactly when its first event is in the stream under its id with its bytes (not the stored head: another
  /// node that took over since then moved it past any of this node's ids). A position-only commit is reported
  /// failed (retrying it only repeats a cursor move).
  func resolveInDoubt() {
    let pending = inDoubt
    inDoubt = []
    for (batch, completion) in pending {
      guard let first = batch.events.first, let command else {
        completion(.failure(address.unavailable("redis connection lost")))
        continue
      }
      let entry = "\(first.id)-0"
      command.send(RedisEventStore.arguments(["XRANGE", key(batch.feed, "events"), entry, entry])) { [self] reply in
        guard let reply else {
          inDoubt.append((batch, completion))
          return
        }
        let found = (try? parseEntries(reply))?.first
        if let found, found.id == first.id, found.bytes.bytes == first.bytes.bytes {
          recordCommit(batch, seconds: 0)
          completion(.success(()))
        } else {
          stats.withLock { $0.commitFailures += 1 }
          completion(.failure(address.unavailable("redis connection lost")))
        }
      }
    }
  }

  /// Nothing: a node forgetting a feed (an idle account evicted under its own bounds) must not delete what the
  /// other nodes serve and resume from. An account's stream stays trimmed to the ring its leader keeps.
  public func drop(feed: String) {}

  /// Gives up `feed`'s lease if this node holds it (an account's grace ended here): another node serving the
  /// account takes it at its next renewal, not after the expiry. Commits of `feed` stop at once.
  func release(feed: String) {
    guard let token = tokens.removeValue(forKey: feed), let command, command.isConnected else { return }
    command.send(
      RedisEventStore.arguments(["EVAL", RedisEventStore.releaseScript, "1", key(feed, "lease"), token])
    ) { _ in }
  }

  /// The secret that names accounts without a user id (`AccountKeys`), kept in Redis beside the feeds
  /// (`<prefix>account_key_secret`, set only when absent): every node names such an account alike, so it has one
  /// stream, one lease and one set of ids cluster-wide. A value that is not 32 bytes of hex is refused as damage,
  /// never replaced (that would rename every such account).
  public func accountKeySecret() throws(StoreError) -> [UInt8]? {
    let client = try RedisSyncClient(address: address, timeout: commandTimeout)
    defer { client.close() }
    let name = "\(prefix)account_key_secret"
    let made = AccountKeys.freshSecret().lowercaseHex
    _ = try client.run(["SET", name, made, "NX"])
    let reply = try client.run(["GET", name])
    guard let text = reply.text else { throw unexpected(reply) }
    guard let secret = [UInt8](hex: text), secret.count == 32 else {
      throw StoreError(.corrupt, path: address.description, "\(name) is not 32 bytes of hex")
    }
    return secret
  }

  public func statistics() -> StoreStatistics {
    var snapshot = stats.withLock { $0 }
    snapshot.connected = connection.connected
    return snapshot
  }

  /// Gives up the leases this node holds (another node takes over at once, not after the expiry), then closes
  /// both connections. Call while the loop still runs.
  public func close() {
    guard let loop, loop.isRunning, !loop.inLoopThread else {
      if let loop, loop.inLoopThread { shut(then: {}) }
      return
    }
    let done = DispatchSemaphore(value: 0)
    loop.execute { [self] in shut { done.signal() } }
    _ = done.wait(timeout: .now() + min(2, commandTimeout))
  }

  func shut(then finished: @escaping @Sendable () -> Void) {
    guard !closed else { return finished() }
    closed = true
    watchdog = nil
    reconnectTimers = [:]
    for (_, completion) in inDoubt {
      completion(.failure(StoreError(.closed, path: address.description, "the store is closed")))
    }
    inDoubt = []
    let held = tokens
    tokens = [:]
    let finish = { [self] in
      command?.disconnect(reason: "closed")
      reader?.disconnect(reason: "closed")
      finished()
    }
    guard let command, command.isConnected, !held.isEmpty else { return finish() }
    var remaining = held.count
    for (feed, token) in held {
      command.send(
        RedisEventStore.arguments([
          "EVAL", RedisEventStore.releaseScript, "1", key(feed, "lease"), token,
        ])
      ) { [self] _ in
        remaining -= 1
        if remaining == 0 {
          logger.info("redis leases released", metadata: ["feeds": held.keys.sorted().joined(separator: ",")])
          finish()
        }
      }
    }
  }

  /// Reads of the followers, many feeds in one blocking `XREAD` (loop-confined).
  lazy var followReads = RedisFollowReads(store: self)
}

extension RedisAddress {
  /// Redis cannot be reached or did not answer: the error names the URL (without its password).
  func unavailable(_ why: String) -> StoreError { StoreError(.unavailable, path: description, why) }
}
