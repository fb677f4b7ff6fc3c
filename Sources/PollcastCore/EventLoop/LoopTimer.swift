import CLibevent
import Foundation

/// A libevent timer on the loop. Create, arm and cancel it on the loop thread only; the callback runs there.
///
/// The timer owns its `struct event`; dropping the last reference cancels and frees it, so a timer can never
/// call back into an object that is gone. A callback may drop the last reference to its own timer (a poll that
/// finishes clears `poll.timer`): `fire()` keeps the timer and the closure alive until the callback returns.
///
/// Callbacks capture their owner `weak`ly (never `unowned`): the owner holds the timer, so a strong capture would
/// be a cycle, and an unowned one dangles when the callback's own work frees the owner.
public final class LoopTimer {
  private var event: OpaquePointer?
  private let callback: () -> Void
  private let loop: EventLoop

  /// - Parameters:
  ///   - repeating: fire every `interval` instead of once.
  public init(loop: EventLoop, repeating: Bool = false, _ callback: @escaping () -> Void) {
    self.callback = callback
    self.loop = loop
    let flags: Int16 = repeating ? pollcast_EV_PERSIST : 0
    // Unretained: the timer frees the event in deinit, so the event never outlives `self`.
    event = event_new(loop.base, -1, flags, loopTimerCallback, Unmanaged.passUnretained(self).toOpaque())
    // event_new fails only when out of memory; a timer that cannot exist must not pretend to.
    precondition(event != nil, "event_new failed for a timer")
  }

  deinit {
    if let event { event_free(event) }
  }

  /// Arms (or re-arms) the timer to fire after `seconds`.
  ///
  /// - Parameter common: many timers on this loop are armed with this same duration (a configured interval, not a
  ///   computed remainder or a random backoff): libevent then queues them by duration instead of heaping them
  ///   (`EventLoop.commonTimeout(seconds:)`).
  public func schedule(after seconds: Double, common: Bool = false) {
    loop.assertOnLoop()
    guard let event else { return }
    var tv = common ? loop.commonTimeout(seconds: seconds) : timeval(seconds: seconds)
    LibeventCall.invariant(event_add(event, &tv), "event_add(timer)")
  }

  public func cancel() {
    guard let event else { return }
    LibeventCall.invariant(event_del(event), "event_del(timer)")
  }

  fileprivate func fire() {
    // The callback may release this timer (and with it the closure) while it runs: hold both until it returns.
    let callback = self.callback
    withExtendedLifetime(self) { callback() }
  }
}

private let loopTimerCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  _, _, context in
  guard let context else { return }
  Unmanaged<LoopTimer>.fromOpaque(context).takeUnretainedValue().fire()
}

extension timeval {
  /// The longest duration a timeval is made for (~31 years): a timer that long never fires in practice.
  static let maxSeconds = 1e9

  /// Clamped to 0 ... `maxSeconds`, NaN to 0: a larger value (a configured `1e19`) trapped converting to whole
  /// seconds, and one near it would overflow libevent's deadline (now plus the duration).
  init(seconds: Double) {
    let clamped = seconds.isNaN ? 0 : min(max(0, seconds), timeval.maxSeconds)
    let whole = clamped.rounded(.down)
    self.init(tv_sec: Int(whole), tv_usec: Int((clamped - whole) * 1_000_000))
  }
}
