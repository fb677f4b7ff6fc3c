import CLibevent
import Foundation

/// What an `HTTPListener` does when accepting fails for lack of descriptors, and against clients that connect
/// and never finish a request (slowloris). Loop-confined: owned by its listener.
///
/// - **Descriptor limit.** libevent's listener retries `accept()` whenever the socket is readable; at EMFILE the
///   socket stays readable, so the loop spins a core and libevent logs a warning per try (a million lines in
///   5 s). The guard takes the error callback instead: it pauses accepting (`evconnlistener_disable`), closes one
///   spare descriptor it keeps in reserve to accept and at once close the oldest waiting client (it gets a clean
///   close, not a hang), logs once, retries with a growing delay (0.1 s … 1 s), and logs once more, with counts,
///   when accepting works again.
/// - **Header deadline.** evhttp's timeout restarts with every byte, so a client sending one header byte a
///   second holds its descriptor forever. Every accepted connection is tracked from its first byte until its
///   first request is complete; one still incomplete after `headerTimeout` is shut down. A keep-alive connection
///   is tracked again once its answer is sent, until its next request is complete: a connection that dribbles its
///   second request, or sits idle between requests, gets the same deadline.
public final class AcceptGuard {
  public struct Counters: Sendable {
    /// Times accepting was paused at the descriptor limit.
    public var pauses = 0
    /// Waiting clients closed through the reserve descriptor while paused.
    public var shed = 0
    /// Connections closed for not completing a request within the header deadline.
    public var headerTimeouts = 0
    public init() {}
  }

  private let loop: EventLoop
  private let logger: Logger
  let headerTimeout: Double
  private(set) var counters = Counters()
  private var reserve: Int32 = -1
  private var listener: OpaquePointer?
  private var paused = false
  private var episodeStart: Double?
  private var failuresSinceResume = 0
  private var retryDelay = 0.1
  private var retryTimer: LoopTimer?
  private var sweepTimer: LoopTimer?
  /// Connections whose first request is not complete yet: bufferevent → accept time. Each holds one extra
  /// reference (bufferevent_incref), so its descriptor stays ours until we let go: a descriptor number is never
  /// shut down after the kernel gave it to another connection.
  private var awaitingRequest: [OpaquePointer: FirstRequest] = [:]

  /// Where a connection tracked for its first request stands.
  private enum FirstRequest {
    /// Accepted at this monotonic time; no complete request yet.
    case waiting(since: Double)
    /// Shut down for missing the deadline; kept only until evhttp frees it and our reference can go.
    case shutDown
  }
  /// Keep-alive connections between an answer and their next complete request: evhttp connection → deadline.
  /// No extra reference: evhttp's close callback (set when the entry is made) removes the entry when the
  /// connection is freed, so a pointer here is always a live connection.
  private var awaitingNextRequest: [OpaquePointer: Double] = [:]

  init(loop: EventLoop, logger: Logger, headerTimeout: Double) {
    self.loop = loop
    self.logger = logger
    self.headerTimeout = headerTimeout
    reserve = AcceptGuard.openReserve()
  }

  deinit {
    release()
    if reserve >= 0 { Glibc.close(reserve) }
  }

