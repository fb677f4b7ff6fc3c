/// Where a subscriber's bytes go: the HTTP layer implements it over an evhttp streaming reply; tests can
/// implement it in memory. Called on the loop thread only.
public protocol SubscriberSink: AnyObject, Sendable {
  /// Bytes queued for this client and not yet taken by the kernel.
  var pendingBytes: Int { get }
  /// Queues the slices, in order, without copying them.
  func write(_ slices: [ByteSlice])
  /// Queues bytes every live subscriber receives alike (the fan-out fast path: one reference, framing included).
  func write(_ bytes: BroadcastBytes)
  /// Queues the slices and calls `drained` once everything queued so far has been written to the socket.
  func write(_ slices: [ByteSlice], whenDrained drained: @escaping () -> Void)
  /// Ends the stream cleanly after what is queued (shutdown, maximum connection age).
  func finish()
  /// Drops the connection at once, discarding what is queued (slow consumer).
  func abort()
}

/// One connected SSE client as the feed sees it. Confined to the loop thread (created, read and changed only
/// by the `Feed` and the `SSEServer`, which run there); `@unchecked Sendable` so it can leave `assumeIsolated`.
public final class Subscriber: @unchecked Sendable {
  public enum Mode {
    /// Catching up from the replay ring; live fan-out skips it until it reaches the head.
    case replaying
    case live
  }

  // The fan-out's fields come first, in the order it reads them, so that the two cache lines `Feed.fanOut` asks for
  // ahead (those holding the object's start and 64 bytes on: at least its first 80 bytes, whatever its alignment)
  // hold all of them (offsets 16-63): Swift lays out a class's stored properties in declaration order.
  public internal(set) var mode: Mode
  public internal(set) var isClosed = false
  /// Streams this client asked for; nil means all.
  public let streams: Set<String>?
  let sink: SubscriberSink
  /// The id of the newest event queued for this client (or skipped by its filter).
  public internal(set) var cursor: UInt64
  /// Monotonic time of the last fan-out write (events, status, heartbeat): a busy stream needs no heartbeat.
  var lastWrite = 0.0
  /// Monotonic time at which the maximum connection age ends this stream; nil without one.
  var endsAt: Double?
  /// When its grant ends by itself (monotonic; a token's expiry), and the last event it then gets.
  var grantEndsAt: Double?
  var grantEndEvent: ByteSlice?
  /// What granted this stream (per-user relaying: a digest of the key it presented), so the streams of one key can
  /// be ended when that key is revoked while others of its account keep the account polling.
  public internal(set) var grant: String?
  var registryIndex = -1

  init(streams: Set<String>?, sink: SubscriberSink, cursor: UInt64, mode: Mode) {
    self.streams = streams
    self.sink = sink
    self.cursor = cursor
    self.mode = mode
  }
}
