import Foundation

/// The lease owner of one feed on a store several nodes share (`SharedStore`; `store.kind = redis` today): either
/// this node leads the feed (holds its lease, runs its upstream loop, commits) or it follows what the leader
/// stored and fans it out. The shared feed has one; in per-user relaying every account a node serves has one.
///
/// - Every `leaseSeconds / 4` the node renews its lease, or tries to take it when nobody holds it. A leader whose
///   renewal has not succeeded steps down (stops polling) at `0.8 × leaseSeconds` after it sent its last
///   successful renewal, before the store can let the lease expire, so two nodes never poll at once; the commit
///   script's fencing catches anything that still arrives late.
/// - Taking over: read the feed from this node's head to its end (chunks), read the stored head and cursors,
///   renew once more, then let commits through, allocate ids above the stored head and poll on from the cursor.
/// - Following: the store's blocking reads from this node's head (every feed followed shares them). Once the
///   connection is back after a loss (or the replica starts again), a stored floor above the head means events
///   were trimmed before this node read them: its streams end, and their clients get the resume rules' `reset`.
/// - `stop()` gives the lease back at once; `resume(worker:)` starts again (an account whose grace ended here
///   and whose subscriber came back). Answers to requests of an earlier run are ignored.
public actor FeedReplica {
  public enum Role: String, Sendable { case follower, leader, stopped }

  public nonisolated let loop: EventLoop
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
  let store: any SharedStore
  let feed: Feed
  /// Polls while this node leads (an account's is replaced each time its loop starts here, with a current key).
  private(set) var worker: UpstreamWorker?
  let leaseSeconds: Double
  let logger: Logger

  public private(set) var role: Role = .follower
  private var token: String?
  private var leader: String?
  /// When this node's lease may have expired in Redis (monotonic, counted from the renewal's send time).
  private var deadline = 0.0
  private var leaseTimer: LoopTimer?
  private var deadlineTimer: LoopTimer?
  private var takingOver = false
  private var reading = false
  /// Counts the starts: an answer to a request of an earlier run (before a stop) is ignored, so a replica that
  /// stops and starts again (an account's grace ended, then a subscriber came back) never acts on it twice.
  private var run = 0
  /// The highest stream entry this node read (foreign ones included): reading goes on after it, and a new leader's
  /// ids go above it, so an entry no relay wrote is skipped once instead of stalling readers and commits.
  private var readCursor: UInt64 = 0
  private var cursor: UInt64 { max(readCursor, feed.assumeIsolated { $0.headID }) }
  private var readerChecked = false
  private var lastError: String?
  /// Upstream ids of the latest events (no bytes): a new leader recognises an upstream resending them.
  private var recent: [StoredEvent] = []
  private var status: String?
  /// The generation of the feed's data this node knows (`StoredFeed.generation`); another one in Redis means
  /// the store lost the feed.
  private var generation: String?
  /// The source that filled the feed in Redis, when it is not this node's: the node then serves nobody.
  private var foreignSource: String?
  public private(set) var statistics = Statistics()

  public struct Statistics: Sendable {
    public var leaseAcquisitions = 0
    public var leaseLosses = 0
    public var followedEvents = 0
    public var gaps = 0
    /// Times this node found the feed's data gone from Redis (restarted empty) or of another generation.
    public var storeLosses = 0
    /// Leases found without an expiry, and given one.
    public var leaseRepairs = 0
    /// Seconds from the takeover's first lease answer until this node polled (catch-up included).
    public var lastTakeoverSeconds = 0.0

    public init() {}

    /// Adds another replica's counters (per-user relaying: every account a node serves has one).
    public mutating func absorb(_ other: Statistics) {
      leaseAcquisitions += other.leaseAcquisitions
      leaseLosses += other.leaseLosses
      followedEvents += other.followedEvents
      gaps += other.gaps
      storeLosses += other.storeLosses
      leaseRepairs += other.leaseRepairs
      lastTakeoverSeconds = max(lastTakeoverSeconds, other.lastTakeoverSeconds)
    }
  }

  init(
    store: any SharedStore, feed: Feed, worker: UpstreamWorker?, leaseSeconds: Double, logger: Logger,
    restored: StoredFeed?
  ) {
    self.loop = feed.loop
    self.store = store
    self.feed = feed
    self.worker = worker
    self.leaseSeconds = leaseSeconds
    self.logger = logger
    self.recent = FeedReplica.remembered(restored?.events ?? [], after: [])
    self.generation = restored?.generation
  }

  public var feedName: String { feed.storeKey }

  public func start() {
    guard role != .stopped else { return }
    begin()
  }

  /// Stops polling and following: steps down (releasing the lease, so another node serving the feed takes it at
  /// once) and forgets every request in flight. `resume(worker:)` starts again.
  public func stop() {
    if role == .leader {
      worker?.assumeIsolated { $0.stop() }
      store.release(feed: feedName)
      token = nil
    }
    role = .stopped
    run += 1
    reading = false
    readerChecked = false
    takingOver = false
    takeover = nil
    leaseTimer = nil
    deadlineTimer = nil
    store.unobserve(feed: feedName)
    store.unfollow(feed: feedName)
  }

  /// Starts again after `stop()`, polling with `worker` whenever this node takes the lease (an account whose
  /// loop starts here again, with the key of the subscriber who came).
  public func resume(worker: UpstreamWorker?) {
    self.worker = worker
    if role == .stopped { role = .follower }
    begin()
  }

  private func begin() {
    guard leaseTimer == nil else { return }
    store.observe(feed: feedName) { [weak self] in self?.assumeIsolated { $0.connectionChanged() } }
    store.observeFencing(feed: feedName) { [weak self] in
      self?.assumeIsolated { replica in
        guard replica.role == .leader else { return }
        replica.stepDown("a commit was refused: this node no longer holds the lease")
        replica.tick()
      }
    }
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.assumeIsolated { $0.tick() } }
    timer.schedule(after: leaseSeconds / 4)
    leaseTimer = timer
    setStatus()
    tick()
    follow()
  }

  // MARK: The lease

  private func tick() {
    guard role != .stopped, !takingOver else { return }
    let sent = MonotonicClock.seconds()
    let run = run
    store.lease(feed: feedName, token: token, milliseconds: Int(leaseSeconds * 1000)) { [weak self] answer in
      self?.assumeIsolated { replica in
        guard replica.run == run else { return }
        replica.answered(answer, sent: sent)
      }
    }
  }

  private func answered(_ answer: LeaseAnswer, sent: Double) {
    guard role != .stopped, !takingOver else { return }
    if foreignSource != nil, answer != .foreign(foreignSource ?? "") {
      if case .failed = answer {
      } else {
        // The feed is this node's source again (the operator cleared the prefix).
        foreignSource = nil
        feed.assumeIsolated { $0.setUnavailable(nil) }
        follow()
      }
    }
    switch answer {
    case .held(let held, let fresh):
      lastError = nil
      if role == .leader && held == token && !fresh {
        extend(from: sent)
      } else {
        // Taken now (or again, after ours expired and somebody may have written meanwhile): catch up first.
        if role == .leader { stepDown("the lease expired before it was renewed") }
        takeOver(held)
      }
    case .heldBy(let holder, let repaired):
      lastError = nil
      if repaired {
        statistics.leaseRepairs += 1
        logger.error(
          "the feed's lease had no expiry (written by hand or by another tool): one was set, so polling resumes"
            + " when its holder is gone", metadata: ["feed": feedName, "lease": holder])
      }
      // Tokens are <node>/<instance>/<epoch>.
      let parts = holder.split(separator: "/")
      let node = parts.count >= 3 ? parts.dropLast(2).joined(separator: "/") : parts.dropLast().joined(separator: "/")
      if leader != node {
        leader = node
        setStatus()
      }
      if role == .leader { stepDown("the lease is held by \(holder)") }
    case .foreign(let stored):
      refuse(stored)
    case .failed(let error):
      lastError = error
      setStatus()
    }
  }

  private func extend(from sent: Double) {
    deadline = sent + leaseSeconds * 0.8
    let timer = LoopTimer(loop: loop) { [weak self] in self?.assumeIsolated { $0.deadlinePassed() } }
    timer.schedule(after: max(0, deadline - MonotonicClock.seconds()))
    deadlineTimer = timer
  }

  private func deadlinePassed() {
    guard role == .leader, MonotonicClock.seconds() >= deadline else { return }
    stepDown("the lease could not be renewed in time (\(lastError ?? "no answer"))")
  }

  private func takeOver(_ newToken: String) {
    takingOver = true
    takeover = (newToken, MonotonicClock.seconds())
    logger.info("lease taken: catching up before polling", metadata: ["feed": feedName, "lease": newToken])
    catchUp()
  }

  /// The lease this node took and is catching up under, and when it took it.
  private var takeover: (token: String, started: Double)?

  /// Reads the stream from this node's head to its end (in chunks), then the stored head and position.
  private func catchUp() {
    let run = run
    store.read(feed: feedName, after: cursor) { [weak self] result in
      self?.assumeIsolated { replica in
        guard replica.run == run else { return }
        switch result {
        case .failure(let error): replica.caughtUp(.failure(error))
        case .success(let chunk):
          replica.show(chunk)
          if chunk.count == replica.store.readChunk {
            replica.catchUp()
          } else {
            replica.store.meta(feed: replica.feedName) { [weak replica] result in
              replica?.assumeIsolated { replica in
                guard replica.run == run else { return }
                replica.caughtUp(result)
              }
            }
          }
        }
      }
    }
  }

  private func caughtUp(_ result: Result<StoredFeed, StoreError>) {
    guard role != .stopped, let (newToken, started) = takeover else { return }
    switch result {
    case .failure(let error):
      takingOver = false
      takeover = nil
      lastError = error.description
      logger.warning("takeover abandoned", metadata: ["feed": feedName, "error": error.description])
    case .success(let stored):
      checkGeneration(stored.generation)
      // Renew once more: the catch-up may have taken a while, and polling starts only under a fresh lease.
      let renewal = MonotonicClock.seconds()
      let run = run
      store.lease(feed: feedName, token: newToken, milliseconds: Int(leaseSeconds * 1000)) { [weak self] answer in
        self?.assumeIsolated { replica in
          guard replica.run == run else { return }
          replica.takingOver = false
          replica.takeover = nil
          guard replica.role != .stopped else { return }
          guard answer == .held(token: newToken, fresh: false) else {
            replica.logger.warning("takeover abandoned: the lease did not hold", metadata: ["answer": "\(answer)"])
            return
          }
          var stored = stored
          // Above every entry read, foreign ones too: the next commit's ids must be above the stream's top.
          stored.headID = max(stored.headID, replica.readCursor)
          replica.lead(newToken, stored: stored, renewed: renewal, started: started)
        }
      }
    }
  }

  private func lead(_ newToken: String, stored: StoredFeed, renewed: Double, started: Double) {
    // A leader reads nothing back: what it commits it has shown already.
    store.unfollow(feed: feedName)
    reading = false
    token = newToken
    leader = store.nodeID
    role = .leader
    statistics.leaseAcquisitions += 1
    extend(from: renewed)
    store.setToken(newToken, feed: feedName)
    feed.assumeIsolated { $0.lead(storedHead: stored.headID) }
    statistics.lastTakeoverSeconds = MonotonicClock.seconds() - started
    logger.info(
      "leading the feed: polling upstream",
      metadata: [
        "feed": feedName, "lease": newToken, "stored_head": String(stored.headID),
        "catch_up_ms": String(Int(statistics.lastTakeoverSeconds * 1000)),
      ])
    guard let worker else { return }
    let recent = recent
    worker.assumeIsolated { worker in
      if let position = stored.position { worker.restore(position, events: recent) }
      worker.start()
    }
  }

  private func stepDown(_ reason: String) {
    guard role == .leader else { return }
    worker?.assumeIsolated { $0.stop() }
    store.setToken(nil, feed: feedName)
    token = nil
    role = .follower
    statistics.leaseLosses += 1
    logger.warning("stopped leading the feed: following it", metadata: ["feed": feedName, "reason": reason])
    setStatus()
    follow()
  }

  // MARK: Following

  private func connectionChanged() {
    if !store.readerConnected { readerChecked = false }
    // Unconfirmed from the first instant: Redis may have restarted empty, and another node may take the free lease
    // before this one's deadline. The lease is confirmed again (and caught up) once the connection is back.
    if !store.connection.connected && role == .leader {
      stepDown("the redis connection was lost: the lease is unconfirmed until it is renewed")
    }
    setStatus()
    if store.connection.connected && role == .follower && !takingOver { tick() }
    follow()
  }

  /// Compares the generation Redis holds with the one this node knew: a different one (or none, once this node
  /// knew one) means Redis lost the feed, and with it the cursor and whatever was upstream meanwhile. Never silent:
  /// every stream ends, clients resuming across the loss get `reset`, and the status says why.
  private func checkGeneration(_ stored: String?) {
    defer { if stored != nil { generation = stored } }
    guard let known = generation, stored != known else { return }
    statistics.storeLosses += 1
    generation = nil
    let ended = feed.assumeIsolated {
      $0.storeLost("redis no longer holds this feed's data (restarted empty?): events polled meanwhile are lost")
    }
    logger.error(
      "redis lost the feed's data: streams ended, clients that resume get a reset",
      metadata: [
        "feed": feedName, "known_generation": known, "stored": stored ?? "none", "streams_ended": String(ended),
      ])
  }

  /// The feed in Redis was filled from another source: this node neither leads nor follows it, serves nobody, and
  /// `/readyz` says why, until the lease script sees this node's source again.
  private func refuse(_ stored: String) {
    if foreignSource == nil {
      logger.error(
        "the redis feed was filled from another source: serving nobody",
        metadata: ["feed": feedName, "stored_source": stored, "source": store.source ?? "", "prefix": store.prefix])
    }
    foreignSource = stored
    if role == .leader { stepDown("the feed belongs to another source") }
    let reason = foreignReason
    feed.assumeIsolated { $0.setUnavailable(reason) }
  }

  private var foreignReason: String {
    "the store (prefix \(store.prefix)) holds feed \(feedName) of \(foreignSource ?? "?"), not this relay's"
      + " \(store.source ?? "?"): give this deployment its own store.redis_prefix"
  }

  private func follow() {
    guard role == .follower, foreignSource == nil, !reading, store.readerConnected, store.connection.connected
    else { return }
    reading = true
    let run = run
    guard readerChecked else {
      // After a (re)connection or a start: were events trimmed before this node read them?
      store.meta(feed: feedName) { [weak self] result in
        self?.assumeIsolated { replica in
          guard replica.run == run else { return }
          replica.reading = false
          guard case .success(let stored) = result else { return }
          replica.checkGeneration(stored.generation)
          let head = replica.feed.assumeIsolated { $0.headID }
          if stored.floorID > head {
            replica.statistics.gaps += 1
            let ended = replica.feed.assumeIsolated { $0.skip(to: stored.floorID) }
            replica.logger.warning(
              "the shared stream was trimmed past this node's head: streams ended, clients get a reset",
              metadata: [
                "feed": replica.feedName, "head": String(head), "floor": String(stored.floorID),
                "streams_ended": String(ended),
              ])
          }
          replica.readerChecked = true
          replica.follow()
        }
      }
      return
    }
    store.follow(feed: feedName, after: cursor) { [weak self] result in
      self?.assumeIsolated { replica in
        guard replica.run == run else { return }
        replica.reading = false
        switch result {
        case .success(let chunk):
          replica.show(chunk)
          replica.follow()
        case .failure(let error):
          replica.lastError = error.description
          if error.kind == .corrupt {
            replica.logger.error("the shared stream holds an unreadable entry", metadata: ["error": error.description])
          }
        }
      }
    }
  }

  private func show(_ chunk: StoreChunk) {
    if let highest = chunk.highest { readCursor = max(readCursor, highest) }
    if !chunk.skipped.isEmpty {
      logger.error(
        "the feed's stream holds entries no relay wrote: skipped, never relayed",
        metadata: ["feed": feedName, "entries": chunk.skipped.prefix(5).joined(separator: ",")])
    }
    show(chunk.events)
  }

  private func show(_ events: [StoredEvent]) {
    guard !events.isEmpty else { return }
    statistics.followedEvents += events.count
    feed.assumeIsolated { $0.follow(events) }
    remember(events)
  }

  private func remember(_ events: [StoredEvent]) {
    recent = FeedReplica.remembered(events, after: recent)
  }

  private static let empty = ByteSlice([])

  private static func remembered(_ events: [StoredEvent], after recent: [StoredEvent]) -> [StoredEvent] {
    var recent = recent
    for event in events.suffix(512) where event.upstreamID != nil {
      recent.append(
        StoredEvent(id: event.id, stream: event.stream, upstreamID: event.upstreamID, unixTime: 0, bytes: empty))
    }
    if recent.count > 1024 { recent.removeFirst(recent.count - 512) }
    return recent
  }

  // MARK: Status

  /// Followers say in the `upstream` status event who polls for them, or that Redis is unreachable (the leader's
  /// worker publishes its own states).
  private func setStatus() {
    guard role == .follower else { return }
    let data: String
    if !store.connection.connected {
      data = JSONText.object([
        "state": JSONText.quoted("backoff"), "reason": JSONText.quoted("store"), "role": JSONText.quoted("follower"),
        "error": JSONText.quoted("redis unreachable: \(store.connection.error ?? "connecting")"),
      ])
    } else {
      data = JSONText.object([
        "state": JSONText.quoted("following"), "role": JSONText.quoted("follower"),
        "leader": JSONText.quoted(leader ?? "none yet"),
      ])
    }
    guard data != status else { return }
    status = data
    feed.assumeIsolated { $0.publishStatus(data) }
  }

  /// `/readyz`: a follower is ready while it reads the stream; a leader while its upstream loop is healthy.
  public func readiness() -> (ready: Bool, reason: String) {
    let connection = store.connection
    guard connection.connected else { return (false, "redis unreachable: \(connection.error ?? "connecting")") }
    if foreignSource != nil { return (false, foreignReason) }
    switch role {
    case .leader:
      let (ready, reason) = worker?.assumeIsolated { $0.readiness() } ?? (true, "no upstream configured")
      return (ready, "leader: \(reason)")
    case .follower:
      guard store.readerConnected else { return (false, "redis reader connection down") }
      return (true, "following \(leader ?? "the feed (no leader yet)")")
    case .stopped:
      return (false, "stopped")
    }
  }
}
