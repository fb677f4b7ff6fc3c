import Foundation

/// Following a store shared across nodes (`store.kind = redis`): showing what another node committed, leading
/// (ids above the stored head), and the store's losses and trims.
extension Feed {
  /// Shows events another node committed (read from the shared stream), in order: into the ring, then to every
  /// live subscriber, with their ids as stored. Ids at or below the visible head are already here and skipped.
  /// A `stream-detached` notice drops its stream's events from the ring first, as on the node that wrote it.
  public func follow(_ events: [StoredEvent]) {
    followed(events)
  }

  func followed(_ events: [StoredEvent]) {
    let fresh = events.filter { $0.id > visibleHead }
    guard !fresh.isEmpty else { return }
    let now = MonotonicClock.seconds()
    var entries: [ReplayRing.Entry] = []
    entries.reserveCapacity(fresh.count)
    let whole = BroadcastBytes { bytes in
      for event in fresh {
        let slice = event.bytes
        bytes.append(contentsOf: UnsafeRawBufferPointer(start: slice.block.base + slice.offset, count: slice.count))
      }
    }
    var offset = whole.payload.offset
    for event in fresh {
      if event.type == "stream-detached", let stream = event.stream { ring.removeAll(stream: stream) }
      let entry = ReplayRing.Entry(
        id: event.id, stream: event.stream,
        slice: ByteSlice(block: whole.payload.block, offset: offset, count: event.bytes.count), time: now)
      offset += event.bytes.count
      entries.append(entry)
      ring.append(entry)
      if let stream = event.stream { stats.eventsPublishedByStream[stream, default: 0] += 1 }
    }
    count { $0.eventsPublished += fresh.count }
    visibleHead = fresh[fresh.count - 1].id
    if ids.head < visibleHead { ids = EventIDAllocator(startMicroseconds: 0, persistedAtLeast: visibleHead) }
    ring.evictExpired(now: now)
    writeTime = now
    fanOut(entries, whole: whole)
  }

  /// This node starts writing the feed (it took the lease): ids go on above `storedHead` and what this node
  /// shows, and above its clock (the same rule as a restart).
  public func lead(storedHead: UInt64) {
    let above = max(storedHead, visibleHead, ids.head)
    ids = EventIDAllocator(startMicroseconds: EventIDAllocator.nowMicroseconds(), persistedAtLeast: above)
    if ids.head > above {
      unissued.append((above + 1)...ids.head)
      unissuedChanged = true
    }
  }

  /// The store lost this feed (Redis restarted empty): what came upstream meanwhile cannot be relayed, so every
  /// stream ends and every client that resumes across the loss gets `reset` (`too_old`), and the `upstream`
  /// status says why. Returns the streams ended.
  @discardableResult
  public func storeLost(_ detail: String) -> Int {
    // Said first, so the streams about to end carry it too.
    publishStatus(
      JSONText.object([
        "state": JSONText.quoted("resync"), "reason": JSONText.quoted("store_lost"),
        "detail": JSONText.quoted(detail),
      ]))
    return skip(to: visibleHead + 1, notice: "the store lost this feed: reconnect")
  }

  /// This feed's store belongs to another source: it serves nobody (new streams get 503, open ones end) until
  /// `reason` is nil again.
  public func setUnavailable(_ reason: String?) {
    guard reason != unavailableReason else { return }
    unavailableReason = reason
    guard let reason else { return }
    let notice = ByteSlice(SSEEncoder.comment("this feed is unavailable: \(reason)"))
    for subscriber in subscribers where !subscriber.isClosed { end(subscriber, with: notice) }
  }

  /// The shared stream was trimmed past what this node shows (it could not follow for a while): what lies
  /// between is gone. The ring restarts at `floor`, and every stream ends so its client reconnects with its
  /// Last-Event-ID and gets the `reset` the resume rules give for an id that is too old.
  @discardableResult
  public func skip(
    to floor: UInt64, notice text: String = "events were trimmed before this node could follow them: reconnect"
  ) -> Int {
    guard floor > visibleHead else { return 0 }
    let tally = ring.tally
    ring.count(toward: nil)
    ring = ReplayRing(limits: settings.ring, floorID: floor)
    ring.count(toward: tally)
    visibleHead = floor
    if ids.head < floor { ids = EventIDAllocator(startMicroseconds: 0, persistedAtLeast: floor) }
    let ending = subscribers
    let notice = ByteSlice(SSEEncoder.comment(text))
    for subscriber in ending where !subscriber.isClosed { end(subscriber, with: notice) }
    return ending.count
  }

  /// Broadcasts an `upstream` status event (no id; not replayed) and remembers it for new subscribers.
  public func publishStatus(_ data: String) {
    let bytes = BroadcastBytes(SSEEncoder.event(id: nil, type: "upstream", data: data))
    statusEvent = bytes
    writeTime = MonotonicClock.seconds()
    for subscriber in subscribers where subscriber.mode == .live && !subscriber.isClosed {
      broadcast(bytes, to: subscriber)
    }
  }

  /// Removes a detached stream's events from the ring so that they are never replayed.
  @discardableResult
  public func forgetStream(_ stream: String) -> Int {
    if store.isDurable { forgottenStreams.append(stream) }
    return ring.removeAll(stream: stream)
  }
}
