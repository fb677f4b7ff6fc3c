import Foundation

/// Per-user relaying (`auth.mode = upstream`): one feed and one upstream loop per legacy account, shared by every
/// connection of that account, whichever of its keys the connection presents.
///
/// - A subscriber's credential is checked once with the legacy API (the chat API's session call says whose it
///   is). The session that check opened becomes the account's own when the account starts, so a first visit costs
///   one session. A refused credential is remembered for `credentialCacheSeconds` (a retry costs no legacy call);
///   an accepted one is trusted as long as its account is active, re-checked on a new connection after the same
///   time.
/// - An account's loop starts with its first subscriber and keeps polling for `grace` seconds after its last one
///   leaves (a page reload resumes with no gap); then it stops and the account's keys are forgotten. Its ring stays
///   for resumes, and its cursors: a subscriber who comes back later is sent what arrived meanwhile.
/// - Bounds: active accounts (`maxActiveAccounts`; accounts still in their grace period make room first), kept
///   accounts (`maxRetainedAccounts`) and ring bytes over all accounts (`maxTotalRingBytes`); idle accounts are
///   evicted least recently used first, and a resume into an evicted account gets `reset` `too_old`.
/// - A key the upstream refuses while its account polls (revoked) ends the account's streams with a last
///   `event: credential-revoked`. Clients whose key still works reconnect with their Last-Event-ID and lose nothing.
///
/// Runs on the event loop, like the feeds, workers and the server it serves.
public actor AccountHub {
  public nonisolated let loop: EventLoop
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  public struct Settings: Sendable, Equatable {
    /// Accounts polling at once.
    public var maxActiveAccounts = 10_000
    /// Accounts kept with their ring for resumes, active or idle.
    public var maxRetainedAccounts = 50_000
    /// Ring bytes summed over all accounts.
    public var maxTotalRingBytes = 256 << 20
    /// How long an account keeps polling after its last subscriber left.
    public var grace = 30.0
    /// How long a refused credential is answered from memory, and an accepted one trusted before a new
    /// connection checks it again.
    public var credentialCacheSeconds = 30.0
    /// Credential checks waiting for the legacy API at once; beyond, 503 `busy`.
    public var maxPendingChecks = 1000
    /// Refused credentials remembered (by digest) at most.
    public var refusedCapacity = 10_000
    /// Accounts a walk over all of them (a `/metrics` scrape, the periodic key re-check) visits in one loop turn at
    /// most; a turn also ends after 2 ms. Not a configuration key: tests set 1 to spread a few accounts over turns.
    public var accountsPerWalkTurn = 1000
    public init() {}
  }

  /// How each account's upstream side is made.
  public struct Upstream: Sendable {
    /// An adapter that sends `credential` (the chat API's session call, a generic header template).
    public var makeAdapter: @Sendable (_ credential: String) -> UpstreamAdapter
    public var worker: UpstreamWorker.Settings
    public var feed: FeedSettings
    public var maxBodyBytes: Int
    /// Where each account's ring, ids and cursors live (`store.kind`): an account that comes back after a restart
    /// resumes from what was stored for it.
    public var store: EventStore
    /// Names accounts without a user id: from `store`'s kept secret (`Relay.start` reads it), else fresh.
    var accountKeys = AccountKeys(secret: AccountKeys.freshSecret())
    /// A store shared across nodes: each account's poller lease (`EventStore.owner`).
    public var leaseSeconds = 5.0

    public init(
      makeAdapter: @escaping @Sendable (_ credential: String) -> UpstreamAdapter, worker: UpstreamWorker.Settings,
      feed: FeedSettings, maxBodyBytes: Int = 8 << 20, store: EventStore = MemoryEventStore()
    ) {
      self.makeAdapter = makeAdapter
      self.worker = worker
      self.feed = feed
      self.maxBodyBytes = maxBodyBytes
      self.store = store
    }
  }

  /// The answer to a credential.
  public enum Outcome: Sendable {
    case admitted(Account)
    /// 401: the upstream refused the credential (`reason` for the body and metrics).
    case refused(reason: String)
    /// 503: the upstream could not tell (unreachable, failing, answering nonsense).
    case unavailable
    /// 503: too many accounts (active or kept) to start another.
    case full
    /// 503: too many checks waiting for the upstream.
    case busy
  }

  /// One legacy account: its feed (ring and ids), and while active its upstream loop and keys.
  public final class Account: @unchecked Sendable {  // loop-confined
    /// `user:<id>`, or `credential:<digest>` for an API without a session step.
    public let key: String
    /// What logs and metrics may show: the user id, or `account-<n>`.
    public let label: String
    public let feed: Feed
    /// Who polls the account: this node (`LocalOwner`), or on a store shared across nodes whichever node serving
    /// the account holds its lease (the others follow its stream).
    let owner: any FeedOwner
    public var worker: UpstreamWorker?
    /// Where a stopped loop left off.
    var position: UpstreamWorker.Position?
    /// The streams the session said the account reads, before its loop's first preparation.
    var identifiedStreams: [String]
    /// Keys accepted for this account while it is active (digest → key, when checked).
    var credentials: [CredentialDigest: (credential: String, checkedAt: Double)] = [:]
    /// The key the loop polls with.
    var activeCredential: String?
    var subscribers = 0
    var lastUsed: Double
    var graceTimer: LoopTimer?
    /// An API without a session step accepts any key until its first poll: who brought the key, so that a
    /// refusal of that first poll counts against that address like a refused check.
    var unverifiedFrom: String?

    init(key: String, label: String, feed: Feed, owner: any FeedOwner, streams: [String], now: Double) {
      self.key = key
      self.label = label
      self.feed = feed
      self.owner = owner
      self.identifiedStreams = streams
      self.lastUsed = now
    }

    /// The streams this account may read now (its loop follows link changes).
    public var streams: [String] {
      worker?.assumeIsolated { $0.position()?.streams } ?? position?.streams ?? identifiedStreams
    }

    public var isActive: Bool { worker != nil }

    /// Whether this node polls the account now (every poll then checks the key it polls with). A node that
    /// follows another's polling must check its own subscribers' keys itself.
    var pollsHere: Bool { worker?.assumeIsolated { $0.isRunning } ?? false }
  }

  /// What `/metrics` shows.
  public struct Statistics: Sendable {
    public var activeAccounts = 0
    public var retainedAccounts = 0
    public var accountStarts = 0
    public var accountStops = 0
    public var evictions: [String: Int] = [:]
    public var credentialChecks: [String: Int] = [:]
    public var revocations = 0
    public var ringBytes = 0
    public var pendingChecks = 0
    public var pollsInFlight = 0
    public var maxPollsInFlightPerAccount = 0
    public var subscribers = 0
    /// Passes that dropped the oldest events of accounts in use, because the bound over all rings was passed.
    public var ringTrims = 0
    /// Loops restarted because a grace period ended between a subscriber's check and its attach.
    public var restartsBeforeAttach = 0
    /// A store shared across nodes: the accounts' lease owners here, summed (nil otherwise), and how many
    /// accounts this node polls because it holds their lease.
    public var replication: FeedReplica.Statistics?
    public var leasesHeld: Int?
    /// Upstream requests of every account's loop, over kept-alive connections and through libcurl.
    public var requestsKeptAlive = 0
    public var requestsThroughLibcurl = 0
    /// Every account's feed counted together (accounts evicted earlier included, so counters never go down;
    /// gauges such as subscribers and ring sizes cover kept accounts only).
    public var feeds = FeedStatistics()
  }

  /// The walk over the accounts a `/metrics` scrape started on a store shared across nodes
  /// (`sharedStatisticsInTurns`): scrapes that arrive while it runs wait for its figures instead of each walking every
  /// account again.
  var statisticsWalk: Task<Statistics, Never>?

  let upstream: Upstream
  /// Every account's feed and worker share these (their settings, a feed's fixed bytes) rather than each holding a
  /// copy.
  let feedCommon: FeedCommon
  let workerSettings: Shared<UpstreamWorker.Settings>
  public nonisolated let settings: Settings
  let logger: Logger
  /// The libcurl multi handles the accounts' loops share (Upstream/TransportPool).
  let transports: TransportPool
  var accounts: [String: Account] = [:]
  /// The kept accounts whose loop is stopped: what the bounds pass ages and evicts, found without visiting every
  /// account (`enforceBounds`).
  var idleAccounts: [String: Account] = [:]
  /// The kept accounts whose loop runs: every kept account not idle (one count, never kept apart from the set).
  var activeCount: Int { accounts.count - idleAccounts.count }
  /// The active accounts with no subscriber (in their grace period): the ones `makeRoomForActive` may stop, found
  /// without visiting every account (at the active bound, every new account took a pass over all of them).
  var graceAccounts: [String: Account] = [:]
  /// Refused keys, and the account of each accepted key of an active account (by digest only).
  var verdicts: KeyVerdicts
  /// Checks in flight, by credential: later askers wait for the same answer.
  /// Key checks under way: the task asking the upstream, and the subscribers waiting for its answer (by number).
  /// When the last waiter leaves (its client went away), the check is cancelled and its slot freed: a vanished
  /// client used to hold a slot until the upstream timed out, and new subscribers got 503 `busy` meanwhile.
  var checking: [CredentialDigest: PendingCheck] = [:]
  var nextWaiter = 0

  final class PendingCheck {
    var waiters: [Int: CheckedContinuation<Outcome, Never>] = [:]
    var task: Task<Void, Never>?
  }
  var stats = Statistics()
  var random = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  let digestSalt = (UInt64.random(in: 0...UInt64.max), UInt64.random(in: 0...UInt64.max))
  var nextLabel = 1
  /// Highest id any evicted account's feed handed out: a new feed starts above it, so ids are never reused.
  var highWater: UInt64 = 0
  /// The rings of every kept account's feed (bytes and events held, events evicted), kept as the rings change
  /// (`enforceBounds` and `statistics()` read it).
  let rings = RingTally()
  /// Every account's feed and loop figures, kept as they change (`statistics()` reads them).
  let totals = AccountTotals()
  var boundsTimer: LoopTimer?
  var recheckTimer: LoopTimer?
  /// Keys whose re-check is under way.
  var rechecking: Set<CredentialDigest> = []
  /// Whether the periodic walk that finds keys due for a re-check is under way (`recheckKeys`).
  var recheckWalking = false
  var logLimiter = LogLimiter()
  var stopped = false
  /// Told the address that brought a key refused on its first poll (`onUnverifiedKeyRefused`).
  var unverifiedRefusal: (@Sendable (String) -> Void)?
  /// When a key check last reached the legacy API (any answer), and when one last could not.
  var lastReached: Double?
  var lastUnreachable: Double?

  /// Makes the hub and its shared upstream transport (one libcurl multi handle for every account). Call on the
  /// loop's executor (`loop.submit`).
  public init(loop: EventLoop, upstream: Upstream, settings: Settings, logger: Logger) throws(UpstreamError) {
    loop.assertOnLoop()
    self.loop = loop
    self.upstream = upstream
    feedCommon = FeedCommon(upstream.feed, wheelOn: loop, totals: totals)
    var workerSettings = upstream.worker
    workerSettings.stopWhenKeyRefused = true
    workerSettings.idleAfter = nil  // the hub runs the grace period
    self.workerSettings = Shared(workerSettings)
    self.settings = settings
    self.logger = logger
    transports = try TransportPool(
      loop: loop, loops: settings.maxActiveAccounts, maxBodyBytes: upstream.maxBodyBytes, logger: logger)
    verdicts = KeyVerdicts(seconds: settings.credentialCacheSeconds, refusedCapacity: settings.refusedCapacity)
  }

  static let boundsPeriod = 2.0

  /// Starts the periodic bounds check (ring bytes over all accounts, age eviction of idle rings).
  public func start() {
    guard boundsTimer == nil else { return }
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in
      self?.assumeIsolated { $0.enforceBounds() }
    }
    timer.schedule(after: AccountHub.boundsPeriod)
    boundsTimer = timer
    let recheck = LoopTimer(loop: loop, repeating: true) { [weak self] in
      self?.assumeIsolated { $0.recheckKeys() }
    }
    recheck.schedule(after: max(1, settings.credentialCacheSeconds / 2))
    recheckTimer = recheck
  }

  /// What a stream opened with `credential` is granted by (a salted digest, never the key): streams of one key can
  /// be ended when it is revoked.
  public func grant(for credential: String) -> String { CredentialDigest(credential, salt: digestSalt).hex }

  // MARK: Accounts

  /// The store's name of an account's feed.
  static func storeKey(_ key: String) -> String { "account:\(key)" }

  func load(_ key: String) async -> Result<StoredFeed?, StoreError> {
    let store = upstream.store
    return await withCheckedContinuation { continuation in
      store.load(feed: Self.storeKey(key)) { continuation.resume(returning: $0) }
    }
  }

  /// - Parameter restored: what the store held for a new account (ignored when the account exists by now: another
  ///   check of one of its keys made it while this one read the store).
  func activate(
    key: String, label: String?, streams: [String], credential: String, digest: CredentialDigest,
    adapter: UpstreamAdapter, client: UpstreamClient, restored: StoredFeed?
  ) -> Outcome {
    let now = MonotonicClock.seconds()
    let account: Account
    if let known = accounts[key] {
      account = known
      if !account.isActive {
        guard makeRoomForActive() else { return full() }
        startLoop(account, adapter: adapter, client: client, credential: credential)
      }
      // An active account keeps its loop: the session this check opened is simply not used.
    } else {
      guard makeRoomForActive(), makeRoomForRetained() else { return full() }
      let store = upstream.store
      // On a store shared across nodes the feed shows the stored head and issues ids only while this node
      // holds the account's lease, above the stored head (as the shared feed: `Relay.start`).
      let ids =
        store.sharedAcrossNodes
        ? EventIDAllocator(startMicroseconds: 0, persistedAtLeast: restored?.headID ?? 0)
        : EventIDAllocator(persistedAtLeast: max(highWater, restored?.headID ?? 0))
      let feed = Feed(
        loop: loop, common: feedCommon, ids: ids, store: store, storeKey: Self.storeKey(key), restored: restored)
      let name = label ?? "account-\(nextLabel)"
      var ownerLogger = logger
      ownerLogger.label = "store.\(name)"
      let owner = store.owner(
        of: feed, worker: nil, leaseSeconds: upstream.leaseSeconds, logger: ownerLogger, restored: restored)
      account = Account(key: key, label: name, feed: feed, owner: owner, streams: streams, now: now)
      if let restored, let position = restored.position {
        account.position = UpstreamWorker.Position(stored: position, events: restored.events)
      }
      if label == nil { nextLabel += 1 }
      feed.assumeIsolated { feed in
        feed.countRing(toward: rings)
        feed.observeSubscribers { [weak self, weak account] count in
          guard let account else { return }
          self?.assumeIsolated { $0.subscribersChanged(account, count) }
        }
      }
      accounts[key] = account
      stats.retainedAccounts = accounts.count
      startLoop(account, adapter: adapter, client: client, credential: credential)
      logger.info("account started", metadata: ["account": account.label])
    }
    account.credentials[digest] = (credential, now)
    verdicts.accept(digest, account: key)
    account.lastUsed = now
    if account.subscribers == 0 { armGrace(account) }
    return .admitted(account)
  }

  /// Right before a stream attaches to `account`: its loop must run. The check that admitted the subscriber may
  /// have finished some loop turns ago, and a grace period (or room made for another account) may have stopped the
  /// loop meanwhile; it restarts with the subscriber's key. False when the account was evicted meanwhile or there
  /// is no room (the subscriber gets 503 and retries).
  public func ensureActive(_ account: Account, credential: String) -> Bool {
    guard !account.isActive else { return true }
    guard accounts[account.key] === account, makeRoomForActive() else { return false }
    startLoop(
      account, adapter: upstream.makeAdapter(credential), client: makeClient(credential), credential: credential)
    let digest = CredentialDigest(credential, salt: digestSalt)
    account.credentials[digest] = (credential, MonotonicClock.seconds())
    verdicts.accept(digest, account: account.key)
    stats.restartsBeforeAttach += 1
    // If the stream is refused after all (per-account cap, descriptor reserve), the loop still stops in time.
    if account.subscribers == 0 { armGrace(account) }
    return true
  }

  func full() -> Outcome {
    stats.credentialChecks["full", default: 0] += 1
    logger.limited(
      .warning, "account limit reached: refusing a new account with 503",
      metadata: [
        "active": String(activeCount), "max_active": String(settings.maxActiveAccounts),
        "retained": String(accounts.count), "max_retained": String(settings.maxRetainedAccounts),
      ], limiter: &logLimiter)
    return .full
  }

  func startLoop(_ account: Account, adapter: UpstreamAdapter, client: UpstreamClient, credential: String) {
    var workerLogger = logger
    workerLogger.label = "upstream.\(account.label)"
    let worker = UpstreamWorker(
      loop: loop, feed: account.feed, client: client, adapter: adapter, shared: workerSettings,
      logger: workerLogger, random: SeededRandom(seed: random.next()), totals: totals)
    worker.assumeIsolated { worker in
      if let position = account.position { worker.restore(position) }
      worker.onKeyRefused { [weak self, weak account] _ in
        guard let account else { return }
        self?.assumeIsolated { $0.keyRefused(account) }
      }
    }
    // Polls now (this node), or whenever this node holds the account's lease (a shared store).
    account.owner.resumeOnLoop(worker: worker)
    account.worker = worker
    idleAccounts[account.key] = nil
    if account.subscribers == 0, accounts[account.key] === account { graceAccounts[account.key] = account }
    account.activeCredential = credential
    account.feed.assumeIsolated { $0.start() }
    stats.accountStarts += 1
  }

  /// Stops the account's loop and forgets its keys; its ring and cursors stay.
  func stopLoop(_ account: Account) {
    guard let worker = account.worker else { return }
    worker.assumeIsolated { worker in
      if let position = worker.position() { account.position = position }
    }
    // Stops the worker, and gives up the account's lease when this node held it.
    account.owner.stopOnLoop()
    account.worker = nil
    if accounts[account.key] === account { idleAccounts[account.key] = account }
    graceAccounts[account.key] = nil
    account.activeCredential = nil
    for digest in account.credentials.keys { verdicts.forget(digest, of: account.key) }
    account.credentials = [:]
    stats.accountStops += 1
  }

  func subscribersChanged(_ account: Account, _ count: Int) {
    account.subscribers = count
    account.lastUsed = MonotonicClock.seconds()
    if count > 0 {
      account.graceTimer = nil
      graceAccounts[account.key] = nil
    } else {
      if account.isActive, accounts[account.key] === account { graceAccounts[account.key] = account }
      armGrace(account)
    }
  }

  func armGrace(_ account: Account) {
    let timer = LoopTimer(loop: loop) { [weak self, weak account] in
      guard let account else { return }
      self?.assumeIsolated { $0.graceEnded(account) }
    }
    timer.schedule(after: settings.grace, common: true)
    account.graceTimer = timer
  }

  func graceEnded(_ account: Account) {
    account.graceTimer = nil
    guard account.subscribers == 0 else { return }
    if account.isActive {
      logger.info("account idle: its upstream loop stops", metadata: ["account": account.label])
      stopLoop(account)
    }
    account.feed.assumeIsolated { $0.pause() }
  }

  func keyRefused(_ account: Account) {
    stats.revocations += 1
    if let address = account.unverifiedFrom,
      account.worker?.assumeIsolated({ $0.statistics.lastPollCompleted }) == nil
    {
      unverifiedRefusal?(address)
    }
    account.unverifiedFrom = nil
    if let credential = account.activeCredential {
      remember(refusal: CredentialDigest(credential, salt: digestSalt))
    }
    stopLoop(account)
    let data = JSONText.object([
      "reason": JSONText.quoted("credential_revoked"),
      "message": JSONText.quoted("the upstream refused this account's key: reconnect with a valid one"),
    ])
    let ended = account.feed.assumeIsolated { $0.endAll(type: "credential-revoked", data: data) }
    logger.warning(
      "account key refused by the upstream: streams ended",
      metadata: ["account": account.label, "streams": String(ended)])
  }

}
