import CLibevent
import Foundation

/// One streaming `text/event-stream` reply over evhttp: the HTTP side of a `Subscriber`.
///
/// Lifetime: the object is retained by evhttp's close callback (`passRetained` in `begin`, released in
/// `sseConnectionClosed`). Once the connection closes, `request` and `connection` are gone and never touched
/// again; every method checks `isOpen` first.
final class SSEConnection: SubscriberSink, @unchecked Sendable {  // loop thread only
  // What a delivery reads comes first (`pendingBytes`, `write`; offsets 16-47): Swift lays out a class's stored
  // properties in declaration order, and the fan-out asks ahead for the two cache lines holding this object's start
  // and 64 bytes on (at least its first 80 bytes). At offsets 64-97 these fields lay past them for half of malloc's
  // alignments, and `pendingBytes`'s first load missed (0.65 % of the relay's samples at 1,000 subscribers).
  private(set) var isOpen = true
  private var chunked = false
  /// False only while `output` is known to be empty: bytes reach it only through this object (the reply's head,
  /// references, chunks), each of which sets it, and libevent only ever takes bytes out. A subscriber that keeps up
  /// then costs the fan-out no look at its evbuffer, a cache line of its own per subscriber that a thousand
  /// subscribers' deliveries otherwise each miss (`evbuffer_get_length` was 2.6 % of the relay's samples at 1,000
  /// subscribers, a quarter of its user time).
  private var outputMayHoldBytes = true
  private var socket: Int32 = -1
  /// The connection's output buffer, looked up once when the reply starts.
  private var output: OpaquePointer?
  private var request: OpaquePointer?
  private let loop: EventLoop
  private var connection: OpaquePointer?
  private let scratch: EventBuffer
  private var drained: (() -> Void)?
  /// Called once when the client disconnects or the connection is dropped.
  var onClose: (() -> Void)?

  /// - Parameter scratch: an empty evbuffer, shared by all connections of one server (loop thread only), in
  ///   which references are assembled before evhttp moves them into the connection's output.
  /// Seconds a stream may sit with bytes queued for a peer that takes none (a stalled TCP window) before it is
  /// dropped (`server.timeout_seconds`).
  private let writeTimeout: Double

  init(
    request: OpaquePointer, connection: OpaquePointer, scratch: EventBuffer, loop: EventLoop, writeTimeout: Double
  ) {
    self.writeTimeout = writeTimeout
    self.loop = loop
    self.request = request
    self.connection = connection
    self.scratch = scratch
  }

  /// Starts the chunked reply (headers are already on the request) and watches for the client going away.
  func begin() {
    loop.assertOnLoop()
    guard let request, let connection else { return }
    // Released in sseConnectionClosed, which evhttp calls exactly once when this connection goes away.
    evhttp_connection_set_closecb(connection, sseConnectionClosed, Unmanaged.passRetained(self).toOpaque())
    evhttp_send_reply_start(request, 200, "OK")
    // evhttp chose chunked framing (HTTP/1.1) or none (HTTP/1.0, close-delimited) and said so in the headers.
    if let headers = evhttp_request_get_output_headers(request),
      let encoding = evhttp_find_header(headers, "Transfer-Encoding")
    {
      chunked = String(cString: encoding).lowercased() == "chunked"
    }
    dropHeaders(of: request)
    if let bev = evhttp_connection_get_bufferevent(connection) {
      output = bufferevent_get_output(bev)
      socket = bufferevent_getfd(bev)
      // A stream's client sends nothing after its request, and evhttp keeps EV_READ enabled (for close detection)
      // under the server's read timeout: every stream was cut after server.timeout_seconds, busy or idle, because
      // bytes written straight to the socket (below) never re-arm it. A stream has no read timeout; EOF and resets
      // still end it at once. The write timeout stays: it runs only while bytes wait for a peer that reads none.
      var write = loop.commonTimeout(seconds: writeTimeout)
      bufferevent_set_timeouts(bev, nil, &write)
    }
  }

  /// Frees the request's header lists once the reply has started: a stream lives for hours, and its client's
  /// headers (a browser sends a dozen, cookies included) and the reply's, already written into the output, would
  /// otherwise be kept for all of it (~1 KB per stream with `curl`'s four). Everything the relay needed from them
  /// was read before the stream opened. Only `Connection` stays on the reply: evhttp reads it when the reply ends,
  /// to close the connection instead of waiting for another request on it.
  private func dropHeaders(of request: OpaquePointer) {
    if let input = evhttp_request_get_input_headers(request) { evhttp_clear_headers(input) }
    if let output = evhttp_request_get_output_headers(request) { HTTPRequest.dropAllButConnection(output) }
  }

  var pendingBytes: Int {
    guard isOpen, let output, outputMayHoldBytes else { return 0 }
    let pending = evbuffer_get_length(output)
    if pending == 0 { outputMayHoldBytes = false }
    return pending
  }

