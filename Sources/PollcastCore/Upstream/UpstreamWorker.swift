import Foundation

/// Runs the long-poll loop against the legacy API and publishes what it receives into the feed.
///
/// The rules come from the long-poll client article (seed 000):
/// - one cycle at a time: session → cursor sync → poll → poll → …; every (re)start bumps `generation`, cancels the
///   cycle's task (and with it the request in flight or the pending retry), and every completion checks its
///   generation before touching state, so a stale answer is a no-op;
/// - exactly one poll in flight, checked and exported;
/// - failures back off with full jitter, reset by a success; a 401 starts a new session at once, an empty poll
///   that ran to its timeout is re-issued at once;
/// - a stream's cursor advances only once its messages are in the feed; anything at or below it is a duplicate;
/// - messages up to the server's newest id at a (re)start are backlog (`backlog: true`).
public actor UpstreamWorker {
  public enum StartFrom: String, Sendable, CaseIterable { case latest, earliest }

  public nonisolated let loop: EventLoop
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
  let feed: Feed
  let client: UpstreamClient
  let adapter: UpstreamAdapter
  /// The adapter as the recipe engine's class, when it is one (every built-in adapter is): polled directly.
  private let recipe: RecipeAdapter?
  var settings: Settings { sharedSettings.value }
  /// The settings, shared with the other workers of a hub (one per account).
  private let sharedSettings: Shared<Settings>
  let logger: Logger
  var random: SeededRandom

  private var generation = 0
  private var cycle: Task<Void, Never>?
  var backoff: Backoff
  var spacing: PollSpacing
  /// The streams, their cursors and the rules that move them.
  var book = CursorBook()
  var cursors: [String: UInt64] { book.cursors }
  private var consecutiveUnauthorized = 0
  private var idleTimer: LoopTimer?
  private var running = false
  /// Whether it polls (started and not stopped).
  public var isRunning: Bool { running }
  private var lastSync = 0.0
  var logLimiter = LogLimiter()
  private var keyRefused: (@Sendable (UpstreamError) -> Void)?
  /// The key was admitted without the API accepting it (no session step checks it): until a poll is answered, a
  /// client error (4xx but 408 and 429) is taken as the key refused, so a made-up key does not stay a polling account
  /// against an API that refuses keys with 404 or 400.
  var keyUnverified = false
  /// `gap` events of the answer being relayed, stored ahead of its first slice (kept for the next try when the store
  /// refused them).
  var unstoredGaps: [FeedEvent] = []
  public internal(set) var state: State = .stopped
  public internal(set) var statistics = UpstreamStatistics()
  /// The totals its polls in flight are added to as well (an account's loop: `AccountTotals`).
  private let totals: AccountTotals?

  public init(
    loop: EventLoop, feed: Feed, client: UpstreamClient, adapter: UpstreamAdapter, settings: Settings, logger: Logger,
    random: SeededRandom = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  ) {
    self.init(
      loop: loop, feed: feed, client: client, adapter: adapter, shared: Shared(settings), logger: logger, random: random
    )
  }

  /// A worker whose settings are shared with others (`AccountHub`'s, one per account).
  init(
    loop: EventLoop, feed: Feed, client: UpstreamClient, adapter: UpstreamAdapter, shared: Shared<Settings>,
    logger: Logger, random: SeededRandom, totals: AccountTotals? = nil
  ) {
    let settings = shared.value
    // The worker publishes with assumeIsolated, and its transport is confined to the loop it was made on.
    precondition(
      feed.loop === loop && client.transport.loop === loop, "the worker, its feed and transport share a loop")
    self.loop = loop
    self.feed = feed
    self.client = client
    self.adapter = adapter
    self.recipe = adapter as? RecipeAdapter
    self.sharedSettings = shared
    self.totals = totals
    self.logger = logger
    self.random = random
    self.backoff = settings.backoff
    self.spacing = PollSpacing(
      minimum: settings.minPollInterval, cap: max(settings.minPollInterval, settings.backoff.cap))
  }

  // MARK: Lifecycle

  /// Starts polling (and, with `idleAfter`, watching the subscriber count).
  public func start() {
    guard !running else { return }
    running = true
    if settings.idleAfter != nil {
      feed.assumeIsolated { feed in
        feed.observeSubscribers { [weak self] count in
          self?.assumeIsolated { $0.subscribersChanged(count) }
        }
      }
      if feed.assumeIsolated({ $0.subscriberCount }) == 0 {
        armIdleTimer()
      }
    }
    beginCycle()
  }

  public func position() -> Position? {
    book.position
  }

  /// Before `start()`: poll on from `position`. What the upstream received meanwhile is relayed as live
  /// (`backlog: false`): it is news the subscribers have not seen, not history from before they came.
  public func restore(_ position: Position) {
    guard !running else { return }
    book = CursorBook(restoring: position)
    adapter.restore(tokens: position.tokens)
  }

  /// Before `start()`: poll on from a position read from the store, the stored events' upstream ids counting as
  /// relayed lately (an upstream that resends its last page after the restart is not relayed twice).
  public func restore(_ stored: FeedPosition, events: [StoredEvent]) {
    let keys = adapter.storedKeys
    restore(Position(stored: stored, events: events, keys: keys?.key, window: keys?.window ?? RecentKeys.capacity))
  }

  /// Called (on the loop) when `settings.stopWhenKeyRefused` is set and the upstream refused the key.
  public func onKeyRefused(_ handler: @escaping @Sendable (UpstreamError) -> Void) {
    keyRefused = handler
  }

  /// Stops polling: cancels the request in flight and any pending retry. Cursors are kept.
  public func stop() {
    running = false
    idleTimer = nil
    endCycle()
    setState(.stopped)
  }

  /// Restarts the cycle from the session step (configuration reload, operator request).
  public func restart() {
    guard running else { return }
    endCycle()
    beginCycle()
  }

  private func beginCycle() {
    generation += 1
    let current = generation
    // On the loop as its task executor: a poll's completion resumes the cycle on the loop thread directly.
    cycle = Task(executorPreference: loop) { await self.runCycle(current) }
  }

  private func endCycle() {
    generation += 1
    cycle?.cancel()
    cycle = nil
    // The task's cancellation reaches the transfer through the loop; cancel here too so nothing of the old
    // cycle is in flight when the next one starts.
    client.cancelAll()
    setPollsInFlight(0)
  }

  /// Sets the polls in flight, and the most at once, here and in `totals`.
  private func setPollsInFlight(_ count: Int) {
    totals?.pollsInFlightChanged(from: statistics.pollsInFlight, to: count)
    statistics.pollsInFlight = count
    statistics.maxPollsInFlight = max(statistics.maxPollsInFlight, count)
  }

  private func isCurrent(_ cycleGeneration: Int) -> Bool {
    cycleGeneration == generation && !Task.isCancelled
  }

  // MARK: Idling

  private func subscribersChanged(_ count: Int) {
    guard running, settings.idleAfter != nil else { return }
    if count > 0 {
      idleTimer = nil
      if state == .idle {
        logger.info("subscriber arrived: resuming upstream polling")
        beginCycle()
      }
    } else if idleTimer == nil {
      armIdleTimer()
    }
  }

  private func armIdleTimer() {
    guard let idleAfter = settings.idleAfter else { return }
    let timer = LoopTimer(loop: loop) { [weak self] in
      self?.assumeIsolated { $0.goIdle() }
    }
    timer.schedule(after: idleAfter)
    idleTimer = timer
  }

  private func goIdle() {
    idleTimer = nil
    guard running, feed.assumeIsolated({ $0.subscriberCount }) == 0 else { return }
    logger.info("no subscribers: upstream polling idles until one arrives")
    endCycle()
    setState(.idle)
  }

  // MARK: The cycle

  // The cycle's own frame holds little: every decision, log line and statistic is in a synchronous, non-inlined
  // step below. An async function's frame holds every value and temporary of its body, and each account's cycle
  // task keeps the deepest chain of frames it ever needed (the task allocator keeps its slabs) for as long as the
  // account lives.
  private func runCycle(_ cycleGeneration: Int) async {
    var needsPreparation = true
    while isCurrent(cycleGeneration) {
      do throws(UpstreamError) {
        if needsPreparation {
          switch try await prepareCycle(cycleGeneration) {
          case .stop: return
          case .again: continue
          case .ready: needsPreparation = false
          }
        }
        pollStarting()
        // On the recipe engine's class, not through the protocol: a protocol's async witness is one more frame in
        // the chain every account keeps while its poll hangs (160 bytes).
        let answer =
          if let recipe {
            try await recipe.poll(client, cursors: cursors, tokens: book.tokens, isolation: self)
          } else {
            try await pollThroughProtocol()
          }
        guard isCurrent(cycleGeneration) else { return }
        pollAnswered(answer)
        guard let wentBackwards = await relay(answer, cycleGeneration) else {
          // The store refused the batch: nothing of it was shown, the cursors did not move, and the next poll
          // (after a backoff) brings the same messages again.
          guard isCurrent(cycleGeneration) else { return }
          await backOffAfterStoreFailure()
          continue
        }
        guard isCurrent(cycleGeneration) else { return }
        switch next(after: answer, wentBackwards: wentBackwards) {
        case .poll:
          break
        case .resync:
          needsPreparation = true
        case .wait(let delay):
          guard await pause(delay) else { return }
        case .space(let delay):
          guard await space(delay) else { return }
        }
      } catch {
        guard isCurrent(cycleGeneration) else { return }
        pollFailed()
        guard error.kind != .cancelled else { return }
        switch failed(error) {
        case .stop:
          return
        case .again:
          needsPreparation = true
        case .wait(let delay):
          guard await pause(delay) else { return }  // cancelled: stop() or a restart
          // After a failure the session or the server may have changed: sync cursors again.
          needsPreparation = true
        }
      }
    }
  }

  /// A poll of an adapter that is not a `RecipeAdapter`, in a frame of its own.
  @inline(never)
  private func pollThroughProtocol() async throws(UpstreamError) -> UpstreamPollAnswer {
    try await adapter.poll(client, cursors: cursors, tokens: book.tokens, isolation: self)
  }

  /// What `prepareCycle` found: the cycle polls on, prepares again (the store refused the notices) or stops.
  private enum Prepared {
    case ready, again, stop
  }

  /// The cycle's (re)start: the session step (in a task of its own, `prepareApart`), then the notices and first
  /// cursors stored. Not inlined into `runCycle`, whose frame every account keeps while its poll hangs.
  @inline(never)
  private func prepareCycle(_ cycleGeneration: Int) async throws(UpstreamError) -> Prepared {
    let hadSessionBefore = preparing()
    let preparation = try await prepareApart()
    guard isCurrent(cycleGeneration) else { return .stop }
    let notices = prepared(preparation, hadSessionBefore: hadSessionBefore)
    // The streams and first cursors are stored before the first poll: a crash before any message arrives still
    // polls on from here, so nothing the upstream receives meanwhile is skipped.
    guard await store(notices, cycleGeneration) else { return .again }
    guard isCurrent(cycleGeneration) else { return .stop }
    lastSync = MonotonicClock.seconds()
    return .ready
  }

  /// Sleeps `delay` seconds; false when cancelled (stop() or a restart).
  @inline(never)
  private func pause(_ delay: Double) async -> Bool {
    do {
      try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
      return true
    } catch {
      return false
    }
  }

  /// Where the cursors stood before an answer was relayed.
  private struct PositionBefore {
    var cursors: [String: UInt64] = [:]
    var tokens: [String: String] = [:]
  }

  /// Where the cursors stood before the last answer was relayed: kept here, not in `runCycle`'s frame, which every
  /// account keeps while its poll hangs.
  private var positionBefore = PositionBefore()

  /// What the cycle does after an answer: poll at once, sync first, wait (the API asked, or a backoff), or space
  /// its polls (the API does not hold them).
  private enum NextStep {
    case poll, resync
    case wait(Double)
    case space(Double)
  }

  /// What the cycle does after a failed call: end (the key was refused), start over at once, or wait first.
  private enum FailureStep {
    case stop, again
    case wait(Double)
  }

  /// Before the session step; whether there was a session already.
  @inline(never)
  private func preparing() -> Bool {
    // After a failure the state stays `backoff` until a poll is answered: a retry is not a new connection.
    if !adapter.hasSession && state != .backoff { setState(.connecting) }
    return adapter.hasSession
  }

  /// After the session step: counts a new session and applies the findings. Returns the notices to store.
  @inline(never)
  private func prepared(_ preparation: UpstreamPreparation, hadSessionBefore: Bool) -> [FeedEvent] {
    if !hadSessionBefore {
      statistics.sessionsStarted += 1
      logger.info("upstream session started", metadata: ["streams": preparation.streams.joined(separator: ",")])
    }
    return apply(preparation)
  }

  /// Counts a poll going out (`statistics.pollStarted` is when).
  @inline(never)
  private func pollStarting() {
    setPollsInFlight(statistics.pollsInFlight + 1)
    assert(statistics.pollsInFlight == 1, "more than one poll in flight")
    statistics.pollStarted = MonotonicClock.seconds()
  }

  /// A failed call of the current cycle: a poll of it is no longer in flight (the session step counts none).
  @inline(never)
  private func pollFailed() {
    if statistics.pollsInFlight > 0 { setPollsInFlight(statistics.pollsInFlight - 1) }
  }

  /// Counts an answered poll; an answer clears the failure streak. Notes where the cursors stood before it is
  /// relayed (`next(after:wentBackwards:)` compares).
  @inline(never)
  private func pollAnswered(_ answer: UpstreamPollAnswer) {
    positionBefore = PositionBefore(cursors: cursors, tokens: book.tokens)
    setPollsInFlight(statistics.pollsInFlight - 1)
    statistics.pollDurations.record(MonotonicClock.seconds() - (statistics.pollStarted ?? MonotonicClock.seconds()))
    statistics.lastPollCompleted = MonotonicClock.seconds()
    statistics.pollsByOutcome[answer.isEmpty ? "empty" : "messages", default: 0] += 1
    if answer.fetchCut {
      logger.debug("fetch pages reached upstream.max_body_bytes: committed, the rest follows the next poll")
    }
    consecutiveUnauthorized = 0
    backoff.reset()
    statistics.backoffAttempt = 0
    statistics.nextRetryDelay = 0
  }

  /// Decides what follows a relayed answer.
  @inline(never)
  private func next(after answer: UpstreamPollAnswer, wentBackwards: Bool) -> NextStep {
    let before = positionBefore
    let started = statistics.pollStarted ?? MonotonicClock.seconds()
    if let asked = answer.nextPollAfter, asked > 0 {
      // The API asked for a pause before the next poll (a recipe's `after`: Dropbox's `backoff`), within the
      // bound a server-given delay gets.
      let delay = min(asked, UpstreamError.maxRetryAfter)
      logger.debug("upstream asked to wait before the next poll", metadata: ["delay_ms": String(Int(delay * 1000))])
      return .wait(delay)
    }
    let moved = cursors != before.cursors
    if !answer.rejected.contains(where: { !$0.expected }) || moved {
      let took = MonotonicClock.seconds() - started
      let wait = spacing.delay(
        afterPollTaking: took, brought: moved || book.tokens != before.tokens, using: &random)
      if wait > 0 {
        return .space(wait)
      } else if statistics.pollSpacing > 0 {
        statistics.pollSpacing = 0
        logger.info("upstream holds its polls again: no more spacing")
        republishState()
      }
    } else {
      // Only messages that cannot be relayed and have no id to move past: the upstream will answer the same at
      // once. Wait like after a failure instead of polling it in a tight loop.
      let delay = backoff.nextDelay(using: &random)
      statistics.backoffAttempt = backoff.attempt
      logger.limited(
        .warning, "upstream answer held only messages that cannot be relayed: backing off",
        metadata: ["delay_ms": String(Int(delay * 1000))], limiter: &logLimiter)
      return .wait(delay)
    }
    // Resync from the upstream's own notion of latest when its ids went backwards, and periodically: a restored
    // database that honours the old cursor never answers a poll at all, so its stream falls silent. A due check
    // waits for an answer that leaves some stream's cursor where it was (an empty poll at the latest): an answer
    // that moved every stream's cursor shows the upstream past each of them, and the sync would be one more
    // request that finds nothing (at 2,000 accounts, a sync for most of the messages relayed).
    if adapter.canSync
      && (wentBackwards
        || (MonotonicClock.seconds() - lastSync >= settings.resyncInterval
          && !book.movedEveryStream(since: before.cursors)))
    {
      return .resync
    }
    return .poll
  }

  /// Whether `error` refuses a key nothing accepted yet (`keyUnverified`).
  private func refusesUnverifiedKey(_ error: UpstreamError) -> Bool {
    guard settings.stopWhenKeyRefused, keyUnverified, statistics.lastPollCompleted == nil,
      case .status(let code) = error.kind
    else { return false }
    return (400...499).contains(code) && code != 408 && code != 429
  }

  /// Counts and logs a failed call (not a cancellation) and decides what follows.
  @inline(never)
  private func failed(_ error: UpstreamError) -> FailureStep {
    statistics.pollsByOutcome[error.outcome, default: 0] += 1
    if error.kind == .sessionExpired {
      adapter.invalidateSession()
      consecutiveUnauthorized += 1
      if consecutiveUnauthorized == 1 {
        logger.info("upstream session expired: starting a new one")
        return .again
      }
    }
    if error.refusesKey(stopWhenRefused: settings.stopWhenKeyRefused) || refusesUnverifiedKey(error) {
      if settings.stopWhenKeyRefused {
        logger.warning(
          "upstream refused the subscriber's key: ending the account's streams",
          metadata: ["error": error.description])
        stop()
        keyRefused?(error)
        return .stop
      }
      logger.error("upstream refused the API key", metadata: ["error": error.description])
    }
    let drawn = backoff.nextDelay(using: &random)
    let delay = Backoff.wait(drawn: drawn, serverAsked: error.retryAfter, floor: settings.minPollInterval)
    statistics.backoffAttempt = backoff.attempt
    statistics.nextRetryDelay = delay
    logger.warning(
      "upstream call failed: backing off",
      metadata: [
        "error": error.description, "attempt": String(backoff.attempt), "delay_ms": String(Int(delay * 1000)),
      ])
    setState(.backoff, extra: ["attempt": String(backoff.attempt), "delay_ms": String(Int(delay * 1000))])
    return .wait(delay)
  }

  /// The adapter's session step, run in a task of its own on the loop. A task keeps the deepest chain of async
  /// frames it ever needed (its allocator keeps its slabs until it ends), and the session step's chain (the session,
  /// the id sync, a request: ~8 KB of contexts) is the deepest an account's cycle makes: in the cycle's task its slabs
  /// stayed in every account's memory for as long as the account lived (2.6 KB of heap per account more, by
  /// heaptrack at 2,000 accounts). Cancelling the cycle cancels the step.
  private func prepareApart() async throws(UpstreamError) -> UpstreamPreparation {
    let step = Task(executorPreference: loop) { await self.runPreparation() }
    return try await withTaskCancellationHandler {
      await step.value
    } onCancel: {
      step.cancel()
    }.get()
  }

  private func runPreparation() async -> Result<UpstreamPreparation, UpstreamError> {
    do throws(UpstreamError) {
      return .success(try await adapter.prepare(client, isolation: self))
    } catch {
      return .failure(error)
    }
  }

  /// Applies a (re)start's findings: attached and detached streams, first cursors, backlog bounds. Returns the
  /// `stream-attached` / `stream-detached` notices to publish.
  private func apply(_ preparation: UpstreamPreparation) -> [FeedEvent] {
    let changes = book.apply(preparation, startFrom: settings.startFrom)
    var notices: [FeedEvent] = []
    for stream in changes.detached {
      let removed = feed.assumeIsolated { $0.forgetStream(stream) }
      logger.info("stream detached", metadata: ["stream": stream, "events_removed": String(removed)])
      notices.append(FeedEvent(type: "stream-detached", stream: stream, data: streamNotice(stream, "detached")))
    }
    for stream in changes.attached {
      logger.info("stream attached", metadata: ["stream": stream])
      notices.append(FeedEvent(type: "stream-attached", stream: stream, data: streamNotice(stream, "attached")))
    }
    for rewind in changes.rewinds {
      logger.warning(
        "upstream last id is below the relay's cursor: following the server",
        metadata: ["stream": rewind.stream, "cursor": String(rewind.from), "server_last": String(rewind.to)])
      statistics.cursorRewinds += 1
      notices.append(resynced(rewind))
    }
    // After a failure, only an answered poll shows the API live again (`relay`): a preparation that sent nothing,
    // or only a session step, would show `live` between two failed polls.
    if state != .backoff { updateLiveness() }
    return notices
  }

  /// Publishes an answer's new messages, slice by slice across loop turns, advancing each stream's cursor once
  /// a slice is in the feed. Poison messages (no usable content) are skipped, but with an id they still move the
  /// cursor, so the upstream does not send them forever. Returns whether the upstream's ids went backwards, or nil
  /// when the store refused a slice (the cursors then stay where that slice started).
  @inline(never)
  private func relay(_ answer: UpstreamPollAnswer, _ cycleGeneration: Int) async -> Bool? {
    // Most answers are relayed in one synchronous step; the rest (a durable store, an answer of several slices,
    // another relay under way) take the awaited path. Every account's cycle task keeps the deepest chain of async
    // frames it ever needed, so the common path makes none.
    switch relayAtOnce(answer, cycleGeneration) {
    case .done(let wentBackwards):
      return wentBackwards
    case .inTurns(let plan):
      // `relayAtOnce` holds the gate and made the plan under it.
      defer { storeGate.release() }
      return await relayInTurns(answer, plan, cycleGeneration)
    case .notHere:
      // One relay at a time: a restarted cycle decides what is new only once the old cycle's commit moved the
      // cursors (with a durable store, a commit is awaited).
      await storeGate.acquire()
      defer { storeGate.release() }
      return await relayInTurns(answer, book.plan(answer), cycleGeneration)
    }
  }

  /// What `relayAtOnce` did: relayed the answer (whether the upstream's ids went backwards), found it needs
  /// several slices (the plan made, the gate still held), or left it to the awaited path (the gate not held).
  private enum RelayedAtOnce {
    case done(Bool)
    case inTurns(CursorBook.Plan)
    case notHere
  }

  /// `relayInTurns` in one synchronous step, when it would await nothing: a memory store (publishing is a plain
  /// call), the answer's new messages in one slice, and no other relay holding the gate.
  @inline(never)
  private func relayAtOnce(_ answer: UpstreamPollAnswer, _ cycleGeneration: Int) -> RelayedAtOnce {
    guard !feed.store.isDurable, storeGate.tryAcquire() else { return .notHere }
    let plan = book.plan(answer)
    let nextTokens = book.tokens(after: plan)
    let atomic = nextTokens != book.tokens
    let pending = plan.fresh
    guard atomic || pending.count <= max(1, settings.publishSlice) else { return .inTurns(plan) }
    defer { storeGate.release() }
    note(answer, plan)
    if !unstoredGaps.isEmpty {
      publish(unstoredGaps)
      unstoredGaps = []
    }
    if !pending.isEmpty {
      let slice = pending[...]
      publish(slice.map { envelope($0.message, stream: $0.stream) })
      recorded(slice, plan, tokens: atomic ? nextTokens : nil)
      guard isCurrent(cycleGeneration) else { return .done(plan.wentBackwards) }
    }
    let next = book.settled(plan)
    if next != cursors || nextTokens != book.tokens { settle(next, nextTokens, plan) }
    updateLiveness()
    return .done(plan.wentBackwards)
  }

  /// A slice of `plan` is in the feed: counts it, and moves the cursors past it (and the opaque cursors to
  /// `tokens`, when the answer moved them: it was stored whole).
  private func recorded(
    _ slice: ArraySlice<(stream: String, message: UpstreamMessage)>, _ plan: CursorBook.Plan,
    tokens: [String: String]?
  ) {
    statistics.messagesRelayed += slice.count
    book.stored(slice, window: plan.dedupeWindow)
    if let tokens { book.moved(tokens: tokens) }
  }

  /// The answer is relayed: the cursors move where `plan` leaves them (past skipped messages, to rewinds and
  /// resets), the opaque cursors to `tokens`.
  private func settle(_ next: [String: UInt64], _ tokens: [String: String], _ plan: CursorBook.Plan) {
    book.moved(to: next, after: plan)
    book.moved(tokens: tokens)
  }

  /// What an answer says beside its new messages: rejected messages, unknown streams and rewinds (logged and
  /// counted), cursor resets (announced), duplicates (counted). `plan` is `book.plan(answer)`.
  @inline(never)
  private func note(_ answer: UpstreamPollAnswer, _ plan: CursorBook.Plan) {
    for rejection in answer.rejected where !rejection.expected {
      statistics.rejectedMessages += 1
      var fields = ["reason": rejection.reason]
      if let stream = rejection.stream { fields["stream"] = stream }
      if let id = rejection.id { fields["upstream_id"] = String(id) }
      logger.limited(.error, "upstream message cannot be relayed: skipped", metadata: fields, limiter: &logLimiter)
    }
    book.forgetKeys(resetIn: plan)
    for stream in plan.unknownStreams {
      statistics.unknownStreams += 1
      logger.limited(
        .warning, "upstream answer names an unknown stream: ignored", metadata: ["stream": stream],
        limiter: &logLimiter)
    }
    for rewind in plan.rewinds {
      statistics.cursorRewinds += 1
      logger.warning(
        "upstream ids went backwards: following the server",
        metadata: ["stream": rewind.stream, "cursor": String(rewind.from), "upstream_last": String(rewind.to)])
      unstoredGaps.append(resynced(rewind))
    }
    announce(plan.resets, tokens: book.tokens(after: plan))
    statistics.duplicatesDropped += plan.duplicates
  }

  /// `relay` with the gate held: slice by slice across loop turns, each slice committed (awaited with a durable
  /// store) before the cursors move. `plan` is `book.plan(answer)`, made with the gate held.
  private func relayInTurns(
    _ answer: UpstreamPollAnswer, _ plan: CursorBook.Plan, _ cycleGeneration: Int
  ) async -> Bool? {
    // Only the decisions are made in this turn (ids, no text): the envelopes are built slice by slice below.
    note(answer, plan)
    let wentBackwards = plan.wentBackwards
    let pending = plan.fresh
    // An answer that moves an opaque cursor is stored in one commit with that cursor: stored in slices, a crash
    // between them would poll again from the old cursor and number the same events anew.
    let nextTokens = book.tokens(after: plan)
    let atomic = nextTokens != book.tokens
    var start = 0
    while start < pending.count {
      if start > 0 {
        // Let clients read and other requests run between slices.
        await loop.nextTurn()
        guard isCurrent(cycleGeneration) else { return wentBackwards }
      }
      let slice = pending[start..<min(pending.count, start + (atomic ? pending.count : max(1, settings.publishSlice)))]
      // The slice and the cursors after it are stored together before anyone sees the slice; the answer's gaps
      // come first, in the same commit.
      let gaps = unstoredGaps
      let events = gaps + slice.map { envelope($0.message, stream: $0.stream) }
      unstoredGaps = []
      guard await commit(events, cursors: book.cursors(after: slice), tokens: atomic ? nextTokens : book.tokens) else {
        unstoredGaps = gaps + unstoredGaps
        return nil
      }
      // Only now that the messages are in the feed do the cursors move.
      recorded(slice, plan, tokens: atomic ? nextTokens : nil)
      start += slice.count
      guard isCurrent(cycleGeneration) else { return wentBackwards }
    }
    let next = book.settled(plan)
    if next != cursors || nextTokens != book.tokens || !unstoredGaps.isEmpty {
      let gaps = unstoredGaps
      unstoredGaps = []
      guard await commit(gaps, cursors: next, tokens: nextTokens) else {
        unstoredGaps = gaps + unstoredGaps
        return nil
      }
      settle(next, nextTokens, plan)
    }
    updateLiveness()
    return wentBackwards
  }

  /// Publishes `events` with the position `cursors` describes: through the store when it is durable (committed
  /// first, then shown), directly otherwise. False when the store refused it (counted, logged, backed off).
  private func commit(
    _ events: [FeedEvent], cursors next: [String: UInt64], tokens: [String: String]? = nil
  ) async -> Bool {
    guard feed.store.isDurable else {
      if !events.isEmpty { publish(events) }
      return true
    }
    do throws(StoreError) {
      try await feed.publish(
        events, position: FeedPosition(streams: book.streams, cursors: next, tokens: tokens ?? book.tokens))
      storeFailing = nil
      return true
    } catch {
      statistics.storeFailures += 1
      storeFailing = error.description
      logger.limited(
        .error, "store cannot commit a batch: not relayed, retried after a backoff",
        metadata: ["error": error.description], limiter: &logLimiter)
      return false
    }
  }

  /// Stores the notices of a (re)start with the position it set. False (after a backoff) when the store refused:
  /// the notices are kept for the next try, as the repeated preparation finds the streams already changed.
  private func store(_ notices: [FeedEvent], _ cycleGeneration: Int) async -> Bool {
    let all = unstoredNotices + notices
    await storeGate.acquire()
    let stored = await commit(all, cursors: cursors)
    storeGate.release()
    unstoredNotices = stored ? [] : all
    if stored { return true }
    await backOffAfterStoreFailure()
    return false
  }

  /// Stream notices of a preparation the store refused, published with the next one.
  private var unstoredNotices: [FeedEvent] = []

  /// Waits like after a failed poll (the store may be full or failing), then the cycle polls again from the
  /// cursors it still has.
  private func backOffAfterStoreFailure() async {
    let delay = backoff.nextDelay(using: &random)
    statistics.backoffAttempt = backoff.attempt
    statistics.nextRetryDelay = delay
    setState(.backoff, extra: ["reason": "store", "delay_ms": String(Int(delay * 1000))])
    try? await Task.sleep(for: .milliseconds(Int(delay * 1000)))
  }

  let storeGate = AsyncGate()
  /// The last store error, while commits fail (`/readyz` says so).
  var storeFailing: String?

  /// The feed shares this worker's loop: publishing is a plain call, no hop.
  private func publish(_ events: [FeedEvent]) {
    feed.assumeIsolated { $0.publishDiscardingIDs(events) }
  }

  /// Waits `delay` seconds before the next poll, because the last ones came back at once with nothing new. False
  /// when the cycle was cancelled meanwhile.
  private func space(_ delay: Double) async -> Bool {
    statistics.spacedPolls += 1
    let first = statistics.pollSpacing == 0
    statistics.pollSpacing = delay
    if first {
      logger.warning(
        "upstream answers at once with nothing new: spacing polls (it does not hold them; check its timeout)",
        metadata: ["min_interval_ms": String(Int(settings.minPollInterval * 1000))])
    }
    if first || spacing.streak.nonzeroBitCount == 1 {
      // Said when spacing starts and as it grows (streaks of 1, 2, 4, 8, …), not on every poll.
      let detail = JSONText.object([
        "reason": JSONText.quoted("instant_empty_answers"), "streak": String(spacing.streak),
        "next_poll_ms": String(Int(delay * 1000)),
      ])
      republishState(extra: [("spacing", detail)])
    }
    do {
      try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
      return true
    } catch {
      return false
    }
  }
}
