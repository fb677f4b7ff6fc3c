/// The feed's decisions as plain values: which bytes of a batch a subscriber gets, what the next step of a replay
/// sends and whether it reaches the head, whether a slow subscriber is cut, what a new subscriber gets first.
/// `Feed` (the loop-bound shell) only performs them: writes, disconnects, timers. Unit-tested without sockets.
enum FeedPlan {
  /// What a live subscriber gets of a published batch.
  enum Delivery {
    /// The whole batch: one shared reference (the subscriber reads every stream).
    case whole
    /// Only these parts (its `?stream=` filter), adjacent events merged into one slice.
    case slices([ByteSlice])
    /// Nothing of it.
    case nothing
  }

  /// Inlined into the fan-out: a subscriber of every stream (the usual one) then costs it a nil check, not a call
  /// with its stream set passed out and back (a retain each); the filtered case stays a call.
  @inline(__always)
  static func delivery(of batch: [ReplayRing.Entry], to streams: Set<String>?) -> Delivery {
    guard let streams else { return .whole }
    return filtered(batch, streams)
  }

  @inline(never)
  static func filtered(_ batch: [ReplayRing.Entry], _ streams: Set<String>) -> Delivery {
    var slices: [ByteSlice] = []
    for entry in batch where wants(streams, entry.stream) { appendMerging(entry.slice, to: &slices) }
    return slices.isEmpty ? .nothing : .slices(slices)
  }

  /// Events without a stream (the relay's own notices) go to everyone; others to who asked for their stream.
  @inline(__always)
  static func wants(_ streams: Set<String>?, _ stream: String?) -> Bool {
    guard let streams, let stream else { return true }
    return streams.contains(stream)
  }

  static func appendMerging(_ slice: ByteSlice, to slices: inout [ByteSlice]) {
    if let previous = slices.last, previous.isFollowed(by: slice) {
      slices[slices.count - 1] = ByteSlice(
        block: previous.block, offset: previous.offset, count: previous.count + slice.count)
    } else {
      slices.append(slice)
    }
  }

  /// The slow-consumer rule: a subscriber whose earlier writes still leave more than `maxPendingBytes` unsent is
  /// cut (it resumes with Last-Event-ID). The new batch itself is not counted, so a batch larger than the bound
  /// never cuts a client that keeps up.
  @inline(__always)
  static func cuts(pendingBytes: Int, maxPendingBytes: Int) -> Bool {
    pendingBytes > maxPendingBytes
  }

  /// One step of a catching-up subscriber's replay.
  struct ReplayStep {
    /// The bytes to queue (adjacent events merged).
    var slices: [ByteSlice] = []
    var bytes = 0
    /// Events in `slices`.
    var events = 0
    /// The id the subscriber has been given everything up to after this step.
    var cursor: UInt64
    /// The step reached the newest visible event: the subscriber goes live after it.
    var reachesHead = false
    /// The ring evicted events the subscriber was not sent yet: it cannot keep up and is cut.
    var fellBehind = false
  }

  /// Up to `chunkBytes` of the events after `cursor` that `streams` wants; at the ring's end the subscriber
  /// reaches `head` and goes live.
  static func replayStep(
    ring: ReplayRing, after cursor: UInt64, streams: Set<String>?, head: UInt64, chunkBytes: Int
  ) -> ReplayStep {
    var step = ReplayStep(cursor: cursor)
    if cursor < ring.floorID {
      step.fellBehind = true
      return step
    }
    var position = ring.position(after: cursor)
    while position < ring.endIndex && step.bytes < chunkBytes {
      let entry = ring[position]
      if wants(streams, entry.stream) {
        appendMerging(entry.slice, to: &step.slices)
        step.bytes += entry.slice.count
        step.events += 1
      }
      step.cursor = entry.id
      position += 1
    }
    if position >= ring.endIndex {
      step.cursor = head
      step.reachesHead = true
    }
    return step
  }
}
