import CLibevent
import Foundation

/// Turns POSIX signals into callbacks on the loop thread (libevent's self-pipe), so that a handler may touch
/// relay state safely. Create and drop it on the loop thread.
public final class SignalWatcher {
  private var events: [OpaquePointer] = []
  private let handler: (Int32) -> Void

  public init(loop: EventLoop, signals: [Int32], handler: @escaping (Int32) -> Void) {
    self.handler = handler
    let context = Unmanaged.passUnretained(self).toOpaque()  // events are freed in deinit, before self goes
    for signum in signals {
      if let event = pollcast_evsignal_new(loop.base, signum, signalWatcherCallback, context) {
        event_add(event, nil)
        events.append(event)
      }
    }
  }

  deinit {
    for event in events { event_free(event) }
  }

  fileprivate func deliver(_ signum: Int32) { handler(signum) }
}

private let signalWatcherCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  signum, _, context in
  guard let context else { return }
  Unmanaged<SignalWatcher>.fromOpaque(context).takeUnretainedValue().deliver(Int32(signum))
}
