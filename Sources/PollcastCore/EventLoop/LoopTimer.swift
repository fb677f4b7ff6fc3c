import CLibevent
import Foundation

/// A libevent timer on the loop. Create, arm and cancel it on the loop thread only; the callback runs there.
///
/// The timer owns its `struct event`; dropping the last reference cancels and frees it, so a timer can never
/// call back into an object that is gone.
public final class LoopTimer {
  private var event: OpaquePointer?
  private let callback: () -> Void

  /// - Parameters:
  ///   - repeating: fire every `interval` instead of once.
  public init(loop: EventLoop, repeating: Bool = false, _ callback: @escaping () -> Void) {
    self.callback = callback
    let flags: Int16 = repeating ? pollcast_EV_PERSIST : 0
    // Unretained: the timer frees the event in deinit, so the event never outlives `self`.
    event = event_new(loop.base, -1, flags, loopTimerCallback, Unmanaged.passUnretained(self).toOpaque())
  }

  deinit {
    if let event { event_free(event) }
  }

  /// Arms (or re-arms) the timer to fire after `seconds`.
  public func schedule(after seconds: Double) {
    guard let event else { return }
    var tv = timeval(seconds: seconds)
    event_add(event, &tv)
  }

  public func cancel() {
    guard let event else { return }
    event_del(event)
  }

  fileprivate func fire() { callback() }
}

private let loopTimerCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  _, _, context in
  guard let context else { return }
  Unmanaged<LoopTimer>.fromOpaque(context).takeUnretainedValue().fire()
}

extension timeval {
  init(seconds: Double) {
    let clamped = max(0, seconds)
    let whole = clamped.rounded(.down)
    self.init(tv_sec: Int(whole), tv_usec: Int((clamped - whole) * 1_000_000))
  }
}
