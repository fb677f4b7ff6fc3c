import Foundation

/// The hub's bounds (active accounts, kept accounts, ring bytes over all accounts): where an account is stopped
/// or evicted, and what `/metrics`, `/readyz` and shutdown see.
extension AccountHub {
  /// Stops an account still in its grace period (the least recently used) when the active bound is reached.
  func makeRoomForActive() -> Bool {
    guard activeCount >= settings.maxActiveAccounts else { return true }
    checkKeptApart()
    guard let victim = graceAccounts.values.min(by: { $0.lastUsed < $1.lastUsed }) else { return false }
    logger.info("account limit reached: stopping an account in its grace period", metadata: ["account": victim.label])
    victim.graceTimer = nil
    stopLoop(victim)
    victim.feed.assumeIsolated { $0.pause() }
    return activeCount < settings.maxActiveAccounts
  }

  func makeRoomForRetained() -> Bool {
    guard accounts.count >= settings.maxRetainedAccounts else { return true }
    guard let victim = leastRecentlyUsedIdle() else { return false }
    evict(victim, reason: "max_retained_accounts")
    return accounts.count < settings.maxRetainedAccounts
  }

  /// A debug build checks the accounts kept apart (idle; in their grace period) against the table.
  func checkKeptApart() {
    #if DEBUG
      let stoppedKeys = accounts.values.filter { !$0.isActive }.map(\.key).sorted()
      assert(
        stoppedKeys == idleAccounts.keys.sorted(),
        "idle accounts \(idleAccounts.count) != \(stoppedKeys.count) in the table")
      let graceKeys = accounts.values.filter { $0.isActive && $0.subscribers == 0 }.map(\.key).sorted()
      assert(
        graceKeys == graceAccounts.keys.sorted(),
        "accounts in grace \(graceAccounts.count) != \(graceKeys.count) in the table")
    #endif
  }

  func leastRecentlyUsedIdle() -> Account? {
    idleAccounts.values.filter { $0.subscribers == 0 }.min { $0.lastUsed < $1.lastUsed }
  }

  func evict(_ account: Account, reason: String) {
    // Its counters stay in the running totals (`AccountTotals`); its ring's bytes and events leave them below.
    highWater = max(highWater, account.feed.assumeIsolated { $0.headID })
    account.graceTimer = nil
    account.feed.assumeIsolated { feed in
      feed.pause()
      feed.countRing(toward: nil)
    }
    upstream.store.drop(feed: account.feed.storeKey)
    accounts[account.key] = nil
    idleAccounts[account.key] = nil
    graceAccounts[account.key] = nil
    stats.retainedAccounts = accounts.count
    stats.evictions[reason, default: 0] += 1
    logger.info("account evicted: its ring is dropped", metadata: ["account": account.label, "reason": reason])
  }

  /// Ages the rings of idle accounts (their feeds' timers are stopped) and evicts idle accounts, least recently
  /// used first, while the ring bytes over all accounts pass the bound.
  ///
  /// Neither the total nor the idle accounts take a pass over every account: the total is a running tally (a pass
  /// visited 2,000 accounts every 2 s, 4.6 % of a per-user relay's CPU under load), and the idle accounts are kept
  /// apart as their loops stop and start (picking them out of every account took 0.7-1.1 ms of the loop every 2 s
  /// at 9,010 accounts as soon as one was idle).
  func enforceBounds() {
    checkKeptApart()
    for account in idleAccounts.values { account.feed.assumeIsolated { $0.evictExpired() } }
    var total = rings.bytes
    #if DEBUG
      let scanned = accounts.values.reduce(0) { $0 + $1.feed.assumeIsolated { $0.ringBytes } }
      assert(total == scanned, "ring byte tally \(total) != \(scanned) over the accounts' rings")
    #endif
    stats.ringBytes = total
    guard total > settings.maxTotalRingBytes else { return }
    let idle = idleAccounts.values.filter { $0.subscribers == 0 }.sorted { $0.lastUsed < $1.lastUsed }
    for account in idle where total > settings.maxTotalRingBytes {
      total -= account.feed.assumeIsolated { $0.ringBytes }
      evict(account, reason: "max_total_ring_bytes")
    }
    if total > settings.maxTotalRingBytes {
      total -= shrinkRings(by: total - settings.maxTotalRingBytes * 9 / 10)
    }
    stats.ringBytes = total
  }

