import Foundation

/// Hands out SSE ids: decimal u64, +1 per relayed event, never reused.
///
/// The first id after a start is at least the start time in microseconds since the Unix epoch (and above any id
/// the caller says was persisted), so ids keep increasing across restarts without any state.
public struct EventIDAllocator: Sendable {
  /// The id of the newest event handed out; before the first event, one below the first id.
  public private(set) var head: UInt64

  public init(startMicroseconds: UInt64 = EventIDAllocator.nowMicroseconds(), persistedAtLeast: UInt64 = 0) {
    let first = max(startMicroseconds, persistedAtLeast == .max ? .max : persistedAtLeast + 1)
    head = first - 1
  }

  /// The next id; `head` becomes it.
  public mutating func next() -> UInt64 {
    precondition(head < .max, "SSE id space exhausted")
    head += 1
    return head
  }

  /// Hands back the ids above `head` (a batch that could not be stored, when none was handed out after it).
  public mutating func rewind(to head: UInt64) {
    precondition(head <= self.head, "rewind only hands ids back")
    self.head = head
  }

  public static func nowMicroseconds() -> UInt64 {
    var spec = timespec()
    clock_gettime(CLOCK_REALTIME, &spec)
    return UInt64(spec.tv_sec) * 1_000_000 + UInt64(spec.tv_nsec / 1000)
  }
}