  /// Adds one reference straight to the connection's output: evhttp already has the reply in its writing
  /// state (write callback set, EV_WRITE enabled), so this is what evhttp_send_reply_chunk would do, minus the
  /// per-call chunk-header formatting and callback re-arming.
  ///
  /// When nothing is queued ahead of it, the bytes are first offered to the socket directly: a client that keeps
  /// up takes them at once, and then neither an evbuffer chain nor arming and disarming the write event
  /// (two epoll_ctl calls per delivery, measured at about 15 % of the relay's CPU) is needed. Whatever the kernel
  /// does not take is queued as a reference, in order, and the bufferevent writes it (or meets the error) as usual.
  func write(_ bytes: BroadcastBytes) {
    loop.assertOnLoop()
    guard isOpen, request != nil, let output else { return }
    let slice = chunked ? bytes.framed : bytes.payload
    if socket >= 0 && pendingBytes == 0 {
      let sent = Glibc.send(socket, slice.block.base + slice.offset, slice.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
      if sent == slice.count { return }
      if sent > 0 {
        let rest = ByteSlice(block: slice.block, offset: slice.offset + sent, count: slice.count - sent)
        // A stream with a hole in it must not go on: drop it, the client resumes with Last-Event-ID.
        if !addReference(to: rest, in: output) { abort() }
        return
      }
      // EAGAIN: the socket is full; any other error: let the bufferevent meet it and close the connection.
    }
    if !addReference(to: slice, in: output) { abort() }
  }

  func write(_ slices: [ByteSlice]) {
    guard isOpen, let request else { return }
    guard stage(slices) else {
      abort()
      return
    }
    evhttp_send_reply_chunk(request, scratch.raw)
  }

  func write(_ slices: [ByteSlice], whenDrained drained: @escaping () -> Void) {
    guard isOpen, let request else { return }
    guard stage(slices) else {
      abort()
      return
    }
    self.drained = drained
    // The callback gets `self` unretained: evhttp calls it only while the connection, and so the retain held
    // by the close callback, is alive.
    evhttp_send_reply_chunk_with_cb(
      request, scratch.raw, sseConnectionDrained, Unmanaged.passUnretained(self).toOpaque())
  }

  /// Assembles the slices in the shared scratch buffer; false (scratch emptied) when one cannot be added. evhttp
  /// then moves them (and a chunk's framing) into `output`.
  private func stage(_ slices: [ByteSlice]) -> Bool {
    outputMayHoldBytes = true
    for slice in slices where slice.count > 0 {
      guard addReference(to: slice, in: scratch.raw) else {
        evbuffer_drain(scratch.raw, evbuffer_get_length(scratch.raw))
        return false
      }
    }
    return true
  }

  /// Appends `slice` to `buffer` as a reference to the shared block, never a copy. The reference holds one retain
  /// on the block; sharedBytesReleased gives it back when libevent frees that chain.
  @discardableResult
  private func addReference(to slice: ByteSlice, in buffer: OpaquePointer) -> Bool {
    outputMayHoldBytes = true
    let owner = Unmanaged.passRetained(slice.block).toOpaque()
    let added = evbuffer_add_reference(
      buffer, slice.block.base + slice.offset, slice.count, sharedBytesReleased, owner)
    guard added == 0 else {
      // Out of memory: the bytes are not queued, so libevent will never release the block.
      Unmanaged<SharedBytes>.fromOpaque(owner).release()
      return false
    }
    return true
  }

  func finish() {
    guard isOpen, let request else { return }
    drained = nil
    evhttp_send_reply_end(request)
    // evhttp frees the request once the last chunk is written; from here on only the close callback remains.
    self.request = nil
    output = nil
    socket = -1
  }

  func abort() {
    guard isOpen, let connection else { return }
    drained = nil
    // evhttp_connection_free calls the close callback (sseConnectionClosed) before it returns.
    evhttp_connection_free(connection)
  }

  fileprivate func closed() {
    isOpen = false
    // When the client goes away (EOF, reset, timeout) before the reply ended, libevent 2.1 *detaches* the request
    // from the connection instead of freeing it (evhttp_connection_incoming_fail: "the request is still being
    // used for sending") and then frees only the connection: the request, its headers and buffers would leak
    // (~1.7 kB per disconnect, measured). A detached request has no connection any more; it is ours to free.
    // When we drop the connection ourselves (abort), the request is still attached and evhttp frees it with the
    // connection right after this callback.
    if let request, evhttp_request_get_connection(request) == nil {
      evhttp_request_free(request)
    }
    request = nil
    connection = nil
    output = nil
    socket = -1
    drained = nil
    let handler = onClose
    onClose = nil
    handler?()
  }

  fileprivate func didDrain() {
    let handler = drained
    drained = nil
    handler?()
  }
}

private let sseConnectionClosed: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  _, context in
  guard let context else { return }
  // Balances the passRetained in SSEConnection.begin.
  Unmanaged<SSEConnection>.fromOpaque(context).takeRetainedValue().closed()
}

private let sseConnectionDrained: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  _, context in
  guard let context else { return }
  Unmanaged<SSEConnection>.fromOpaque(context).takeUnretainedValue().didDrain()
}

/// Gives back the retain a reference chain held on its `SharedBytes` block.
let sharedBytesReleased: @convention(c) (UnsafeRawPointer?, Int, UnsafeMutableRawPointer?) -> Void = {
  _, _, owner in
  guard let owner else { return }
  Unmanaged<SharedBytes>.fromOpaque(owner).release()
}

/// An owned evbuffer, freed with its owner.
final class EventBuffer: @unchecked Sendable {  // loop thread only
  let raw: OpaquePointer
  init() { raw = evbuffer_new()! }
  deinit { evbuffer_free(raw) }
}
