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
    public fileprivate(set) var worker: UpstreamWorker?
    /// Where a stopped loop left off.
    fileprivate var position: UpstreamWorker.Position?
    /// The streams the session said the account reads, before its loop's first preparation.
    fileprivate var identifiedStreams: [String]
    /// Keys accepted for this account while it is active (digest → key, when checked).
    fileprivate var credentials: [CredentialDigest: (credential: String, checkedAt: Double)] = [:]
    /// The key the loop polls with.
    fileprivate var activeCredential: String?
    fileprivate(set) var subscribers = 0
    fileprivate var lastUsed: Double
    fileprivate var graceTimer: LoopTimer?
    /// An API without a session step accepts any key until its first poll: who brought the key, so that a
    /// refusal of that first poll counts against that address like a refused check.
    fileprivate var unverifiedFrom: String?

    fileprivate init(key: String, label: String, feed: Feed, owner: any FeedOwner, streams: [String], now: Double) {
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
    /// Every account's feed counted together (accounts evicted earlier included, so counters never go down;
    /// gauges such as subscribers and ring sizes cover kept accounts only).
    public var feeds = FeedStatistics()
  }

  /// Counters of evicted accounts' feeds.
  private var retiredFeeds = FeedStatistics()

  private let upstream: Upstream
  public nonisolated let settings: Settings
  private let logger: Logger
  /// The libcurl multi handles the accounts' loops share (Upstream/TransportPool).
  private let transports: TransportPool
  private var accounts: [String: Account] = [:]
  private var activeCount = 0
  /// Refused keys, and the account of each accepted key of an active account (by digest only).
  private var verdicts: KeyVerdicts
  /// Checks in flight, by credential: later askers wait for the same answer.
  /// Key checks under way: the task asking the upstream, and the subscribers waiting for its answer (by number).
  /// When the last waiter leaves (its client went away), the check is cancelled and its slot freed: a vanished
  /// client used to hold a slot until the upstream timed out, and new subscribers got 503 `busy` meanwhile.
  private var checking: [CredentialDigest: PendingCheck] = [:]
  private var nextWaiter = 0

  private final class PendingCheck {
    var waiters: [Int: CheckedContinuation<Outcome, Never>] = [:]
    var task: Task<Void, Never>?
  }
  private var stats = Statistics()
  private var random = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  private let digestSalt = (UInt64.random(in: 0...UInt64.max), UInt64.random(in: 0...UInt64.max))
  private var nextLabel = 1
  /// Highest id any evicted account's feed handed out: a new feed starts above it, so ids are never reused.
  private var highWater: UInt64 = 0
  private var boundsTimer: LoopTimer?
  private var recheckTimer: LoopTimer?
  /// Keys whose re-check is under way.
  private var rechecking: Set<CredentialDigest> = []
  private var logLimiter = LogLimiter()
  private var stopped = false
  /// When a key check last reached the legacy API (any answer), and when one last could not.
  private var lastReached: Double?
  private var lastUnreachable: Double?

  /// Makes the hub and its shared upstream transport (one libcurl multi handle for every account). Call on the
  /// loop's executor (`loop.submit`).
  public init(loop: EventLoop, upstream: Upstream, settings: Settings, logger: Logger) throws(UpstreamError) {
    loop.assertOnLoop()
    self.loop = loop
    self.upstream = upstream
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

  /// Re-checks, every `credentialCacheSeconds`, each key that keeps a stream open but is not the one its account's
  /// loop polls with (that one is checked by every poll). A secondary key revoked while another key keeps the
  /// account polling used to go on reading for as long as that lasted: now its streams end with
  /// `credential-revoked` within about `credentialCacheSeconds`.
  private func recheckKeys() {
    guard !stopped else { return }
    let now = MonotonicClock.seconds()
    for account in accounts.values where account.isActive {
      let open = account.feed.assumeIsolated { $0.openGrants }
      let polls = account.pollsHere
      for (digest, entry) in account.credentials
      where open.contains(digest.hex) && !rechecking.contains(digest)
        && verdicts.recheckDue(
          checkedAt: entry.checkedAt, now: now, pollsWithIt: polls && entry.credential == account.activeCredential)
      {
        rechecking.insert(digest)
        let credential = entry.credential
        Task { await self.recheck(credential, digest: digest, of: account) }
      }
    }
  }

  private func recheck(_ credential: String, digest: CredentialDigest, of account: Account) async {
    defer { rechecking.remove(digest) }
    let adapter = upstream.makeAdapter(credential)
    do throws(UpstreamError) {
      _ = try await adapter.identify(makeClient(credential), isolation: self)
      account.credentials[digest]?.checkedAt = MonotonicClock.seconds()
    } catch {
      // Only the upstream's own refusal counts; when it could not tell (down, timeout) the key stays.
      if case .status(let code) = error.kind, code == 401 || code == 403 { secondaryKeyRefused(digest, of: account) }
    }
  }

  private func secondaryKeyRefused(_ digest: CredentialDigest, of account: Account) {
    stats.revocations += 1
    account.credentials[digest] = nil
    verdicts.forget(digest, of: account.key)
    remember(refusal: digest)
    let data = JSONText.object([
      "reason": JSONText.quoted("credential_revoked"),
      "message": JSONText.quoted("the upstream refused this key: reconnect with a valid one"),
    ])
    let ended = account.feed.assumeIsolated { $0.endAll(type: "credential-revoked", data: data, grant: digest.hex) }
    logger.warning(
      "a key of an account was refused by the upstream on its re-check: its streams ended",
      metadata: ["account": account.label, "streams": String(ended)])
  }

  // MARK: Credentials

  /// The answer known without asking the upstream: a refused key within its cache time, or an accepted key of an
  /// active account. Nil when the upstream must be asked (`resolve`).
  public func cached(_ credential: String) -> Outcome? {
    let digest = CredentialDigest(credential, salt: digestSalt)
    let now = MonotonicClock.seconds()
    if verdicts.isRefused(digest, now: now) {
      stats.credentialChecks["refused_cached", default: 0] += 1
      return .refused(reason: "invalid_credential")
    }
    // The key the account's loop polls with is checked by every poll (a refusal stops the loop and forgets it), so
    // it needs no legacy call of its own: a second subscriber of an account used to open a second legacy session.
    guard let key = verdicts.account(of: digest), let account = accounts[key], account.isActive,
      let entry = account.credentials[digest], entry.credential == credential,
      verdicts.trusts(
        checkedAt: entry.checkedAt, now: now,
        pollsWithIt: credential == account.activeCredential && account.pollsHere)
    else { return nil }
    stats.credentialChecks["accepted_cached", default: 0] += 1
    account.lastUsed = now
    return .admitted(account)
  }

  /// Checks `credential` with the upstream (or joins the check already running for it), then starts or finds
  /// its account.
  public func resolve(_ credential: String, address: String? = nil) async -> Outcome {
    if let known = cached(credential) { return known }
    guard !stopped else { return .unavailable }
    let digest = CredentialDigest(credential, salt: digestSalt)
    let pending: PendingCheck
    if let running = checking[digest] {
      pending = running
    } else {
      guard checking.count < settings.maxPendingChecks else {
        stats.credentialChecks["busy", default: 0] += 1
        return .busy
      }
      pending = PendingCheck()
      checking[digest] = pending
      // Its own task, so no waiter's cancellation cancels it; only the last waiter leaving does (`leave`).
      pending.task = Task { [weak pending] in
        let outcome = await self.check(credential, digest: digest, address: address)
        guard let pending, self.checking[digest] === pending else { return }
        self.checking[digest] = nil
        for waiter in pending.waiters.values { waiter.resume(returning: outcome) }
        pending.waiters.removeAll()
      }
    }
    nextWaiter += 1
    let waiter = nextWaiter
    let loop = loop
    return await withTaskCancellationHandler {
      await withCheckedContinuation { continuation in
        pending.waiters[waiter] = continuation
        if Task.isCancelled { leave(digest, waiter: waiter) }
      }
    } onCancel: {
      loop.execute { [weak self] in
        self?.assumeIsolated { $0.leave(digest, waiter: waiter) }
      }
    }
  }

  /// A waiter's client went away: its wait ends, and with the last one the check is cancelled.
  private func leave(_ digest: CredentialDigest, waiter: Int) {
    guard let pending = checking[digest], let continuation = pending.waiters.removeValue(forKey: waiter) else { return }
    continuation.resume(returning: .unavailable)
    guard pending.waiters.isEmpty else { return }
    checking[digest] = nil
    pending.task?.cancel()
    stats.credentialChecks["abandoned", default: 0] += 1
  }

  private func check(_ credential: String, digest: CredentialDigest, address: String?) async -> Outcome {
    let adapter = upstream.makeAdapter(credential)
    let client = makeClient(credential)
    let identity: UpstreamIdentity?
    do {
      identity = try await adapter.identify(client, isolation: self)
    } catch {
      switch error.kind {
      case .cancelled:
        return .unavailable  // every waiter left: nobody is told, and the upstream is not judged by it
      case .status(401), .status(403):
        lastReached = MonotonicClock.seconds()
        stats.credentialChecks["refused", default: 0] += 1
        remember(refusal: digest)
        return .refused(reason: "invalid_credential")
      default:
        lastUnreachable = MonotonicClock.seconds()
        stats.credentialChecks["unavailable", default: 0] += 1
        logger.limited(
          .warning, "could not check a subscriber's credential with the upstream",
          metadata: ["error": error.description], limiter: &logLimiter)
        return .unavailable
      }
    }
    stats.credentialChecks["accepted", default: 0] += 1
    lastReached = MonotonicClock.seconds()
    let key = identity.map { "user:\($0.user)" } ?? upstream.accountKeys.key(for: credential)
    var restored: StoredFeed?
    if accounts[key] == nil && upstream.store.isDurable {
      // An account not in memory may be in the store (it was here before a restart): read off the loop.
      switch await load(key) {
      case .success(let stored): restored = stored
      case .failure(let error):
        stats.credentialChecks["unavailable", default: 0] += 1
        logger.limited(
          .error, "cannot read an account from the store", metadata: ["error": error.description],
          limiter: &logLimiter)
        return .unavailable
      }
    }
    let outcome = activate(
      key: key, label: identity?.user, streams: identity?.streams ?? adapter.defaultStreams, credential: credential,
      digest: digest, adapter: adapter, client: client, restored: restored)
    if identity == nil, case .admitted(let account) = outcome { markUnverified(account, from: address) }
    return outcome
  }

  /// Remembers who brought the key of an account whose loop has not completed a poll yet.
  private func markUnverified(_ account: Account, from address: String?) {
    guard account.unverifiedFrom == nil,
      account.worker?.assumeIsolated({ $0.statistics.lastPollCompleted }) == nil
    else { return }
    account.unverifiedFrom = address
  }

  private var unverifiedRefusal: (@Sendable (String) -> Void)?

  /// Called (on the loop) with the address that brought a key an API without a session step refused on its first
  /// poll: the server counts it as a failed check, so random keys cannot buy upstream calls without limit.
  public func onUnverifiedKeyRefused(_ handler: @escaping @Sendable (String) -> Void) {
    unverifiedRefusal = handler
  }

  private func makeClient(_ credential: String) -> UpstreamClient {
    UpstreamClient(
      transport: transports.transport(),
      interceptors: [
        AuthInterceptor(apiKey: credential), LoggingInterceptor(logger: logger, secrets: [credential]),
      ])
  }

  private func remember(refusal digest: CredentialDigest) {
    verdicts.refuse(digest, now: MonotonicClock.seconds())
  }

  // MARK: Accounts

  /// The store's name of an account's feed.
  static func storeKey(_ key: String) -> String { "account:\(key)" }

  private func load(_ key: String) async -> Result<StoredFeed?, StoreError> {
    let store = upstream.store
    return await withCheckedContinuation { continuation in
      store.load(feed: Self.storeKey(key)) { continuation.resume(returning: $0) }
    }
  }

  /// - Parameter restored: what the store held for a new account (ignored when the account exists by now: another
  ///   check of one of its keys made it while this one read the store).
  private func activate(
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
        loop: loop, settings: upstream.feed, ids: ids, store: store, storeKey: Self.storeKey(key), restored: restored)
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

  private func full() -> Outcome {
    stats.credentialChecks["full", default: 0] += 1
    logger.limited(
      .warning, "account limit reached: refusing a new account with 503",
      metadata: [
        "active": String(activeCount), "max_active": String(settings.maxActiveAccounts),
        "retained": String(accounts.count), "max_retained": String(settings.maxRetainedAccounts),
      ], limiter: &logLimiter)
    return .full
  }

  private func startLoop(_ account: Account, adapter: UpstreamAdapter, client: UpstreamClient, credential: String) {
    var workerSettings = upstream.worker
    workerSettings.stopWhenKeyRefused = true
    workerSettings.idleAfter = nil  // the hub runs the grace period
    var workerLogger = logger
    workerLogger.label = "upstream.\(account.label)"
    let worker = UpstreamWorker(
      loop: loop, feed: account.feed, client: client, adapter: adapter, settings: workerSettings,
      logger: workerLogger, random: SeededRandom(seed: random.next()))
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
    account.activeCredential = credential
    account.feed.assumeIsolated { $0.start() }
    activeCount += 1
    stats.accountStarts += 1
  }

  /// Stops the account's loop and forgets its keys; its ring and cursors stay.
  private func stopLoop(_ account: Account) {
    guard let worker = account.worker else { return }
    worker.assumeIsolated { worker in
      if let position = worker.position() { account.position = position }
    }
    // Stops the worker, and gives up the account's lease when this node held it.
    account.owner.stopOnLoop()
    account.worker = nil
    account.activeCredential = nil
    for digest in account.credentials.keys { verdicts.forget(digest, of: account.key) }
    account.credentials = [:]
    activeCount -= 1
    stats.accountStops += 1
  }

  private func subscribersChanged(_ account: Account, _ count: Int) {
    account.subscribers = count
    account.lastUsed = MonotonicClock.seconds()
    if count > 0 {
      account.graceTimer = nil
    } else {
      armGrace(account)
    }
  }

  private func armGrace(_ account: Account) {
    let timer = LoopTimer(loop: loop) { [weak self, weak account] in
      guard let account else { return }
      self?.assumeIsolated { $0.graceEnded(account) }
    }
    timer.schedule(after: settings.grace)
    account.graceTimer = timer
  }

  private func graceEnded(_ account: Account) {
    account.graceTimer = nil
    guard account.subscribers == 0 else { return }
    if account.isActive {
      logger.info("account idle: its upstream loop stops", metadata: ["account": account.label])
      stopLoop(account)
    }
    account.feed.assumeIsolated { $0.pause() }
  }

  private func keyRefused(_ account: Account) {
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

  /// Stops an account still in its grace period (the least recently used) when the active bound is reached.
  private func makeRoomForActive() -> Bool {
    guard activeCount >= settings.maxActiveAccounts else { return true }
    guard
      let victim = accounts.values.filter({ $0.isActive && $0.subscribers == 0 }).min(by: {
        $0.lastUsed < $1.lastUsed
      })
    else { return false }
    logger.info("account limit reached: stopping an account in its grace period", metadata: ["account": victim.label])
    victim.graceTimer = nil
    stopLoop(victim)
    victim.feed.assumeIsolated { $0.pause() }
    return activeCount < settings.maxActiveAccounts
  }

  private func makeRoomForRetained() -> Bool {
    guard accounts.count >= settings.maxRetainedAccounts else { return true }
    guard let victim = leastRecentlyUsedIdle() else { return false }
    evict(victim, reason: "max_retained_accounts")
    return accounts.count < settings.maxRetainedAccounts
  }

  private func leastRecentlyUsedIdle() -> Account? {
    accounts.values.filter { !$0.isActive && $0.subscribers == 0 }.min { $0.lastUsed < $1.lastUsed }
  }

  private func evict(_ account: Account, reason: String) {
    let final = account.feed.assumeIsolated { $0.statistics() }
    highWater = max(highWater, final.headID)
    retiredFeeds.absorb(
      FeedStatistics(
        subscribersTotal: final.subscribersTotal, eventsPublished: final.eventsPublished,
        replayedEvents: final.replayedEvents, resumes: final.resumes, resetsByReason: final.resetsByReason,
        slowConsumerDisconnects: final.slowConsumerDisconnects, agedOut: final.agedOut,
        heartbeatsSent: final.heartbeatsSent, bytesQueued: final.bytesQueued, ringEvicted: final.ringEvicted))
    account.graceTimer = nil
    account.feed.assumeIsolated { $0.pause() }
    upstream.store.drop(feed: account.feed.storeKey)
    accounts[account.key] = nil
    stats.retainedAccounts = accounts.count
    stats.evictions[reason, default: 0] += 1
    logger.info("account evicted: its ring is dropped", metadata: ["account": account.label, "reason": reason])
  }

  /// Ages the rings of idle accounts (their feeds' timers are stopped) and evicts idle accounts, least recently
  /// used first, while the ring bytes over all accounts pass the bound.
  private func enforceBounds() {
    var total = 0
    for account in accounts.values {
      total += account.feed.assumeIsolated { feed in
        if !account.isActive { feed.evictExpired() }
        return feed.ringBytes
      }
    }
    stats.ringBytes = total
    guard total > settings.maxTotalRingBytes else { return }
    let idle = accounts.values.filter { !$0.isActive && $0.subscribers == 0 }.sorted { $0.lastUsed < $1.lastUsed }
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
  private func shrinkRings(by excess: Int) -> Int {
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

  public func statistics() -> Statistics {
    var snapshot = stats
    snapshot.activeAccounts = activeCount
    snapshot.retainedAccounts = accounts.count
    snapshot.pendingChecks = checking.count
    var inFlight = 0
    var maxPerAccount = 0
    var subscribers = 0
    var feeds = retiredFeeds
    for account in accounts.values {
      subscribers += account.subscribers
      feeds.absorb(account.feed.assumeIsolated { $0.statistics() })
      guard let worker = account.worker else { continue }
      let (now, most) = worker.assumeIsolated { ($0.statistics.pollsInFlight, $0.statistics.maxPollsInFlight) }
      inFlight += now
      maxPerAccount = max(maxPerAccount, most)
    }
    snapshot.pollsInFlight = inFlight
    snapshot.maxPollsInFlightPerAccount = maxPerAccount
    snapshot.subscribers = subscribers
    snapshot.feeds = feeds
    return snapshot
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

/// A credential's keyed digest: what the hub files keys under, so that a refused key is remembered without being
/// kept. 128 bits from two independently salted SipHash runs (Swift's `Hasher`, itself randomly seeded per
/// process): not a cryptographic commitment, a map key no outsider can aim collisions at.
struct CredentialDigest: Hashable, Sendable {
  let high: UInt64
  let low: UInt64

  init(_ credential: String, salt: (UInt64, UInt64)) {
    var first = Hasher()
    first.combine(salt.0)
    first.combine(credential)
    var second = Hasher()
    second.combine(salt.1)
    second.combine(credential)
    high = UInt64(bitPattern: Int64(first.finalize()))
    low = UInt64(bitPattern: Int64(second.finalize()))
  }

  /// 32 hex digits (each half padded: unpadded halves could spell one string for two digests).
  var hex: String {
    (withUnsafeBytes(of: high.bigEndian, Array.init) + withUnsafeBytes(of: low.bigEndian, Array.init)).lowercaseHex
  }
}

extension UpstreamAdapter {
  /// The streams an adapter without a session step reads (the generic adapter's one stream).
  var defaultStreams: [String] {
    (self as? GenericAdapter).map { [$0.settings.stream] } ?? []
  }
}
