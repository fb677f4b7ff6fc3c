/// Running totals over many rings (per-user relaying's accounts), kept as the rings change, so the bound over all
/// of them is checked, and `/metrics` reads them, without visiting every ring. Loop-confined, like the rings.
public final class RingTally: @unchecked Sendable {
  /// Bytes and events held by the rings counted toward it now.
  public internal(set) var bytes = 0
  public internal(set) var events = 0
  /// Events those rings evicted, a counter: a ring's evictions stay counted when it leaves (an evicted account).
  public internal(set) var evicted = 0
  public init() {}
}

/// The bounded history of relayed events, kept as their encoded SSE bytes, from which clients resume.
///
/// Bounded by event count, by bytes and optionally by age; the oldest events go first. `floorID` remembers how
/// far eviction has reached, so a resume from an evicted id is recognised as a gap rather than answered with
/// whatever happens to be left.
public struct ReplayRing {
  public struct Limits: Sendable, Equatable {
    public var maxEvents: Int
    public var maxBytes: Int
    /// Seconds; nil keeps events regardless of age.
    public var maxAge: Double?

    public init(maxEvents: Int, maxBytes: Int, maxAge: Double? = nil) {
      self.maxEvents = maxEvents
      self.maxBytes = maxBytes
      self.maxAge = maxAge
    }
  }

  public struct Entry {
    public let id: UInt64
    /// The upstream stream the event belongs to; nil for events every subscriber receives.
    public let stream: String?
    public let slice: ByteSlice
    /// Monotonic seconds at which it was published.
    public let time: Double
  }

  public let limits: Limits
  private var entries: [Entry] = []
  private var start = 0
  public private(set) var byteCount = 0
  /// Every event with an id at or below this was evicted or predates this process: a resume from below it
  /// cannot be answered without a gap.
  public private(set) var floorID: UInt64
  public private(set) var evictedCount = 0
  /// The totals this ring counts toward, if any: every change of `byteCount` and `count`, and every eviction, is
  /// added to it.
  public private(set) var tally: RingTally?

  public init(limits: Limits, floorID: UInt64) {
    self.limits = limits
    self.floorID = floorID
  }

  /// Counts this ring's bytes and events toward `tally` (nil: toward none), moving them out of the previous tally.
  /// Its evictions so far are added to the new tally and stay in the old one (a counter never goes down).
  public mutating func count(toward tally: RingTally?) {
    guard tally !== self.tally else { return }
    self.tally?.bytes -= byteCount
    self.tally?.events -= count
    tally?.bytes += byteCount
    tally?.events += count
    tally?.evicted += evictedCount
    self.tally = tally
  }

  public var count: Int { entries.count - start }
  public var isEmpty: Bool { count == 0 }
  public var oldestID: UInt64? { isEmpty ? nil : entries[start].id }
  public var newestID: UInt64? { isEmpty ? nil : entries[entries.count - 1].id }

  /// Positions run from `startIndex` to `endIndex`; they stay valid until the next mutation.
  public var startIndex: Int { start }
  public var endIndex: Int { entries.count }
  public subscript(position: Int) -> Entry { entries[position] }

  /// Adds an event (ids must increase) and evicts what the count and byte bounds no longer allow.
  public mutating func append(_ entry: Entry) {
    precondition(newestID.map { entry.id > $0 } ?? true, "replay ring ids must increase")
    entries.append(entry)
    byteCount += entry.slice.count
    tally?.bytes += entry.slice.count
    tally?.events += 1
    while count > limits.maxEvents || (byteCount > limits.maxBytes && count > 1) {
      evictOldest()
    }
  }

  /// Evicts events older than `maxAge` at monotonic time `now`.
  public mutating func evictExpired(now: Double) {
    guard let maxAge = limits.maxAge else { return }
    while let oldest = isEmpty ? nil : entries[start], now - oldest.time > maxAge {
      evictOldest()
    }
  }

  /// Evicts the oldest events until at most `bytes` remain (a bound shared with other rings). Returns how many
  /// bytes were freed.
  @discardableResult
  public mutating func shrink(toBytes bytes: Int) -> Int {
    let before = byteCount
    while !isEmpty && byteCount > max(0, bytes) { evictOldest() }
    return before - byteCount
  }

  /// The position of the first event with an id above `id` (`endIndex` when there is none).
  public func position(after id: UInt64) -> Int {
    var low = start
    var high = entries.count
    while low < high {
      let mid = (low + high) / 2
      if entries[mid].id <= id { low = mid + 1 } else { high = mid }
    }
    return low
  }

  /// Drops every event of `stream` (a detached stream's history must not be replayed). Returns how many.
  @discardableResult
  public mutating func removeAll(stream: String) -> Int {
    let before = count
    var kept: [Entry] = []
    kept.reserveCapacity(count)
    var bytes = 0
    for index in start..<entries.count where entries[index].stream != stream {
      kept.append(entries[index])
      bytes += entries[index].slice.count
    }
    entries = kept
    start = 0
    tally?.bytes += bytes - byteCount
    tally?.events -= before - count
    byteCount = bytes
    return before - count
  }

  private mutating func evictOldest() {
    let oldest = entries[start]
    byteCount -= oldest.slice.count
    tally?.bytes -= oldest.slice.count
    tally?.events -= 1
    tally?.evicted += 1
    floorID = max(floorID, oldest.id)
    evictedCount += 1
    start += 1
    if start >= 1024 && start * 2 >= entries.count {
      entries.removeFirst(start)
      start = 0
    }
  }
}
