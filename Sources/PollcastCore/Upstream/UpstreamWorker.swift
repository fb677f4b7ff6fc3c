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

  public struct Settings: Sendable {
    public var startFrom: StartFrom = .latest
    public var backoff = Backoff()
    /// Stop polling after this long with no subscriber (nil: never).
    public var idleAfter: Double?
    /// `/readyz` wants a poll completed within this many seconds.
    public var readyWindow: Double = 60
    /// Re-read the upstream's newest ids (chat: `/api/messages/last`) before the next poll once this many seconds
    /// passed since the last sync: a database restored with lower ids is noticed even while polls only time out.
    public var resyncInterval: Double = 60
    /// Events published per loop turn: a huge answer is relayed in slices so no turn holds the loop for long.
    public var publishSlice = 1000
    /// Per-user relaying: a refused credential (401 or 403 where a session is created, or on a poll that has no
    /// session step) means the subscriber's key was revoked. The worker stops and calls `onKeyRefused` instead of
    /// backing off and retrying a key that will not work again.
    public var stopWhenKeyRefused = false
    /// Polls that bring nothing new and return sooner than this are spaced (`PollSpacing`); 0 never spaces.
    public var minPollInterval: Double = 1
    public init() {}
  }

  public enum State: String, Sendable, CaseIterable {
    case stopped, connecting, backoff, backlog, live, idle
  }

  public nonisolated let loop: EventLoop
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
  let feed: Feed
  let client: UpstreamClient
  let adapter: UpstreamAdapter
  let settings: Settings
  let logger: Logger
  private var random: SeededRandom

  private var generation = 0
  private var cycle: Task<Void, Never>?
  private var backoff: Backoff
  private var spacing: PollSpacing
  private var streams: [String] = []
  private var cursors: [String: UInt64] = [:]
  private var backlogUntil: [String: UInt64] = [:]
  private var hadSession = false
  private var consecutiveUnauthorized = 0
  private var idleTimer: LoopTimer?
  private var running = false
  private var lastSync = 0.0
  /// Upstream ids relayed lately, per stream: an id at or below the cursor that is among them is a resend (a
  /// duplicate); one that is not means the upstream's ids went backwards.
  private var recent: [String: RecentIDs] = [:]
  private var logLimiter = LogLimiter()
  private var keyRefused: (@Sendable (UpstreamError) -> Void)?
  public private(set) var state: State = .stopped
  public private(set) var statistics = UpstreamStatistics()

  public init(
    loop: EventLoop, feed: Feed, client: UpstreamClient, adapter: UpstreamAdapter, settings: Settings, logger: Logger,
    random: SeededRandom = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  ) {
    // The worker publishes with assumeIsolated, and its transport is confined to the loop it was made on.
    precondition(
      feed.loop === loop && client.transport.loop === loop, "the worker, its feed and transport share a loop")
    self.loop = loop
    self.feed = feed
    self.client = client
    self.adapter = adapter
    self.settings = settings
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

  /// Where polling stands: the streams and their cursors. A worker started later with `restore(_:)` polls on from
  /// there (per-user relaying stops an idle account's worker and makes a new one when a subscriber returns).
  public struct Position: Sendable {
    public var streams: [String]
    public var cursors: [String: UInt64]
    /// The ids relayed lately per stream: an upstream that resends its last page after the restart is then
    /// recognised as resending (dropped), not as ids going backwards (relayed again).
    var recent: [String: RecentIDs] = [:]

    public init(streams: [String], cursors: [String: UInt64]) {
      self.streams = streams
      self.cursors = cursors
    }

    init(streams: [String], cursors: [String: UInt64], recent: [String: RecentIDs]) {
      self.init(streams: streams, cursors: cursors)
      self.recent = recent
    }

    /// A position read from the store: the stored events' upstream ids count as relayed lately.
    public init(stored: FeedPosition, events: [StoredEvent]) {
      var recent: [String: RecentIDs] = [:]
      for event in events {
        guard let stream = event.stream, let id = event.upstreamID else { continue }
        recent[stream, default: RecentIDs()].insert(id)
      }
      self.init(streams: stored.streams, cursors: stored.cursors, recent: recent)
    }
  }

  public func position() -> Position? {
    streams.isEmpty ? nil : Position(streams: streams, cursors: cursors, recent: recent)
  }

  /// Before `start()`: poll on from `position`. What the upstream received meanwhile is relayed as live
  /// (`backlog: false`): it is news the subscribers have not seen, not history from before they came.
  public func restore(_ position: Position) {
    guard !running else { return }
    streams = position.streams
    cursors = position.cursors
    recent = position.recent
    hadSession = true
    restored = true
  }

  private var restored = false

  /// Before `start()`: poll on from a position read from the store, the stored events' upstream ids counting as
  /// relayed lately (an upstream that resends its last page after the restart is not relayed twice).
  public func restore(_ stored: FeedPosition, events: [StoredEvent]) {
    restore(Position(stored: stored, events: events))
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
    cycle = Task { await self.runCycle(current) }
  }

  private func endCycle() {
    generation += 1
    cycle?.cancel()
    cycle = nil
    // The task's cancellation reaches the transfer through the loop; cancel here too so nothing of the old
    // cycle is in flight when the next one starts.
    client.cancelAll()
    statistics.pollsInFlight = 0
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

  private func runCycle(_ cycleGeneration: Int) async {
    var needsPreparation = true
    while isCurrent(cycleGeneration) {
      do throws(UpstreamError) {
        if needsPreparation {
          if !adapter.hasSession { setState(.connecting) }
          let hadSessionBefore = adapter.hasSession
          let preparation = try await adapter.prepare(client, isolation: self)
          guard isCurrent(cycleGeneration) else { return }
          if !hadSessionBefore {
            statistics.sessionsStarted += 1
            logger.info("upstream session started", metadata: ["streams": preparation.streams.joined(separator: ",")])
          }
          let notices = apply(preparation)
          // The streams and first cursors are stored before the first poll: a crash before any message arrives
          // still polls on from here, so nothing the upstream receives meanwhile is skipped.
          guard await store(notices, cycleGeneration) else { continue }
          guard isCurrent(cycleGeneration) else { return }
          needsPreparation = false
          lastSync = MonotonicClock.seconds()
        }
        statistics.pollsInFlight += 1
        assert(statistics.pollsInFlight == 1, "more than one poll in flight")
        statistics.maxPollsInFlight = max(statistics.maxPollsInFlight, statistics.pollsInFlight)
        let started = MonotonicClock.seconds()
        statistics.pollStarted = started
        let answer: UpstreamPollAnswer
        do throws(UpstreamError) {
          answer = try await adapter.poll(client, cursors: cursors, isolation: self)
        } catch {
          if isCurrent(cycleGeneration) { statistics.pollsInFlight -= 1 }
          throw error
        }
        guard isCurrent(cycleGeneration) else { return }
        statistics.pollsInFlight -= 1
        statistics.pollDurations.record(MonotonicClock.seconds() - started)
        statistics.lastPollCompleted = MonotonicClock.seconds()
        statistics.pollsByOutcome[answer.isEmpty ? "empty" : "messages", default: 0] += 1
        consecutiveUnauthorized = 0
        backoff.reset()
        statistics.backoffAttempt = 0
        statistics.nextRetryDelay = 0
        let cursorsBefore = cursors
        guard let wentBackwards = await relay(answer, cycleGeneration) else {
          // The store refused the batch: nothing of it was shown, the cursors did not move, and the next poll
          // (after a backoff) brings the same messages again.
          guard isCurrent(cycleGeneration) else { return }
          await backOffAfterStoreFailure()
          continue
        }
        guard isCurrent(cycleGeneration) else { return }
        if answer.rejected.isEmpty || cursors != cursorsBefore {
          let took = MonotonicClock.seconds() - started
          let wait = spacing.delay(afterPollTaking: took, brought: cursors != cursorsBefore, using: &random)
          if wait > 0 {
            guard await space(wait) else { return }
            continue
          } else if statistics.pollSpacing > 0 {
            statistics.pollSpacing = 0
            logger.info("upstream holds its polls again: no more spacing")
            republishState()
          }
        }
        if !answer.rejected.isEmpty && cursors == cursorsBefore {
          // Only messages that cannot be relayed and have no id to move past: the upstream will answer the same
          // at once. Wait like after a failure instead of polling it in a tight loop.
          let delay = backoff.nextDelay(using: &random)
          statistics.backoffAttempt = backoff.attempt
          logger.limited(
            .warning, "upstream answer held only messages that cannot be relayed: backing off",
            metadata: ["delay_ms": String(Int(delay * 1000))], limiter: &logLimiter)
          do {
            try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
          } catch {
            return
          }
          continue
        }
        // Resync from the upstream's own notion of latest when its ids went backwards, and periodically: a
        // restored database that honours the old cursor never answers a poll at all.
        if (wentBackwards || MonotonicClock.seconds() - lastSync >= settings.resyncInterval) && adapter.canSync {
          needsPreparation = true
        }
      } catch {
        guard isCurrent(cycleGeneration), error.kind != .cancelled else { return }
        statistics.pollsByOutcome[error.outcome, default: 0] += 1
        if error.kind == .sessionExpired {
          adapter.invalidateSession()
          needsPreparation = true
          consecutiveUnauthorized += 1
          if consecutiveUnauthorized == 1 {
            logger.info("upstream session expired: starting a new one")
            continue
          }
        }
        if case .status(let code) = error.kind, code == 401 || (code == 403 && settings.stopWhenKeyRefused) {
          if settings.stopWhenKeyRefused {
            logger.warning(
              "upstream refused the subscriber's key: ending the account's streams",
              metadata: ["error": error.description])
            stop()
            keyRefused?(error)
            return
          }
          logger.error("upstream refused the API key", metadata: ["error": error.description])
        }
        let delay = backoff.nextDelay(using: &random)
        statistics.backoffAttempt = backoff.attempt
        statistics.nextRetryDelay = delay
        logger.warning(
          "upstream call failed: backing off",
          metadata: [
            "error": error.description, "attempt": String(backoff.attempt),
            "delay_ms": String(Int(delay * 1000)),
          ])
        setState(.backoff, extra: ["attempt": String(backoff.attempt), "delay_ms": String(Int(delay * 1000))])
        do {
          try await Task.sleep(for: .milliseconds(Int(delay * 1000)))
        } catch {
          return  // cancelled: stop() or a restart
        }
        // After a failure the session or the server may have changed: sync cursors again.
        needsPreparation = true
      }
    }
  }

  /// Applies a (re)start's findings: attached and detached streams, first cursors, backlog bounds. Returns the
  /// `stream-attached` / `stream-detached` notices to publish.
  private func apply(_ preparation: UpstreamPreparation) -> [FeedEvent] {
    let previous = streams
    let next = preparation.streams
    var notices: [FeedEvent] = []
    for stream in previous where !next.contains(stream) {
      let removed = feed.assumeIsolated { $0.forgetStream(stream) }
      cursors[stream] = nil
      backlogUntil[stream] = nil
      logger.info("stream detached", metadata: ["stream": stream, "events_removed": String(removed)])
      notices.append(FeedEvent(type: "stream-detached", stream: stream, data: streamNotice(stream, "detached")))
    }
    for stream in next where !previous.contains(stream) && hadSession {
      logger.info("stream attached", metadata: ["stream": stream])
      notices.append(FeedEvent(type: "stream-attached", stream: stream, data: streamNotice(stream, "attached")))
    }
    for stream in next {
      let serverLast = preparation.lastIDs?[stream]
      guard let cursor = cursors[stream] else {
        // A stream seen for the first time: the first start follows start_from; a stream attached later
        // starts from the server's newest id (only new messages).
        if serverLast == nil {
          cursors[stream] = preparation.initialCursors[stream] ?? 0
        } else if !hadSession && settings.startFrom == .earliest {
          cursors[stream] = 0
          if let serverLast, serverLast > 0 { backlogUntil[stream] = serverLast }
        } else {
          cursors[stream] = serverLast ?? 0
        }
        continue
      }
      guard let serverLast else { continue }
      if serverLast > cursor && !restored {
        backlogUntil[stream] = max(backlogUntil[stream] ?? 0, serverLast)
      } else if serverLast < cursor {
        // The server's ids went backwards (its data was reset): follow it rather than wait forever.
        logger.warning(
          "upstream last id is below the relay's cursor: following the server",
          metadata: ["stream": stream, "cursor": String(cursor), "server_last": String(serverLast)])
        statistics.cursorRewinds += 1
        publishResync(stream: stream, from: cursor, to: serverLast, reason: "upstream_latest_below_cursor")
        cursors[stream] = serverLast
        backlogUntil[stream] = nil
        recent[stream] = nil
      }
    }
    streams = next
    hadSession = true
    restored = false
    updateLiveness()
    return notices
  }

  /// Publishes an answer's new messages, slice by slice across loop turns, advancing each stream's cursor once
  /// a slice is in the feed. Poison messages (no usable content) are skipped, but with an id they still move the
  /// cursor, so the upstream does not send them forever. Returns whether the upstream's ids went backwards, or nil
  /// when the store refused a slice (the cursors then stay where that slice started).
  private func relay(_ answer: UpstreamPollAnswer, _ cycleGeneration: Int) async -> Bool? {
    // One relay at a time: a restarted cycle decides what is new only once the old cycle's commit moved the
    // cursors (with a durable store, a commit is awaited).
    await storeGate.acquire()
    defer { storeGate.release() }
    var skipped: [String: UInt64] = [:]
    for rejection in answer.rejected {
      statistics.rejectedMessages += 1
      var fields = ["reason": rejection.reason]
      if let stream = rejection.stream { fields["stream"] = stream }
      if let id = rejection.id { fields["upstream_id"] = String(id) }
      logger.limited(.error, "upstream message cannot be relayed: skipped", metadata: fields, limiter: &logLimiter)
      if let stream = rejection.stream, let id = rejection.id, streams.contains(stream) {
        skipped[stream] = max(skipped[stream] ?? 0, id)
      }
    }
    var wentBackwards = false
    var rewound: [String: UInt64] = [:]
    // Only the decisions are made in this turn (ids, no text): the envelopes are built slice by slice below.
    var pending: [(stream: String, message: UpstreamMessage)] = []
    for batch in answer.batches {
      guard streams.contains(batch.stream) else {
        statistics.unknownStreams += 1
        logger.limited(
          .warning, "upstream answer names an unknown stream: ignored", metadata: ["stream": batch.stream],
          limiter: &logLimiter)
        continue
      }
      let recentIDs = recent[batch.stream] ?? RecentIDs()
      // Adapters sort off the loop; an answer that arrives unsorted anyway is sorted here.
      let sorted =
        zip(batch.messages, batch.messages.dropFirst()).allSatisfy { $0.id <= $1.id }
        ? batch.messages : batch.messages.sorted(by: { $0.id < $1.id })
      let cursor = cursors[batch.stream] ?? 0
      let decision = CursorDecision.decide(ids: sorted.map(\.id), cursor: cursor, recent: recentIDs)
      if decision.backwards, let last = sorted.last?.id {
        wentBackwards = true
        statistics.cursorRewinds += 1
        logger.warning(
          "upstream ids went backwards: following the server",
          metadata: ["stream": batch.stream, "cursor": String(cursor), "upstream_last": String(last)])
        publishResync(stream: batch.stream, from: cursor, to: last, reason: "ids_went_backwards")
        rewound[batch.stream] = last
      }
      statistics.duplicatesDropped += sorted.count - decision.fresh.count
      for index in decision.fresh { pending.append((batch.stream, sorted[index])) }
    }
    var start = 0
    while start < pending.count {
      if start > 0 {
        // Let clients read and other requests run between slices.
        await loop.nextTurn()
        guard isCurrent(cycleGeneration) else { return wentBackwards }
      }
      let slice = pending[start..<min(pending.count, start + max(1, settings.publishSlice))]
      var next = cursors
      for (stream, message) in slice { next[stream] = message.id }
      // The slice and the cursors after it are stored together before anyone sees the slice.
      guard await commit(slice.map { envelope($0.message, stream: $0.stream) }, cursors: next) else { return nil }
      statistics.messagesRelayed += slice.count
      // Only now that the messages are in the feed do the cursors move.
      cursors = next
      for (stream, message) in slice { recent[stream, default: RecentIDs()].insert(message.id) }
      start += slice.count
      guard isCurrent(cycleGeneration) else { return wentBackwards }
    }
    var next = cursors
    for (stream, id) in skipped where id > next[stream] ?? 0 { next[stream] = id }
    for (stream, id) in rewound { next[stream] = id }
    if next != cursors {
      guard await commit([], cursors: next) else { return nil }
      cursors = next
    }
    updateLiveness()
    return wentBackwards
  }

  /// Publishes `events` with the position `cursors` describes: through the store when it is durable (committed
  /// first, then shown), directly otherwise. False when the store refused it (counted, logged, backed off).
  private func commit(_ events: [FeedEvent], cursors next: [String: UInt64]) async -> Bool {
    guard feed.store.isDurable else {
      if !events.isEmpty { publish(events) }
      return true
    }
    do throws(StoreError) {
      try await feed.publish(events, position: FeedPosition(streams: streams, cursors: next))
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

  private let storeGate = AsyncGate()
  /// The last store error, while commits fail (`/readyz` says so).
  private var storeFailing: String?

  /// The `message` event for one upstream message: its stream, id, backlog mark and the message verbatim.
  private func envelope(_ message: UpstreamMessage, stream: String) -> FeedEvent {
    if message.repaired {
      statistics.repairedMessages += 1
      logger.limited(
        .warning, "upstream message had invalid UTF-8: relayed with U+FFFD",
        metadata: ["stream": stream, "upstream_id": String(message.id)], limiter: &logLimiter)
    }
    let backlog = message.id <= backlogUntil[stream] ?? 0
    if backlog { statistics.backlogMessages += 1 }
    return FeedEvent(
      stream: stream,
      data: JSONText.object([
        "stream": JSONText.quoted(stream), "upstream_id": JSONText.quoted(String(message.id)),
        "backlog": backlog ? "true" : "false", "message": message.raw,
      ]), upstreamID: message.id)
  }

  /// The feed shares this worker's loop: publishing is a plain call, no hop.
  private func publish(_ events: [FeedEvent]) {
    _ = feed.assumeIsolated { $0.publish(events) }
  }

  /// Tells clients, in the `upstream` status event, that the relay followed the upstream to other ids.
  private func publishResync(stream: String, from: UInt64, to: UInt64, reason: String) {
    let data = JSONText.object([
      "state": JSONText.quoted("resync"), "adapter": JSONText.quoted(adapter.name),
      "stream": JSONText.quoted(stream), "reason": JSONText.quoted(reason),
      "cursor": JSONText.quoted(String(from)), "upstream_id": JSONText.quoted(String(to)),
    ])
    feed.assumeIsolated { $0.publishStatus(data) }
  }

  private func updateLiveness() {
    for (stream, bound) in backlogUntil where (cursors[stream] ?? 0) >= bound {
      backlogUntil[stream] = nil
    }
    if backlogUntil.isEmpty {
      setState(.live)
    } else {
      let pending = backlogUntil.keys.sorted().map { "\(JSONText.quoted($0)):\(backlogUntil[$0]!)" }
      setState(.backlog, extra: ["until": "{\(pending.joined(separator: ","))}"])
    }
  }

  private func streamNotice(_ stream: String, _ change: String) -> String {
    JSONText.object(["stream": JSONText.quoted(stream), "change": JSONText.quoted(change)])
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

  /// Publishes the current state's status event again, with `extra` fields.
  private func republishState(extra: [(String, String)] = []) {
    var fields = [("state", JSONText.quoted(state.rawValue)), ("adapter", JSONText.quoted(adapter.name))]
    fields += extra
    feed.assumeIsolated {
      $0.publishStatus("{" + fields.map { "\(JSONText.quoted($0.0)):\($0.1)" }.joined(separator: ",") + "}")
    }
  }

  private func setState(_ next: State, extra: KeyValuePairs<String, String> = [:]) {
    let changed = next != state
    state = next
    statistics.state = next.rawValue
    guard changed || next == .backoff || next == .backlog else { return }
    var fields = [("state", JSONText.quoted(next.rawValue)), ("adapter", JSONText.quoted(adapter.name))]
    for (key, value) in extra { fields.append((key, value.first == "{" ? value : JSONText.quoted(value))) }
    let data = "{" + fields.map { "\(JSONText.quoted($0.0)):\($0.1)" }.joined(separator: ",") + "}"
    feed.assumeIsolated { $0.publishStatus(data) }
    if changed { logger.info("upstream state", metadata: ["state": next.rawValue]) }
  }

  // MARK: Introspection

  public func snapshot() -> UpstreamStatistics {
    var copy = statistics
    copy.cursors = cursors
    copy.hasSession = adapter.hasSession
    copy.transportInFlight = client.inFlight
    return copy
  }

  /// `/readyz`: ready when a session is established and the upstream answered recently: a poll completed, or
  /// the poll now hanging started, within the window (a long-poll that is simply waiting is healthy).
  public func readiness() -> (ready: Bool, reason: String) {
    if state == .idle { return (true, "idle: no subscribers") }
    if let storeFailing { return (false, "store failing: \(storeFailing)") }
    guard adapter.hasSession else { return (false, "no upstream session") }
    guard state != .backoff else { return (false, "upstream failing: backing off (attempt \(backoff.attempt))") }
    let inFlightSince = statistics.pollsInFlight > 0 ? statistics.pollStarted : nil
    guard let last = [statistics.lastPollCompleted, inFlightSince].compactMap({ $0 }).max() else {
      return (false, "no poll yet")
    }
    let age = MonotonicClock.seconds() - last
    guard age <= settings.readyWindow else {
      return (false, "no upstream answer for \(Int(age)) s (window \(Int(settings.readyWindow)) s)")
    }
    return (true, "ok")
  }
}

/// What the worker counts, for `/metrics` and tests.
public struct UpstreamStatistics: Sendable {
  public var state = "stopped"
  public var pollsByOutcome: [String: Int] = [:]
  public var pollsInFlight = 0
  public var maxPollsInFlight = 0
  public var sessionsStarted = 0
  public var messagesRelayed = 0
  public var backlogMessages = 0
  public var duplicatesDropped = 0
  public var unknownStreams = 0
  public var rejectedMessages = 0
  public var repairedMessages = 0
  public var cursorRewinds = 0
  /// Batches (or positions) the store refused: relayed again once it accepts them.
  public var storeFailures = 0
  public var backoffAttempt = 0
  public var nextRetryDelay = 0.0
  /// Pauses before a poll because the previous ones came back at once with nothing new (`PollSpacing`).
  public var spacedPolls = 0
  /// The current pause before the next poll for that reason (0: not spacing).
  public var pollSpacing = 0.0
  public var lastPollCompleted: Double?
  /// When the latest poll was sent.
  public var pollStarted: Double?
  public var pollDurations = Histogram(bounds: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60])
  public var cursors: [String: UInt64] = [:]
  public var hasSession = false
  public var transportInFlight = 0
}

/// A Prometheus-style histogram with fixed upper bounds.
public struct Histogram: Sendable {
  public let bounds: [Double]
  public private(set) var counts: [Int]
  public private(set) var sum = 0.0
  public private(set) var count = 0

  public init(bounds: [Double]) {
    self.bounds = bounds
    counts = Array(repeating: 0, count: bounds.count)
  }

  public mutating func record(_ value: Double) {
    for (index, bound) in bounds.enumerated() where value <= bound { counts[index] += 1 }
    sum += value
    count += 1
  }
}

/// The last few thousand ids relayed on one stream, to tell a resend from ids going backwards.
struct RecentIDs: Sendable {
  static let capacity = 4096
  private var order: [UInt64] = []
  private var members: Set<UInt64> = []
  private var next = 0

  func contains(_ id: UInt64) -> Bool { members.contains(id) }

  mutating func insert(_ id: UInt64) {
    guard !members.contains(id) else { return }
    if order.count < RecentIDs.capacity {
      order.append(id)
    } else {
      members.remove(order[next])
      order[next] = id
      next = (next + 1) % RecentIDs.capacity
    }
    members.insert(id)
  }
}

/// Which messages of one stream's answer are new, and whether the upstream's ids went backwards. A pure value,
/// so the rule is tested (and fuzzed) without sockets.
///
/// - Ids above the cursor are new.
/// - Ids at or below it, beside newer ones, are resends (an upstream repeating its last page): dropped.
/// - An answer with nothing above the cursor that holds an id the relay did not relay lately means the ids went
///   backwards (a restored database; an id of 2^64-1 followed by ordinary ones): every id not relayed lately is
///   new, and the cursor follows the server to the answer's highest id.
struct CursorDecision: Equatable {
  var backwards: Bool
  /// Positions (in the ascending ids given) of the messages to relay.
  var fresh: [Int]

  static func decide(ids: [UInt64], cursor: UInt64, recent: RecentIDs) -> CursorDecision {
    let backwards =
      !ids.isEmpty && !ids.contains { $0 > cursor } && ids.contains { $0 != cursor && !recent.contains($0) }
    var fresh: [Int] = []
    var last = backwards ? nil : Optional(cursor)
    for (index, id) in ids.enumerated() {
      if let previous = last, id <= previous { continue }  // at or below the cursor, or repeated in the answer
      if backwards && (id == cursor || recent.contains(id)) { continue }
      fresh.append(index)
      last = id
    }
    return CursorDecision(backwards: backwards, fresh: fresh)
  }
}

/// A FIFO lock for async code on one actor: `acquire` suspends while another holder has it.
final class AsyncGate {
  private var held = false
  private var waiters: [CheckedContinuation<Void, Never>] = []

  func acquire(isolation: isolated (any Actor)? = #isolation) async {
    guard held else {
      held = true
      return
    }
    await withCheckedContinuation { waiters.append($0) }
  }

  /// Hands the gate to the first waiter, or opens it.
  func release() {
    if waiters.isEmpty {
      held = false
    } else {
      waiters.removeFirst().resume()
    }
  }
}
