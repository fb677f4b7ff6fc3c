import CLibevent
import Foundation

/// A read-only view of an incoming evhttp request. Valid only during the request callback, on the loop thread.
public struct HTTPRequest: @unchecked Sendable {  // a view of a C object, used on the loop thread only
  public let raw: OpaquePointer

  public init(raw: OpaquePointer) { self.raw = raw }

  public enum Method: String, Sendable {
    case get = "GET"
    case head = "HEAD"
    case post = "POST"
    case put = "PUT"
    case delete = "DELETE"
    case options = "OPTIONS"
    case trace = "TRACE"
    case connect = "CONNECT"
    case patch = "PATCH"
    case other = "OTHER"
  }

  public var method: Method {
    switch evhttp_request_get_command(raw) {
    case EVHTTP_REQ_GET: .get
    case EVHTTP_REQ_HEAD: .head
    case EVHTTP_REQ_POST: .post
    case EVHTTP_REQ_PUT: .put
    case EVHTTP_REQ_DELETE: .delete
    case EVHTTP_REQ_OPTIONS: .options
    case EVHTTP_REQ_TRACE: .trace
    case EVHTTP_REQ_CONNECT: .connect
    case EVHTTP_REQ_PATCH: .patch
    default: .other
    }
  }

  /// The peer's IP address, as evhttp saw it.
  public var peerAddress: String? {
    guard let connection else { return nil }
    var address: UnsafeMutablePointer<CChar>?
    var port: UInt16 = 0
    evhttp_connection_get_peer(connection, &address, &port)
    return address.map { String(cString: $0) }
  }

  /// The request target as sent (path and query, still percent-encoded).
  public var uri: String {
    guard let uri = evhttp_request_get_uri(raw) else { return "" }
    return String(cString: uri)
  }

  public var uriLength: Int {
    guard let uri = evhttp_request_get_uri(raw) else { return 0 }
    return strlen(uri)
  }

  /// The decoded path, or nil when the target does not parse or its decoded path holds a NUL byte
  /// (`/metrics%00.css` must not be served as `/metrics`: C strings would end at the NUL).
  public var path: String? {
    guard let parsed = evhttp_request_get_evhttp_uri(raw), let path = evhttp_uri_get_path(parsed) else { return nil }
    var size = 0
    guard let decoded = evhttp_uridecode(path, 0, &size) else { return nil }
    defer { free(decoded) }
    guard strlen(decoded) == size else { return nil }
    return String(cString: decoded)
  }

  /// Query parameters in order, decoded the way browsers do (`QueryString`).
  public var queryItems: [(String, String)] {
    guard let parsed = evhttp_request_get_evhttp_uri(raw), let query = evhttp_uri_get_query(parsed) else { return [] }
    return QueryString.parse(String(cString: query)).map { ($0.name, $0.value) }
  }

  /// Every value of header `name` (case-insensitive), in order.
  public func headerValues(_ name: String) -> [String] {
    guard let headers = evhttp_request_get_input_headers(raw) else { return [] }
    var values: [String] = []
    var entry = pollcast_evkeyvalq_first(headers)
    while let current = entry {
      if strcasecmp(current.pointee.key, name) == 0 { values.append(String(cString: current.pointee.value)) }
      entry = pollcast_evkeyval_next(current)
    }
    return values
  }

  /// Why the request's framing cannot be trusted, if it cannot (RFC 9112 §6.3): two Content-Length headers, or
  /// Content-Length beside Transfer-Encoding. Behind a lenient proxy either one lets a request hide another
  /// (smuggling); such a request is refused and its connection closed.
  public var framingProblem: String? {
    let lengths = headerValues("Content-Length")
    if lengths.count > 1 { return "more than one Content-Length header" }
    if !lengths.isEmpty && !headerValues("Transfer-Encoding").isEmpty {
      return "both Content-Length and Transfer-Encoding"
    }
    return nil
  }

