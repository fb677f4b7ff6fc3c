import CLibevent
import Foundation

/// The relay's event hub: assigns ids, keeps the replay ring, and fans every batch out to the subscribers.
///
/// Runs on the event loop (its executor), like the HTTP server that attaches subscribers to it, so a batch is
/// appended and written to every subscriber in one turn of the loop: there is no window in which a subscriber
/// could see a later event before an earlier one, or a replay could miss an event published meanwhile.
public actor Feed {
  public nonisolated let loop: EventLoop
  public nonisolated var settings: FeedSettings { common.settings }
  /// The settings and the fixed bytes, shared by every feed made with the same settings (an account's, say).
  nonisolated let common: FeedCommon
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  var ids: EventIDAllocator
  var ring: ReplayRing
  var subscribers: [Subscriber] = []
  var stats = FeedStatistics()
  /// The newest `upstream` status event (no id), sent to every subscriber when it goes live.
  var statusEvent: BroadcastBytes?
  var heartbeatTimer: LoopTimer?
  /// This feed's token in `common.wheel` while the wheel runs its heartbeat rounds instead of `heartbeatTimer`.
  var heartbeatWheelToken: UInt64?
  /// Where the next heartbeat slice starts in `subscribers`, and the fraction of a subscriber owed to the next
  /// tick (with fewer subscribers than slices, a tick visits none or one).
  var heartbeatCursor = 0
  var heartbeatCredit = 0.0
  /// When the current batch is being written (set once per publish, read by every write of the fan-out).
  var writeTime = 0.0
  var ageTimer: LoopTimer?
  var ageRandom = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  var heartbeatBytes: BroadcastBytes { common.heartbeatBytes }
  var preamble: ByteSlice { common.preamble }
  var subscriberObservers: [(Int) -> Void] = []

  /// Where batches are committed before anyone sees them (`store.kind`), and this feed's name there.
  public nonisolated let store: EventStore
  public nonisolated let storeKey: String
  /// The id of the newest event subscribers may see: with a durable store, ids are handed out before the batch
  /// is committed, and a batch is visible only once it is.
  var visibleHead: UInt64
  /// Streams whose events the ring dropped since the last commit: the next commit drops them from the store.
  var forgottenStreams: [String] = []
  /// Id ranges this feed's store never issued (`UnissuedRanges`): a resume into one gets `reset`. Changed ranges
  /// go with the next commit.
  var unissued: [ClosedRange<UInt64>] = []
  var unissuedChanged = false
  /// Why this feed serves nobody (its store belongs to another source), or nil.
  public internal(set) var unavailableReason: String?

  /// - Parameter restored: what `store` held for this feed at start: its events go back into the ring, and `ids`
  ///   must already start above its head (`EventIDAllocator(persistedAtLeast:)`).
  public init(
    loop: EventLoop, settings: FeedSettings, ids: EventIDAllocator = EventIDAllocator(),
    store: EventStore = MemoryEventStore(), storeKey: String = "shared", restored: StoredFeed? = nil
  ) {
    self.init(
      loop: loop, common: FeedCommon(settings), ids: ids, store: store, storeKey: storeKey, restored: restored)
  }

  /// A feed whose settings and fixed bytes are `common`, shared with other feeds.
  init(
    loop: EventLoop, common: FeedCommon, ids: EventIDAllocator, store: EventStore, storeKey: String,
    restored: StoredFeed?
  ) {
    precondition(restored.map { ids.head >= $0.headID } ?? true, "ids must start above the stored head")
    let settings = common.settings
    self.loop = loop
    self.common = common
    self.ids = ids
    self.store = store
    self.storeKey = storeKey
    self.visibleHead = ids.head
    var ring = ReplayRing(
      limits: settings.ring,
      floorID: restored.map { $0.events.isEmpty ? $0.headID : $0.floorID } ?? ids.head)
    if let restored {
      // Ages carry over: an event published 10 minutes before the restart is 10 minutes old now.
      let unixNow = Date().timeIntervalSince1970
      let now = MonotonicClock.seconds()
      for event in restored.events {
        ring.append(
          ReplayRing.Entry(
            id: event.id, stream: event.stream, slice: event.bytes, time: now - max(0, unixNow - event.unixTime)))
      }
      ring.evictExpired(now: now)
      unissued = restored.unissued
      // Ids between the stored head and this run's first id are never issued. The head shown before the first
      // event (one below it) is excluded: it is what a `reset` of this run names.
      if ids.head > restored.headID + 1 { unissued.append((restored.headID + 1)...(ids.head - 1)) }
      unissuedChanged = unissued != restored.unissued
    }
    self.ring = ring
  }

  /// Calls `observer` (on the loop) with the number of connected subscribers whenever it changes.
  public func observeSubscribers(_ observer: @escaping @Sendable (Int) -> Void) {
    subscriberObservers.append(observer)
  }

  public var subscriberCount: Int { subscribers.count }

  func subscribersChanged() {
    for observer in subscriberObservers { observer(subscribers.count) }
  }

  /// The id of the newest event subscribers can see (one below the first id while none was published).
  public var headID: UInt64 { visibleHead }

  /// Starts the heartbeat and age-eviction timer.
  public func start() {
    guard !heartbeatRunning else { return }
    armHeartbeat()
    started = true
    if subscribers.contains(where: { $0.endsAt != nil || $0.grantEndsAt != nil }) { startEndTimer() }
  }

  var started = false

  /// Slices per interval now: one per `heartbeatsPerSlice` subscribers, at least one and at most `heartbeatSlices`,
  /// so a feed with two readers (an account's, in per-user relaying) wakes once per interval, not forty times.
  var heartbeatSlicesNow = 1

  /// The earliest maximum age or expiry among the subscribers (infinity when none has one).
  var nextEnd = Double.infinity

  /// Stops the timers of a feed nobody reads (an idle account's): `start()` starts them again. The ring stays.
  public func pause() {
    guard subscribers.isEmpty else { return }
    stopHeartbeat()
    ageTimer = nil
    started = false
  }

  /// Bytes the replay ring holds (per-user relaying bounds their sum over accounts).
  public var ringBytes: Int { ring.byteCount }

  /// Evicts the ring's oldest events down to `bytes` (per-user relaying's bound over all accounts). Returns the
  /// bytes freed.
  @discardableResult
  public func shrinkRing(toBytes bytes: Int) -> Int { ring.shrink(toBytes: bytes) }

  /// Drops ring events older than the age bound (a paused feed's timer does not).
  public func evictExpired() { ring.evictExpired(now: MonotonicClock.seconds()) }

  /// Counts this feed's ring (events, bytes, evictions) toward `tally` (nil: toward none).
  public func countRing(toward tally: RingTally?) { ring.count(toward: tally) }

  /// The timer that ends streams at their maximum age or their token's expiry: started with the first stream
  /// that has either. A tick costs one comparison until the earliest end is due.
  func startEndTimer() {
    guard started, ageTimer == nil else { return }
    let period = min(0.25, max(0.05, (settings.maxConnectionAge ?? 1) / 4))
    let check = LoopTimer(loop: loop, repeating: true) { [weak self] in
      self?.assumeIsolated { $0.endDueConnections() }
    }
    check.schedule(after: period, common: true)
    ageTimer = check
  }

  /// Adds to this feed's counters and to the totals its settings share (an account's feed: `AccountTotals`).
  @inline(__always)
  func count(_ change: (inout FeedStatistics) -> Void) {
    change(&stats)
    if let totals = common.totals { change(&totals.feeds) }
  }

  public func statistics() -> FeedStatistics {
    var snapshot = stats
    snapshot.ringEvents = ring.count
    snapshot.ringBytes = ring.byteCount
    snapshot.ringEvicted = ring.evictedCount
    snapshot.headID = visibleHead
    return snapshot
  }

  // MARK: Publishing

  /// Assigns ids to `events`, encodes them once into one shared block, stores them in the ring and writes them
  /// to every live subscriber. Returns the ids given, in order.
  ///
  /// For in-process sources of a feed that keeps nothing (`store.kind = memory`): with a durable store, use
  /// `publish(_:position:)`, which commits the batch before anyone sees it.
  @discardableResult
  public func publish(_ events: [FeedEvent]) -> [UInt64] {
    publishedBatch(events)?.events.map(\.id) ?? []
  }

  /// `publish(_:)` for a caller that needs no ids back (the upstream worker): no array of them made per batch.
  func publishDiscardingIDs(_ events: [FeedEvent]) {
    _ = publishedBatch(events)
  }

  /// Publishes `events` to a feed that keeps nothing: the batch revealed, nil for none.
  private func publishedBatch(_ events: [FeedEvent]) -> PreparedBatch? {
    precondition(!store.isDurable, "a durable feed publishes through publish(_:position:)")
    guard let batch = prepare(events) else { return nil }
    reveal(batch)
    return batch
  }

  /// Publishes `events` (possibly none) with the upstream `position` that produced them: the store commits both
  /// in one step, and only then do the events enter the ring and reach subscribers. On a store error nothing is
  /// visible, the ids are handed back when no later batch took ids meanwhile, and the caller keeps its old
  /// position (the upstream sends the same messages again).
  @discardableResult
  public func publish(_ events: [FeedEvent], position: FeedPosition?) async throws(StoreError) -> [UInt64] {
    guard store.isDurable else { return publish(events) }
    let headBefore = ids.head
    let batch = prepare(events)
    let forget = forgottenStreams
    forgottenStreams = []
    let ranges = unissuedChanged ? currentUnissued() : nil
    unissuedChanged = false
    let stored = StoreBatch(
      feed: storeKey,
      events: (batch?.events ?? []).map {
        StoredEvent(
          id: $0.id, stream: $0.stream, upstreamID: $0.upstreamID, unixTime: $0.unixTime, bytes: $0.entry.slice,
          type: $0.type)
      },
      position: position, headID: ids.head, floorID: ring.floorID, forgetStreams: forget, unissued: ranges)
    do {
      try await commit(stored)
    } catch {
      count { $0.storeFailures += 1 }
      if ranges != nil { unissuedChanged = true }
      forgottenStreams = forget + forgottenStreams
      if let last = batch?.events.last?.id, ids.head == last { ids.rewind(to: headBefore) }
      throw error
    }
    guard let batch else { return [] }
    reveal(batch)
    return batch.events.map(\.id)
  }

  /// The unissued ranges still above the ring's floor (below it a resume is too old anyway), newest last.
  func currentUnissued() -> [ClosedRange<UInt64>] {
    unissued.removeAll { $0.upperBound < ring.floorID }
    if unissued.count > UnissuedRanges.limit { unissued.removeFirst(unissued.count - UnissuedRanges.limit) }
    return unissued
  }

  func commit(_ batch: StoreBatch) async throws(StoreError) {
    let store = store
    let result: Result<Void, StoreError> = await withCheckedContinuation { continuation in
      store.commit(batch) { continuation.resume(returning: $0) }
    }
    try result.get()
  }

  /// One event of a batch, its id given and its bytes encoded, not yet visible.
  struct PreparedEvent {
    var id: UInt64 { entry.id }
    var stream: String? { entry.stream }
    var entry: ReplayRing.Entry
    var upstreamID: UInt64?
    var unixTime: Double
    var type: String?
  }

  /// A batch with its ids given and its bytes encoded in one block, not yet visible.
  struct PreparedBatch {
    var events: [PreparedEvent]
    /// The whole block, for the fan-out's fast path (subscribers that read every stream).
    var whole: BroadcastBytes
  }

  func prepare(_ events: [FeedEvent]) -> PreparedBatch? {
    guard !events.isEmpty else { return nil }
    var placed: [(id: UInt64, offset: Int, count: Int)] = []
    placed.reserveCapacity(events.count)
    let batchBytes = BroadcastBytes { bytes in
      bytes.reserveCapacity(bytes.count + events.reduce(0) { $0 + $1.data.utf8.count + 64 })
      for event in events {
        let id = ids.next()
        let offset = bytes.count
        SSEEncoder.appendEvent(id: id, type: event.type, data: event.data, to: &bytes)
        placed.append((id, offset, bytes.count - offset))
      }
    }
    let block = batchBytes.payload.block
    let now = MonotonicClock.seconds()
    let unixNow = store.isDurable ? Date().timeIntervalSince1970 : 0
    var batch: [PreparedEvent] = []
    batch.reserveCapacity(events.count)
    for (index, event) in events.enumerated() {
      let (id, offset, count) = placed[index]
      let entry = ReplayRing.Entry(
        id: id, stream: event.stream, slice: ByteSlice(block: block, offset: offset, count: count), time: now)
      batch.append(PreparedEvent(entry: entry, upstreamID: event.upstreamID, unixTime: unixNow, type: event.type))
    }
    return PreparedBatch(events: batch, whole: batchBytes)
  }

  /// Makes a prepared batch visible: into the ring, then to every live subscriber.
  func reveal(_ prepared: PreparedBatch) {
    // With a shared store (`redis`), a node that stepped down follows the stream from its visible head, and a
    // commit it made just before may come back that way too: whichever shows an id first wins.
    guard let newest = prepared.events.last?.id, newest > visibleHead else { return }
    // Ids rise within a batch: when its first is new, all are (the usual case: no filtered copy).
    let batch = prepared.events[0].id > visibleHead ? prepared.events : prepared.events.filter { $0.id > visibleHead }
    guard batch.count == prepared.events.count else {
      followed(
        batch.map { StoredEvent(id: $0.id, stream: $0.stream, upstreamID: nil, unixTime: 0, bytes: $0.entry.slice) })
      return
    }
    let now = MonotonicClock.seconds()
    var entries: [ReplayRing.Entry] = []
    entries.reserveCapacity(batch.count)
    for prepared in batch {
      // The ring's age counts from when the batch became visible.
      let entry = ReplayRing.Entry(id: prepared.id, stream: prepared.stream, slice: prepared.entry.slice, time: now)
      entries.append(entry)
      ring.append(entry)
      if let stream = prepared.stream { stats.eventsPublishedByStream[stream, default: 0] += 1 }
    }
    count { $0.eventsPublished += batch.count }
    visibleHead = max(visibleHead, batch[batch.count - 1].id)
    ring.evictExpired(now: now)
    writeTime = now
    fanOut(entries, whole: prepared.whole)
  }

  func fanOut(_ batch: [ReplayRing.Entry], whole: BroadcastBytes) {
    guard let last = batch.last?.id else { return }
    // A copy: a slow subscriber cut below leaves `subscribers` during the loop.
    let list = subscribers
    for index in list.indices {
      // Each subscriber's object and its connection's are cold by the next event: ask for them a few subscribers
      // ahead, so their cache misses overlap the sends before them (two dependent loads: the subscriber first,
      // its connection once the subscriber has arrived).
      if index + 8 < list.count { pollcast_prefetch(Unmanaged.passUnretained(list[index + 8]).toOpaque()) }
      if index + 4 < list.count {
        pollcast_prefetch(Unmanaged.passUnretained(list[index + 4].sink as AnyObject).toOpaque())
      }
      let subscriber = list[index]
      guard subscriber.mode == .live && !subscriber.isClosed else { continue }
      switch FeedPlan.delivery(of: batch, to: subscriber.streams) {
      case .whole: broadcast(whole, to: subscriber)
      case .slices(let slices): send(slices, to: subscriber)
      case .nothing: break
      }
      if !subscriber.isClosed { subscriber.cursor = last }
    }
  }

  /// Queues `slices` for a live subscriber, or disconnects it when its backlog would pass the bound.
  func send(_ slices: [ByteSlice], to subscriber: Subscriber) {
    guard admit(slices.reduce(0) { $0 + $1.count }, to: subscriber) else { return }
    subscriber.lastWrite = writeTime
    subscriber.sink.write(slices)
  }

  /// The fan-out fast path: one shared, pre-framed reference for a live subscriber, or a disconnect when its
  /// backlog would pass the bound.
  @inline(__always)
  func broadcast(_ bytes: BroadcastBytes, to subscriber: Subscriber) {
    guard admit(bytes.payload.count, to: subscriber) else { return }
    subscriber.lastWrite = writeTime
    subscriber.sink.write(bytes)
  }

  /// The slow-consumer bound, shared by both write paths: counts `size` bytes as queued for `subscriber`, or
  /// disconnects it when what *earlier* writes left unsent already passes `maxPendingBytes`.
  ///
  /// The new batch itself is not counted against the bound: a subscriber that keeps up has nothing pending when
  /// a batch comes, whatever its size, so one batch larger than the bound (100 messages of 11 kB) never cuts a
  /// healthy client. The batch's bytes are shared references, so queueing it costs the subscriber no copy; a
  /// client that does not read is cut at the next batch.
  @inline(__always)
  func admit(_ size: Int, to subscriber: Subscriber) -> Bool {
    if FeedPlan.cuts(pendingBytes: subscriber.sink.pendingBytes, maxPendingBytes: settings.maxPendingBytes) {
      disconnectSlow(subscriber)
      return false
    }
    count { $0.bytesQueued += size }
    return true
  }

  func disconnectSlow(_ subscriber: Subscriber) {
    count { $0.slowConsumerDisconnects += 1 }
    remove(subscriber)
    subscriber.sink.abort()
  }

  // MARK: Subscribers

  /// Attaches a new client: writes the preamble, then a reset notice or the replay, then live events.
  ///
  /// - Parameters:
  ///   - requestedID: the raw `Last-Event-ID` (or query parameter) value, if any.
  ///   - streams: the streams asked for with `?stream=`; nil for all.
  ///   - end: when the subscriber's grant ends by itself (a token's expiry): the stream then ends with the grant's
  ///     last event, and the client reconnects with a fresh credential and its Last-Event-ID.
  ///   - revocationKey: what a revocation names (`endAll(type:data:grant:)`).
  public func attach(
    sink: SubscriberSink, requestedID: String?, streams: Set<String>?, end: GrantEnd? = nil,
    revocationKey: String? = nil
  ) -> Subscriber {
    let decision = ResumeDecision.decide(
      requested: requestedID, floorID: ring.floorID, headID: visibleHead, unissued: unissued)
    let subscriber = Subscriber(
      streams: streams, sink: sink, cursor: visibleHead, mode: .live)
    if let age = settings.maxConnectionAge {
      let jitter =
        settings.maxConnectionAgeJitter > 0
        ? Double.random(in: 0...settings.maxConnectionAgeJitter, using: &ageRandom) : 0
      subscriber.endsAt = MonotonicClock.seconds() + age + jitter
    }
    if let end {
      subscriber.grantEndsAt = end.at
      subscriber.grantEndEvent = ByteSlice(SSEEncoder.event(id: nil, type: end.type, data: end.data))
    }
    subscriber.grant = revocationKey
    if let end = [subscriber.endsAt, subscriber.grantEndsAt].compactMap({ $0 }).min() {
      nextEnd = min(nextEnd, end)
      startEndTimer()
    }
    subscriber.registryIndex = subscribers.count
    subscribers.append(subscriber)
    count {
      $0.subscribersConnected += 1
      $0.subscribersTotal += 1
    }

    var opening = [preamble]
    switch decision {
    case .live:
      break
    case .reset(let reason, let requested):
      count { $0.resetsByReason[reason.rawValue, default: 0] += 1 }
      opening.append(ByteSlice(resetEvent(reason: reason, requested: requested)))
    case .replay(let after):
      count { $0.resumes += 1 }
      subscriber.cursor = after
      subscriber.mode = .replaying
    }
    if subscriber.mode == .live, let statusEvent { opening.append(statusEvent.payload) }
    let openingBytes = opening.reduce(0) { $0 + $1.count }
    count { $0.bytesQueued += openingBytes }
    subscriber.sink.write(opening)
    if subscriber.mode == .replaying { pump(subscriber) }
    adjustHeartbeat(growOnly: true)
    subscribersChanged()
    return subscriber
  }

  /// The client went away (or the server ended it): forget it. Safe to call more than once.
  public func detach(_ subscriber: Subscriber) {
    remove(subscriber)
  }

  func remove(_ subscriber: Subscriber) {
    guard !subscriber.isClosed else { return }
    let position = subscriber.registryIndex
    guard position >= 0, position < subscribers.count, subscribers[position] === subscriber else {
      assertionFailure("detached from a feed it is not attached to")
      return
    }
    subscriber.isClosed = true
    let index = subscriber.registryIndex
    let lastIndex = subscribers.count - 1
    if index != lastIndex {
      let moved = subscribers[lastIndex]
      subscribers[index] = moved
      moved.registryIndex = index
    }
    subscribers.removeLast()
    subscriber.registryIndex = -1
    count { $0.subscribersConnected -= 1 }
    subscribersChanged()
  }

  /// Queues the next part of a catching-up subscriber's replay; when it reaches the head it goes live.
  func pump(_ subscriber: Subscriber) {
    guard subscriber.mode == .replaying, !subscriber.isClosed else { return }
    let step = FeedPlan.replayStep(
      ring: ring, after: subscriber.cursor, streams: subscriber.streams, head: visibleHead,
      chunkBytes: settings.replayChunkBytes)
    if step.fellBehind {
      disconnectSlow(subscriber)
      return
    }
    var slices = step.slices
    subscriber.cursor = step.cursor
    count {
      $0.replayedEvents += step.events
      $0.bytesQueued += step.bytes
    }
    if step.reachesHead {
      subscriber.mode = .live
      if let statusEvent { slices.append(statusEvent.payload) }
      if !slices.isEmpty { subscriber.sink.write(slices) }
      return
    }
    subscriber.sink.write(slices) { [weak self] in
      self?.assumeIsolated { $0.pump(subscriber) }
    }
  }

  func resetEvent(reason: ResetReason, requested: String) -> [UInt8] {
    let shown =
      requested.utf8.count > 128 ? String(decoding: requested.utf8.prefix(128), as: UTF8.self) + "…" : requested
    let data = JSONText.object([
      "reason": JSONText.quoted(reason.rawValue),
      "requested": JSONText.quoted(shown),
      "oldest": JSONText.quoted(String(ring.oldestID ?? visibleHead &+ 1)),
      "latest": JSONText.quoted(String(visibleHead)),
    ])
    return SSEEncoder.event(id: visibleHead, type: "reset", data: data)
  }

}
