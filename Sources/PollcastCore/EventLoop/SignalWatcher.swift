import CLibevent
import Foundation

/// Turns POSIX signals into callbacks on the loop thread (libevent's self-pipe), so that a handler may touch
/// relay state safely. Create and drop it on the loop thread.
public final class SignalWatcher {
  private var events: [OpaquePointer] = []
  private let handler: (Int32) -> Void

  public init(loop: EventLoop, signals: [Int32], handler: @escaping (Int32) -> Void) throws(EventLoopError) {
    self.handler = handler
    let context = Unmanaged.passUnretained(self).toOpaque()  // events are freed in deinit, before self goes
    for signum in signals {
      let event = try LibeventCall.check(
        pollcast_evsignal_new(loop.base, signum, signalWatcherCallback, context), "evsignal_new(\(signum))")
      events.append(event)
      try LibeventCall.check(event_add(event, nil), "event_add(signal \(signum))")
    }
  }

  deinit {
    for event in events { event_free(event) }
  }

  fileprivate func deliver(_ signum: Int32) {
    // The handler may drop the last reference to this watcher: keep it and the closure alive until it returns.
    let handler = self.handler
    withExtendedLifetime(self) { handler(signum) }
  }
}

private let signalWatcherCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  signum, _, context in
  guard let context else { return }
  Unmanaged<SignalWatcher>.fromOpaque(context).takeUnretainedValue().deliver(Int32(signum))
}