  /// Why a header value cannot be trusted, if one cannot: a control byte other than HTAB (RFC 9110 §5.5). Such a
  /// request is refused before any header is used (a key, a resume id, an origin).
  public var headerValueProblem: String? {
    guard let headers = evhttp_request_get_input_headers(raw) else { return nil }
    var entry = pollcast_evkeyvalq_first(headers)
    while let current = entry {
      if let value = current.pointee.value {
        var byte = value
        while byte.pointee != 0 {
          if OutgoingRequest.isControlInFieldValue(UInt8(bitPattern: byte.pointee)) {
            let name = current.pointee.key.map { String(cString: $0) } ?? "?"
            return "the value of \(JSONText.quoted(String(name.prefix(40)))) holds a control byte"
          }
          byte += 1
        }
      }
      entry = pollcast_evkeyval_next(current)
    }
    return nil
  }

  public func header(_ name: String) -> String? {
    guard let headers = evhttp_request_get_input_headers(raw), let value = evhttp_find_header(headers, name) else {
      return nil
    }
    return String(cString: value)
  }

  public var connection: OpaquePointer? { evhttp_request_get_connection(raw) }

  /// The request body as text (bodies are bounded by the server's max body size).
  public var bodyText: String {
    guard let buffer = evhttp_request_get_input_buffer(raw) else { return "" }
    let length = evbuffer_get_length(buffer)
    guard length > 0, let bytes = evbuffer_pullup(buffer, length) else { return "" }
    return String(decoding: UnsafeBufferPointer(start: bytes, count: length), as: UTF8.self)
  }

  // MARK: Responses

  public func addHeader(_ name: String, _ value: String) {
    // evhttp refuses (-1) a value with CR or LF: every value the relay sets is its own (numbers, fixed words,
    // matched origins), so a refusal is a bug, not input.
    let added = evhttp_add_header(evhttp_request_get_output_headers(raw), name, value)
    assert(added == 0, "evhttp refused header \(name)")
  }

  /// Frees every field of an evhttp header list but `Connection`, for a request or reply whose head is already
  /// written and which may live long (a stream, a held poll). evhttp reads `Connection` from both lists when the
  /// exchange ends, to close the connection or keep it, and nothing else from them after the head is written.
  static func dropAllButConnection(_ headers: UnsafeMutablePointer<evkeyvalq>) {
    let connection = evhttp_find_header(headers, "Connection").map { String(cString: $0) }
    evhttp_clear_headers(headers)
    // The value was accepted once; only memory can refuse it now, and then evhttp keeps the connection open.
    if let connection { _ = evhttp_add_header(headers, "Connection", connection) }
  }

  /// Sets `name` to `value`, replacing any value it had (a header that must appear once, like `Connection`).
  public func setHeader(_ name: String, _ value: String) {
    let headers = evhttp_request_get_output_headers(raw)
    while evhttp_remove_header(headers, name) == 0 {}
    addHeader(name, value)
  }

  /// Sends a complete response.
  public func respond(
    status: Int32, reason: String, contentType: String? = nil, body: String = "", headers: [(String, String)] = []
  ) {
    if let contentType { addHeader("Content-Type", contentType) }
    for (name, value) in headers {
      if name.lowercased() == "connection" { setHeader(name, value) } else { addHeader(name, value) }
    }
    let buffer = evbuffer_new()
    defer { evbuffer_free(buffer) }
    if !body.isEmpty {
      var text = body
      let added = text.withUTF8 { bytes in evbuffer_add(buffer, bytes.baseAddress, bytes.count) }
      if added != 0 {
        evhttp_send_error(raw, 500, nil)  // out of memory: never a truncated body with a 200
        return
      }
    }
    evhttp_send_reply(raw, status, reason, buffer)
  }

  /// Sends a complete response whose body is raw bytes.
  public func respond(
    status: Int32, reason: String, contentType: String, bytes: [UInt8], headers: [(String, String)] = []
  ) {
    addHeader("Content-Type", contentType)
    for (name, value) in headers { addHeader(name, value) }
    let buffer = evbuffer_new()
    defer { evbuffer_free(buffer) }
    if bytes.withUnsafeBytes({ evbuffer_add(buffer, $0.baseAddress, $0.count) }) != 0 {
      evhttp_send_error(raw, 500, nil)  // out of memory: never a truncated body
      return
    }
    evhttp_send_reply(raw, status, reason, buffer)
  }

  /// A plain-text error with a reason a person can read.
  public func respondError(status: Int32, reason: String, message: String, headers: [(String, String)] = []) {
    respond(
      status: status, reason: reason, contentType: "text/plain; charset=utf-8", body: message + "\n",
      headers: headers)
  }
}
