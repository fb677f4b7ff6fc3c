import CLibevent
import Foundation

/// An incoming request whose answer waits for work done elsewhere (a token signature checked off the loop; later a
/// credential checked with the legacy API). The request pointer stays usable exactly while the connection lives:
///
/// - Waiting, the object owns evhttp's close callback on the connection (and is retained by it). If the
///   connection dies meanwhile, libevent 2.1 *detaches* the unanswered request (`req->evcon = NULL`) and frees only
///   the connection; the callback then frees the detached request (as `SSEConnection` does), and `resume()`
///   answers nil: there is nobody left to answer.
/// - `resume()` takes the request back: it clears the close callback (the stream that may follow installs its
///   own) and releases the callback's retain. Exactly one of the two happens.
///
/// Loop-confined. The handler that parks a request must call `HTTPListener.responseStaysOpen()`, so the keep-alive
/// guard does not install its own close callback over this one.
final class PendingRequest: @unchecked Sendable {  // loop thread only; Sendable to cross an await on the loop
  private var request: HTTPRequest?
  private let connection: OpaquePointer
  private let loop: EventLoop
  private var retainedByCallback = false
  /// Called on the loop when the client leaves while the request waits (not after `resume()`). evhttp does not
  /// read a connection whose request it handed over, so it would notice a client that left only when the answer is
  /// written: a watch peeks at the socket every `watchPeriod` instead.
  var onLeft: (() -> Void)? {
    didSet { if onLeft != nil { watch() } }
  }
  private var watcher: LoopTimer?
  static let watchPeriod = 0.2

  private func watch() {
    guard watcher == nil, request != nil else { return }
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.peek() }
    timer.schedule(after: PendingRequest.watchPeriod)
    watcher = timer
  }

  /// EOF or an error on the socket (nothing to read is not one): the client is gone.
  private func peek() {
    guard request != nil, let bufferevent = evhttp_connection_get_bufferevent(connection) else {
      watcher = nil
      return
    }
    let fd = bufferevent_getfd(bufferevent)
    guard fd >= 0 else { return }
    var byte: UInt8 = 0
    let count = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
    guard count == 0 || (count < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) else { return }
    watcher = nil
    let left = onLeft
    onLeft = nil
    left?()
  }

  init?(_ request: HTTPRequest, loop: EventLoop) {
    guard let connection = request.connection else { return nil }
    self.request = request
    self.connection = connection
    self.loop = loop
    retainedByCallback = true
    // Released in pendingRequestClosed or in resume(), whichever comes first.
    evhttp_connection_set_closecb(connection, pendingRequestClosed, Unmanaged.passRetained(self).toOpaque())
  }

  /// The request, to be answered now; nil when the client left while it waited.
  func resume() -> HTTPRequest? {
    loop.assertOnLoop()
    guard let request else { return nil }
    self.request = nil
    onLeft = nil
    watcher = nil
    if retainedByCallback {
      retainedByCallback = false
      evhttp_connection_set_closecb(connection, nil, nil)
      Unmanaged.passUnretained(self).release()
    }
    return request
  }

  fileprivate func closed() {
    retainedByCallback = false
    // Detached (no connection any more): ours to free. Still attached: evhttp frees it with the connection.
    if let request, evhttp_request_get_connection(request.raw) == nil { evhttp_request_free(request.raw) }
    request = nil
    watcher = nil
    let left = onLeft
    onLeft = nil
    left?()
  }
}

private let pendingRequestClosed: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  _, context in
  guard let context else { return }
  // Balances the passRetained in PendingRequest.init.
  Unmanaged<PendingRequest>.fromOpaque(context).takeRetainedValue().closed()
}
