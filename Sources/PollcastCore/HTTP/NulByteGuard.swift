import CLibevent
import Foundation

/// Refuses a connection whose request bytes hold a NUL. evhttp reads header lines as C strings, so
/// `Authorization: Bearer abc\0X` would reach the relay as `Bearer abc`: a different key than the client sent, used
/// and sent upstream. The bytes are checked as they arrive, before evhttp parses them: with a NUL, the connection's
/// input is dropped, a 400 is written and the socket shut, so nothing of that request is read. The relay takes no
/// request bodies, so a NUL anywhere on a connection is refused.
enum NulByteGuard {
  /// Watches `bufferevent`'s input (called as the bufferevent is made, before evhttp reads from it).
  static func watch(_ bufferevent: OpaquePointer) {
    guard let input = bufferevent_get_input(bufferevent) else { return }
    // The context is the bufferevent, which owns the input buffer and so outlives every call of the callback.
    evbuffer_add_cb(input, nulByteGuardBytesAdded, UnsafeMutableRawPointer(bufferevent))
  }

  static let refusal = Array(
    ("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 35\r\n"
      + "Connection: close\r\n\r\nthe request holds a NUL byte (0x00)\n").utf8)
}

/// The input buffer's callback: runs when bytes arrive, before evhttp's read callback parses them.
private let nulByteGuardBytesAdded:
  @convention(c) (OpaquePointer?, UnsafePointer<evbuffer_cb_info>?, UnsafeMutableRawPointer?) -> Void = {
    buffer, info, context in
    guard let buffer, let info, info.pointee.n_added > 0, let context else { return }
    var nul: CChar = 0
    guard evbuffer_search(buffer, &nul, 1, nil).pos >= 0 else { return }
    evbuffer_drain(buffer, evbuffer_get_length(buffer))
    let fd = bufferevent_getfd(OpaquePointer(context))
    guard fd >= 0 else { return }
    _ = NulByteGuard.refusal.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
    // evhttp then reads the end of the stream and frees the connection.
    Glibc.shutdown(fd, Int32(SHUT_RDWR))
  }