  /// Every account left is in use: the largest rings give up their oldest events (half of each at most per pass)
  /// until `excess` bytes are freed. A resume from before what was dropped gets `reset` `too_old`, as with any
  /// ring eviction. Returns the bytes freed.
  func shrinkRings(by excess: Int) -> Int {
    var sizes = accounts.values.map { account in (account, account.feed.assumeIsolated { $0.ringBytes }) }
    sizes.sort { $0.1 > $1.1 }
    var freed = 0
    for (account, size) in sizes where freed < excess && size > 0 {
      let give = min(excess - freed, max(1, size / 2))
      freed += account.feed.assumeIsolated { $0.shrinkRing(toBytes: size - give) }
    }
    stats.ringTrims += 1
    logger.limited(
      .warning, "ring bytes over all accounts passed the bound with every account in use: oldest events dropped",
      metadata: ["freed": String(freed), "bound": String(settings.maxTotalRingBytes)], limiter: &logLimiter)
    return freed
  }

  // MARK: Introspection and shutdown

  /// Every account's figures, read from running totals (`AccountTotals`, the rings' `RingTally`) without
  /// visiting the accounts. On a store shared across nodes, the accounts' lease owners' figures are summed by
  /// visiting every account here, in one piece (`/metrics` does it in turns: `statisticsInTurns`).
  public func statistics() -> Statistics {
    var replication = ReplicationTally()
    if upstream.store.sharedAcrossNodes {
      for account in accounts.values { replication.add(account) }
    }
    return finish(replication)
  }

  /// `statistics()` for `/metrics`. The running totals need no walk; on a store shared across nodes the lease
  /// owners' figures are summed in turns, the loop serving everything else between turns (a walk over 9,000
  /// accounts in one piece was a ~16-ms stall every stream felt). A turn ends after `turn` accounts or after
  /// `budget` seconds, whichever comes first: the accounts' objects are cold, and what one costs to visit varies with
  /// the machine and its load (1.8 µs each measured here, ~4 µs under a profiler).
  ///
  /// An account that appears during the walk is counted at the next scrape; one evicted during it is still counted
  /// from its (stopped) owner. The walk shares the table's storage (`forEachAccountInTurns`).
  public func statisticsInTurns(turn: Int? = nil, budget: Double = 0.002) async -> Statistics {
    var replication = ReplicationTally()
    if upstream.store.sharedAcrossNodes {
      await forEachAccountInTurns(turn: turn ?? settings.accountsPerWalkTurn, budget: budget) { replication.add($0) }
    }
    return finish(replication)
  }

  /// Visits every account kept when the walk starts, in loop turns of at most `turn` accounts or `budget` seconds,
  /// whichever comes first (`statisticsInTurns` says why both). The accounts are taken by sharing the table's
  /// storage: a change to the table while a walk holds it copies the table once, in the job that changes it.
  func forEachAccountInTurns(turn: Int, budget: Double = 0.002, _ visit: (Account) -> Void) async {
    let walk = accounts
    var inTurn = 0
    var turnStarted = MonotonicClock.seconds()
    for account in walk.values {
      // The clock is read every 32 accounts: a read costs about what summing one account does.
      if inTurn == turn || (inTurn > 0 && inTurn % 32 == 0 && MonotonicClock.seconds() - turnStarted >= budget) {
        await loop.nextTurn()
        inTurn = 0
        turnStarted = MonotonicClock.seconds()
      }
      visit(account)
      inTurn += 1
    }
  }

  /// `statisticsInTurns`, one walk at a time: a scrape that arrives while a walk runs gets that walk's figures (begun
  /// at most one walk's time before it asked), so several scrapers at once cost one walk, not one each. Without a
  /// store shared across nodes there is nothing to walk: the running totals are read at once, with no task.
  public func sharedStatisticsInTurns(turn: Int? = nil) async -> Statistics {
    guard upstream.store.sharedAcrossNodes else { return statistics() }
    if let walk = statisticsWalk { return await walk.value }
    let walk = Task {
      let statistics = await statisticsInTurns(turn: turn)
      statisticsWalk = nil
      return statistics
    }
    statisticsWalk = walk
    return await walk.value
  }

  private func finish(_ replication: ReplicationTally) -> Statistics {
    checkTotals()
    var snapshot = stats
    snapshot.activeAccounts = activeCount
    snapshot.retainedAccounts = accounts.count
    snapshot.pendingChecks = checking.count
    snapshot.pollsInFlight = totals.pollsInFlight
    snapshot.maxPollsInFlightPerAccount = totals.maxPollsInFlight
    // The feeds count their subscribers as they attach and leave, and tell the account (`subscribersChanged`) then.
    snapshot.subscribers = totals.feeds.subscribersConnected
    var feeds = totals.feeds
    // Every account's events count under one label: one per account would make the metric's cardinality unbounded.
    feeds.eventsPublishedByStream = feeds.eventsPublished > 0 ? ["accounts": feeds.eventsPublished] : [:]
    feeds.ringEvents = rings.events
    feeds.ringBytes = rings.bytes
    feeds.ringEvicted = rings.evicted
    snapshot.feeds = feeds
    snapshot.replication = replication.figures
    snapshot.leasesHeld = replication.leasesHeld
    (snapshot.requestsKeptAlive, snapshot.requestsThroughLibcurl) = transports.requests
    return snapshot
  }