  /// Watches `listener` (evhttp's) from now on; `http` is the evhttp whose pointer its error callback receives.
  func attach(listener: OpaquePointer, http: OpaquePointer) {
    self.listener = listener
    AcceptGuard.registry.withLock { $0[UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(http)))] = Weak(self) }
    evconnlistener_set_error_cb(listener, acceptGuardError)
    let sweep = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.sweep() }
    sweep.schedule(after: min(1, max(0.05, headerTimeout / 4)))
    sweepTimer = sweep
  }

  /// The listening socket is going away (evhttp_del_accept_socket frees the listener).
  func detachListener() {
    listener = nil
    retryTimer = nil
  }

  /// Stops watching; gives back every extra reference. Call after evhttp_free (which frees the connections).
  func release() {
    // bufferevent_decref answers whether this was the last reference (1) or not (0): not an error code.
    for bufferevent in awaitingRequest.keys { _ = bufferevent_decref(bufferevent) }
    awaitingRequest.removeAll()
    awaitingNextRequest.removeAll()
    retryTimer = nil
    sweepTimer = nil
    listener = nil
    AcceptGuard.registry.withLock { table in table = table.filter { $0.value.value != nil && $0.value.value !== self } }
  }

  // MARK: Header deadline

  /// evhttp's bufferevent factory (evhttp_set_bevcb): the same socket bufferevent evhttp would make, tracked.
  func makeBufferevent(base: OpaquePointer) -> OpaquePointer? {
    loop.assertOnLoop()
    guard let bufferevent = bufferevent_socket_new(base, -1, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else { return nil }
    bufferevent_incref(bufferevent)
    NulByteGuard.watch(bufferevent)
    awaitingRequest[bufferevent] = .waiting(since: MonotonicClock.seconds())
    return bufferevent
  }

  /// A request on this connection is complete: it is no longer at risk of never finishing one.
  func requestArrived(on connection: OpaquePointer) {
    awaitingNextRequest[connection] = nil
    guard let bufferevent = evhttp_connection_get_bufferevent(connection),
      awaitingRequest.removeValue(forKey: bufferevent) != nil
    else { return }
    _ = bufferevent_decref(bufferevent)
  }

  /// This connection's answer is out and evhttp keeps it for another request: that request must be complete
  /// within `headerTimeout` too. Its close callback (evhttp keeps one per connection) ends the tracking; a stream
  /// that starts later on the connection replaces the callback after `requestArrived` ended it.
  func awaitNextRequest(on connection: OpaquePointer) {
    loop.assertOnLoop()
    awaitingNextRequest[connection] = MonotonicClock.seconds() + headerTimeout
    evhttp_connection_set_closecb(connection, acceptGuardConnectionClosed, Unmanaged.passUnretained(self).toOpaque())
  }

  fileprivate func connectionClosed(_ connection: OpaquePointer) {
    awaitingNextRequest[connection] = nil
  }

  private func sweep() {
    let now = MonotonicClock.seconds()
    for (connection, deadline) in awaitingNextRequest where now > deadline {
      // Idle or dribbling past the deadline: end it the same way (evhttp reads EOF and frees the connection).
      awaitingNextRequest[connection] = nil
      counters.headerTimeouts += 1
      if let bufferevent = evhttp_connection_get_bufferevent(connection) {
        let fd = bufferevent_getfd(bufferevent)
        if fd >= 0 { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
      }
    }
    guard !awaitingRequest.isEmpty else { return }
    for (bufferevent, state) in awaitingRequest {
      var eventCallback: bufferevent_event_cb?
      bufferevent_getcb(bufferevent, nil, nil, &eventCallback, nil)
      if eventCallback == nil {
        // evhttp freed this connection (the client left, or sent something evhttp refused): only our reference
        // is left; dropping it frees the bufferevent and closes the descriptor.
        awaitingRequest[bufferevent] = nil
        _ = bufferevent_decref(bufferevent)
      } else if case .waiting(let accepted) = state, now - accepted > headerTimeout {
        // Still open, still no complete request: end it. evhttp reads EOF and frees the connection; the next
        // sweep drops our reference.
        counters.headerTimeouts += 1
        let fd = bufferevent_getfd(bufferevent)
        if fd >= 0 { Glibc.shutdown(fd, Int32(SHUT_RDWR)) }
        awaitingRequest[bufferevent] = .shutDown  // the sweep after evhttp frees it drops our reference
      }
    }
  }

  // MARK: Descriptor limit

  fileprivate func acceptFailed(_ error: Int32) {
    let outOfDescriptors = error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM
    guard outOfDescriptors, let listener else {
      logger.limited(
        .error, "accept failed", metadata: ["error": String(cString: strerror(error))], limiter: &limiter)
      return
    }
    failuresSinceResume += 1
    if !paused {
      paused = true
      counters.pauses += 1
      // Fails only for a listener that is not enabled: then it is not accepting either.
      _ = try? LibeventCall.check(evconnlistener_disable(listener), "evconnlistener_disable")
      if episodeStart == nil {
        episodeStart = MonotonicClock.seconds()
        retryDelay = 0.1
        logger.warning(
          "out of file descriptors: accepting paused until connections close",
          metadata: ["error": String(cString: strerror(error)), "open_files_limit": String(AcceptGuard.softLimit())])
      } else {
        retryDelay = min(1, retryDelay * 2)
      }
    }
    shedOne(listener)
    scheduleRetry()
  }

  private var limiter = LogLimiter()

  /// Closes the reserve descriptor, accepts the oldest waiting client and closes it at once, then takes the
  /// reserve back: that client learns at once that it must retry, instead of hanging in the backlog.
  private func shedOne(_ listener: OpaquePointer) {
    guard reserve >= 0 else {
      reserve = AcceptGuard.openReserve()
      return
    }
    Glibc.close(reserve)
    reserve = -1
    let fd = Glibc.accept(evconnlistener_get_fd(listener), nil, nil)
    if fd >= 0 {
      counters.shed += 1
      Glibc.close(fd)
    }
    reserve = AcceptGuard.openReserve()
  }

  private func scheduleRetry() {
    if retryTimer == nil {
      retryTimer = LoopTimer(loop: loop) { [weak self] in self?.retry() }
    }
    retryTimer?.schedule(after: retryDelay)
  }

  private func retry() {
    guard let listener, let started = episodeStart else { return }
    if paused {
      do {
        try LibeventCall.check(evconnlistener_enable(listener), "evconnlistener_enable")
      } catch {
        logger.limited(.error, "cannot resume accepting", metadata: ["error": "\(error)"], limiter: &limiter)
        scheduleRetry()  // still paused: try again later rather than stay deaf
        return
      }
      paused = false
      failuresSinceResume = 0
      scheduleRetry()  // come back to see whether accepting held
      return
    }
    guard failuresSinceResume == 0 else { return }
    episodeStart = nil
    logger.warning(
      "accepting again after running out of file descriptors",
      metadata: [
        "paused_ms": String(Int((MonotonicClock.seconds() - started) * 1000)), "pauses": String(counters.pauses),
        "shed": String(counters.shed),
      ])
  }

  private static func openReserve() -> Int32 { open("/dev/null", O_RDONLY | O_CLOEXEC) }

  static func softLimit() -> Int { descriptorSoftLimit() }

  // The error callback receives evhttp's pointer (evhttp owns the listener's callback argument): this table maps
  // it back to its guard. Touched only when accept fails, and at attach/release.
  fileprivate static let registry = Locked<[UInt: Weak<AcceptGuard>]>([:])

  fileprivate static func lookup(_ http: UnsafeMutableRawPointer) -> AcceptGuard? {
    registry.withLock { $0[UInt(bitPattern: Int(bitPattern: http))]?.value }
  }
}

struct Weak<T: AnyObject>: @unchecked Sendable {
  weak var value: T?
  init(_ value: T) { self.value = value }
}

private let acceptGuardError: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, http in
  let error = errno
  guard let http, let guardian = AcceptGuard.lookup(http) else { return }
  guardian.acceptFailed(error)
}

/// evhttp's close callback for keep-alive connections the guard tracks: `context` is the guard, alive while
/// evhttp is (evhttp_free frees the connections, calling this, before the guard is released). The connection may
/// also carry a `ClosingConnections` mark (a CONNECT answer sets it before the guard's callback replaces it).
let acceptGuardConnectionClosed: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  connection, context in
  guard let connection else { return }
  ClosingConnections.forget(connection)
  guard let context else { return }
  Unmanaged<AcceptGuard>.fromOpaque(context).takeUnretainedValue().connectionClosed(connection)
}

/// evhttp's bufferevent factory: `context` is the listener's `AcceptGuard`, alive while evhttp is (both go in
/// HTTPListener.close, evhttp first).
let acceptGuardBufferevent: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> OpaquePointer? = {
  base, context in
  guard let base, let context else { return nil }
  return Unmanaged<AcceptGuard>.fromOpaque(context).takeUnretainedValue().makeBufferevent(base: base)
}