  /// What the running totals hold, summed by visiting every kept account instead: the gauges must be equal, and the
  /// counters at least the kept accounts' sum (the totals keep evicted accounts' counts too).
  func summedOverAccounts() -> (subscribers: Int, pollsInFlight: Int, feeds: FeedStatistics) {
    var subscribers = 0
    var inFlight = 0
    var feeds = FeedStatistics()
    for account in accounts.values {
      subscribers += account.subscribers
      feeds.absorb(account.feed.assumeIsolated { $0.statistics() })
      inFlight += account.worker?.assumeIsolated { $0.statistics.pollsInFlight } ?? 0
    }
    return (subscribers, inFlight, feeds)
  }

  /// A debug build checks the running totals against a visit of every account on every read.
  func checkTotals() {
    #if DEBUG
      let summed = summedOverAccounts()
      let held = (totals.feeds.subscribersConnected, totals.pollsInFlight)
      let visited = (summed.feeds.subscribersConnected, summed.pollsInFlight)
      assert(held == visited, "running totals \(held) != \(visited) over the accounts")
      assert(
        summed.subscribers == summed.feeds.subscribersConnected,
        "the accounts count \(summed.subscribers) subscribers, their feeds \(summed.feeds.subscribersConnected)")
      assert(
        (rings.events, rings.bytes) == (summed.feeds.ringEvents, summed.feeds.ringBytes),
        "ring tally \((rings.events, rings.bytes)) != \((summed.feeds.ringEvents, summed.feeds.ringBytes))")
      let counters: [(String, Int, Int)] = [
        ("subscribersTotal", totals.feeds.subscribersTotal, summed.feeds.subscribersTotal),
        ("eventsPublished", totals.feeds.eventsPublished, summed.feeds.eventsPublished),
        ("replayedEvents", totals.feeds.replayedEvents, summed.feeds.replayedEvents),
        ("resumes", totals.feeds.resumes, summed.feeds.resumes),
        ("heartbeatsSent", totals.feeds.heartbeatsSent, summed.feeds.heartbeatsSent),
        ("bytesQueued", totals.feeds.bytesQueued, summed.feeds.bytesQueued),
        ("slowConsumerDisconnects", totals.feeds.slowConsumerDisconnects, summed.feeds.slowConsumerDisconnects),
        ("agedOut", totals.feeds.agedOut, summed.feeds.agedOut),
        ("grantsEnded", totals.feeds.grantsEnded, summed.feeds.grantsEnded),
        ("storeFailures", totals.feeds.storeFailures, summed.feeds.storeFailures),
        ("ringEvicted", rings.evicted, summed.feeds.ringEvicted),
      ]
      for (name, held, visited) in counters {
        assert(held >= visited, "running total of \(name) \(held) < \(visited) over the kept accounts")
      }
    #endif
  }

  /// `/readyz`: not ready while the legacy API could not be reached for the last key check and no account's loop
  /// is live (new subscribers would all get 503); ready otherwise.
  public func readiness() -> (ready: Bool, reason: String) {
    let live = accounts.values.contains { $0.worker?.assumeIsolated { $0.state == .live } ?? false }
    if let failed = lastUnreachable, failed > lastReached ?? 0, !live {
      return (false, "the legacy API could not be reached to check a key, and no account is live")
    }
    return (true, "per-user relaying: \(activeCount) accounts active")
  }

  /// The account with this key (`user:<id>`), if kept (tests, introspection).
  public func account(_ key: String) -> Account? { accounts[key] }

  /// Stops every loop (nothing new is admitted), then ends every account's streams, spread over `spread`
  /// seconds. Returns how many streams were ended.
  public func shutdown(comment: String, spread: Double) async -> Int {
    stopped = true
    boundsTimer = nil
    recheckTimer = nil
    for account in accounts.values {
      account.graceTimer = nil
      stopLoop(account)
    }
    var ended = 0
    for account in accounts.values {
      ended += await account.feed.finishAll(comment: comment, spread: spread)
    }
    return ended
  }
}

/// The accounts' lease owners' figures on a store shared across nodes, summed one account at a time (on the loop).
struct ReplicationTally {
  var figures: FeedReplica.Statistics?
  var leasesHeld: Int?

  mutating func add(_ account: AccountHub.Account) {
    guard let (statistics, role) = account.owner.replicationOnLoop() else { return }
    figures = figures ?? FeedReplica.Statistics()
    figures?.absorb(statistics)
    leasesHeld = (leasesHeld ?? 0) + (role == .leader ? 1 : 0)
  }
}
