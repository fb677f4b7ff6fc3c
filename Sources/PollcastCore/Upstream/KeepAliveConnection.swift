import CLibevent
import Foundation

/// One upstream client's kept-alive HTTP/1.1 connection, through libevent's own HTTP client (`evhttp`), for the
/// requests that need nothing libcurl adds: plain `http://`, no proxy, no userinfo. A host name is connected to at
/// the address libcurl last reached it at (`UpstreamClient` learns it); this client never resolves a name.
///
/// Why: a per-user relay re-polls every account all the time, and libcurl's transfer model costs most of an idle
/// cycle (issue 23, sixth step): a transfer made and freed per request, three `poll` calls checking that a kept
/// connection is alive before reusing it, and the socket unwatched when a transfer ends and watched again when the
/// next one starts. Here the connection stays open and watched between polls (evhttp watches it for a close), and a
/// cycle is one `recv` and one `send` on the socket. Everything else (TLS, resolving names, proxies, a second request
/// while one is in flight) still goes through libcurl: `UpstreamClient.send` picks per request.
///
/// Loop-confined: made, used and freed on the loop thread.
final class KeepAliveConnection: LoopPassEndWork, @unchecked Sendable {  // loop-confined
  let loop: EventLoop
  /// Largest answer body accepted (evhttp refuses a longer one before reading it all).
  var maxBodyBytes: Int
  /// Largest answer header block accepted.
  static let maxHeaderBytes = 64 << 10
  private var connection: OpaquePointer?
  private var connectedTarget: Target?
  private var readTimeout = -1.0
  private var current: PendingExchange?
  /// The exchange whose request `passEnded` writes (set by `issue`).
  private var awaitingPassEnd: PendingExchange?
  private var deadline: LoopTimer?
  /// Requests sent on this connection (one per exchange); for tests and the bench.
  private(set) var requestsSent = 0
  /// The last exchange failed without ever reaching the server (refused, unreachable, no connection in time):
  /// nothing was sent, so the request may go another way at once.
  private(set) var lastFailedBeforeConnecting = false

  /// True when the relay was told to use libcurl for every request (`POLLCAST_UPSTREAM_CLIENT=curl`), or when a
  /// proxy is configured in the environment (libcurl honours it; this client does not).
  static let disabled: Bool = {
    let environment = ProcessInfo.processInfo.environment
    if environment["POLLCAST_UPSTREAM_CLIENT"]?.lowercased() == "curl" { return true }
    return ["http_proxy", "all_proxy", "ALL_PROXY"].contains { !(environment[$0] ?? "").isEmpty }
  }()

  init(loop: EventLoop, maxBodyBytes: Int) {
    self.loop = loop
    self.maxBodyBytes = maxBodyBytes
  }

  deinit {
    deadline = nil
    if let current {
      // Nothing waits on an exchange of a client that is gone, but a continuation must not be dropped unresumed.
      self.current = nil
      current.settle(.failure(UpstreamError(.cancelled, "cancelled")))
    }
    guard let connection else { return }
    // evhttp_connection_free frees the queued request without calling back.
    let doomed = UncheckedPointer(connection)
    if loop.inLoopThread || !loop.isRunning {
      evhttp_connection_free(doomed.pointer)
    } else {
      loop.execute { evhttp_connection_free(doomed.pointer) }
    }
  }

  /// Where a request goes, parsed from its URL.
  struct Target: Equatable {
    /// The address connected to: the URL's IP address, or for a name (`named`) the address it was reached at.
    var host: String
    var port: UInt16
    /// The URL's host name, when it names one (`host` holds it too until `UpstreamClient` puts the address libcurl
    /// reached it at in its place); nil for an IP address.
    var name: String?
    var named: Bool { name != nil }
    /// The URL's authority, sent as `Host`.
    var authority: Substring
    /// Path and query (the request target).
    var path: Substring
    /// The URL up to its authority's end (`http://host:port`), as written: a later URL that starts with it and then
    /// a path has this target's host, port and name (`target(for:after:)`).
    /// Shares the URL's storage with `authority`: no allocation of its own.
    var origin: Substring = ""

    static func == (a: Target, b: Target) -> Bool { a.host == b.host && a.port == b.port }
  }

  /// Why the last answer's framing cannot be trusted (an interim 1xx answer, bytes past its end, two differing
  /// `Content-Length` fields), or nil. The connection is then never used again: the next request gets a fresh one,
  /// and `UpstreamClient` sends its later requests through libcurl, which skips interim answers and drops excess
  /// bytes itself.
  private(set) var misframed: Misframing?

  /// What a server did that this client's framing cannot follow. One byte: every account's connection keeps it.
  enum Misframing: UInt8, Sendable, CustomStringConvertible {
    case interim, conflictingLength, excessBytes

    /// The answer itself was refused (none of it used); with `excessBytes` only, the answer stood and what followed
    /// it was dropped.
    var refusedAnswer: Bool { self != .excessBytes }

    var description: String {
      switch self {
      case .interim: "the upstream sent an interim 1xx answer, which the kept connection does not skip"
      case .conflictingLength: "the answer has conflicting Content-Length or Transfer-Encoding fields"
      case .excessBytes: "the upstream sent bytes past the end of its answer"
      }
    }
  }

  /// True when the socket holds bytes nobody asked for: an idle connection's input is always empty (evhttp resets
  /// a connection that receives bytes while idle), so whatever is there is a server's excess or a forged answer.
  private static func holdsUnaskedBytes(_ connection: OpaquePointer) -> Bool {
    guard let event = evhttp_connection_get_bufferevent(connection), let input = bufferevent_get_input(event) else {
      return false
    }
    return evbuffer_get_length(input) > 0
  }

  /// Checks an answer's framing as it completes, in its callback: bytes past the answer are drained (never read as
  /// the next request's answer) and, with an interim answer or conflicting lengths, the answer is refused. Returns
  /// why the answer must be refused, or nil; `misframed` says why the connection is not used again.
  fileprivate func checkFraming(_ raw: OpaquePointer) -> Misframing? {
    var refusal: Misframing?
    let status = Int(evhttp_request_get_response_code(raw))
    if (100...199).contains(status) {
      refusal = .interim
    } else if let headers = evhttp_request_get_input_headers(raw), Self.hasConflictingLength(headers) {
      refusal = .conflictingLength
    }
    if let connection, let event = evhttp_connection_get_bufferevent(connection),
      let input = bufferevent_get_input(event), evbuffer_get_length(input) > 0
    {
      evbuffer_drain(input, evbuffer_get_length(input))
      misframed = .excessBytes
    }
    if let refusal { misframed = refusal }
    return refusal
  }

  /// Two `Content-Length` fields that differ, or one beside `Transfer-Encoding`: which one frames the body is
  /// ambiguous (request smuggling's classic), so the answer is not trusted.
  private static func hasConflictingLength(_ headers: UnsafeMutablePointer<evkeyvalq>) -> Bool {
    // C string comparisons: this runs for every answer, and a Swift string per header would allocate each time.
    var length: UnsafeMutablePointer<CChar>?
    var chunked = false
    var field = pollcast_evkeyvalq_first(headers)
    while let current = field {
      if let key = current.pointee.key, let value = current.pointee.value {
        if strcasecmp(key, "Content-Length") == 0 {
          if let length, strcmp(length, value) != 0 { return true }
          length = value
        } else if strcasecmp(key, "Transfer-Encoding") == 0 {
          chunked = true
        }
      }
      field = pollcast_evkeyval_next(current)
    }
    return chunked && length != nil
  }

  /// True while a request is in flight on this connection (a second one goes through libcurl meanwhile).
  var busy: Bool { current != nil }

  /// The request's target when this connection can carry `request`, nil when libcurl must. `known`, a target
  /// parsed before (the previous request's), spares the parse when the URL has its origin and then a path: an
  /// account polls the same origin every time, and the parse (Substring scans, `inet_pton`) was ~2 % of the relay's
  /// samples at 100 polls a second.
  static func target(for request: UpstreamRequest, after known: Target? = nil) -> Target? {
    guard !disabled, method(request.method) != nil else { return nil }
    if request.body != nil && request.method != "POST" && request.method != "PUT" { return nil }
    if let known, !known.origin.isEmpty, let path = path(of: request.url, after: known.origin) {
      var reused = known
      reused.path = path
      return reused
    }
    // Byte scans on the UTF-8 view: this runs for every request, and Character-level scanning (grapheme breaking)
    // of the URL cost ~5 µs a poll at 1,000 polls a second. Every delimiter is ASCII, so the indices found are
    // valid for the string itself.
    let url = request.url
    let bytes = url.utf8
    // The scheme's letters in any case; "://" exactly (`| 0x20` would also take 0x1A for ":" and 0x0F for "/").
    guard bytes.count > 7, bytes.prefix(4).lazy.map({ $0 | 0x20 }).elementsEqual("http".utf8),
      bytes.dropFirst(4).prefix(3).elementsEqual("://".utf8)
    else { return nil }
    let restStart = bytes.index(bytes.startIndex, offsetBy: 7)
    let authorityEnd =
      bytes[restStart...].firstIndex { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }
      ?? bytes.endIndex
    let authorityBytes = bytes[restStart..<authorityEnd]
    guard !authorityBytes.isEmpty, !authorityBytes.contains(UInt8(ascii: "@")) else { return nil }
    var hostRange: Range<String.Index>
    var portStart: String.Index? = nil
    var named = false
    if authorityBytes.first == UInt8(ascii: "[") {
      guard let close = authorityBytes.firstIndex(of: UInt8(ascii: "]")) else { return nil }
      hostRange = bytes.index(after: restStart)..<close
      let after = bytes.index(after: close)
      if after != authorityEnd {
        guard bytes[after] == UInt8(ascii: ":") else { return nil }
        portStart = bytes.index(after: after)
      }
      guard isAddress(url[hostRange], family: AF_INET6) else { return nil }
    } else {
      if let colon = authorityBytes.firstIndex(of: UInt8(ascii: ":")) {
        hostRange = restStart..<colon
        portStart = bytes.index(after: colon)
      } else {
        hostRange = restStart..<authorityEnd
      }
      // A name is resolved by libcurl, never here (libevent would block the loop, or try one address only).
      if !isAddress(url[hostRange], family: AF_INET) {
        guard isHostName(url[hostRange]) else { return nil }
        named = true
      }
    }
    var port: UInt16 = 80
    if let portStart, portStart != authorityEnd {
      let digits = bytes[portStart..<authorityEnd]
      guard digits.count <= 5, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
      let value = digits.reduce(0) { $0 * 10 + Int($1 - 0x30) }
      guard value > 0, value <= 65535 else { return nil }
      port = UInt16(value)
    }
    var pathEnd = bytes.endIndex
    if let hash = bytes[authorityEnd...].firstIndex(of: UInt8(ascii: "#")) { pathEnd = hash }
    let path = url[authorityEnd..<pathEnd]
    // "http://host?x" asks for "/?x"; a target must start with "/".
    guard path.utf8.first == UInt8(ascii: "/") || path.isEmpty else { return nil }
    let host = String(url[hostRange])
    return Target(
      host: host, port: port, name: named ? host : nil,
      authority: url[restStart..<authorityEnd],
      path: path.isEmpty ? "/" : path, origin: url[..<authorityEnd])
  }

  /// `url`'s path and query (its fragment cut) when it is `origin` followed by a path (`/…`); nil otherwise (then
  /// the URL is parsed whole: another origin, a bare origin, a query right after the authority).
  private static func path(of url: String, after origin: Substring) -> Substring? {
    var origin = origin
    let bounds: (start: Int, end: Int)? = origin.withUTF8 { prefix in
      url.utf8.withContiguousStorageIfAvailable { bytes -> (start: Int, end: Int)? in
        guard bytes.count > prefix.count, bytes[prefix.count] == UInt8(ascii: "/"),
          memcmp(bytes.baseAddress!, prefix.baseAddress!, prefix.count) == 0
        else { return nil }
        let rest = UnsafeRawPointer(bytes.baseAddress! + prefix.count)
        guard let hash = memchr(rest, Int32(UInt8(ascii: "#")), bytes.count - prefix.count) else {
          return (prefix.count, bytes.count)
        }
        return (prefix.count, prefix.count + (UnsafeRawPointer(hash) - rest))
      } ?? nil
    }
    guard let bounds else { return nil }
    let start = url.utf8.index(url.utf8.startIndex, offsetBy: bounds.start)
    let end = url.utf8.index(start, offsetBy: bounds.end - bounds.start)
    return url[start..<end]
  }

  /// A DNS name as libcurl would resolve it (letters, digits, `-`, `_`, dots; not all digits and dots, which is a
  /// malformed address that libcurl refuses itself).
  private static func isHostName(_ text: Substring) -> Bool {
    let bytes = text.utf8
    guard !bytes.isEmpty, bytes.count <= 253 else { return false }
    var sawLetter = false
    for byte in bytes {
      switch byte {
      case 0x30...0x39, UInt8(ascii: "."): continue
      case 0x41...0x5A, 0x61...0x7A, UInt8(ascii: "-"), UInt8(ascii: "_"): sawLetter = true
      default: return false
      }
    }
    return sawLetter
  }

  /// True when `address` is an IPv4 or IPv6 address in text (what libcurl reports it reached a name at).
  static func isAddress(_ address: String) -> Bool {
    let text = Substring(address)
    return isAddress(text, family: AF_INET) || isAddress(text, family: AF_INET6)
  }

  /// True when the connection holds an open socket to `target`'s address (kept from an earlier exchange).
  func holdsOpenSocket(to target: Target) -> Bool {
    guard connectedTarget == target, let connection else { return false }
    return Self.hasOpenSocket(connection)
  }

  /// True when `connection` holds an open socket: one kept, connected, from an earlier exchange (evhttp closes it
  /// and forgets the descriptor when the server closes an idle one, or after a failure or a cancel).
  private static func hasOpenSocket(_ connection: OpaquePointer) -> Bool {
    guard let event = evhttp_connection_get_bufferevent(connection) else { return false }
    return bufferevent_getfd(event) >= 0
  }

  private static func isAddress(_ text: Substring, family: Int32) -> Bool {
    guard !text.isEmpty, text.utf8.count < 64 else { return false }
    var storage = in6_addr()
    return String(text).withCString { inet_pton(family, $0, &storage) } == 1
  }

  static func method(_ name: String) -> evhttp_cmd_type? {
    switch name {
    case "GET": EVHTTP_REQ_GET
    case "POST": EVHTTP_REQ_POST
    case "PUT": EVHTTP_REQ_PUT
    case "DELETE": EVHTTP_REQ_DELETE
    case "HEAD": EVHTTP_REQ_HEAD
    case "OPTIONS": EVHTTP_REQ_OPTIONS
    default: nil
    }
  }

  /// Where the next `perform` sends its request (set by `stage`).
  private var staged: Target?
  /// The host name the last request went to (at a learned address), nil for an IP address.
  private(set) var lastTargetName: String?

  /// Sets where the next `perform` goes. Kept here rather than passed, so that the caller's async frame, which an
  /// account keeps while its poll hangs, does not hold it.
  func stage(_ target: Target) { staged = target }

  /// Runs `pending`'s request (already checked by `OutgoingRequest.check`) to the target staged last (`stage`) on
  /// the kept connection; returns with `pending.outcome` set. Cancelling the calling task cancels the request. Must
  /// be called on the loop, with no request in flight (`busy` false).
  func perform(_ pending: PendingExchange, isolation: isolated (any Actor)? = #isolation) async {
    // The request and its outcome travel in `pending`, and neither this frame nor the continuation holds a
    // response or an error: an account keeps this chain of frames while its poll hangs, and a generic result or
    // error costs a slot in every frame on the way (with a checked continuation's frame the chain outgrew its
    // slab by the runtime's small record for the suspension).
    await withTaskCancellationHandler {
      await withUnsafeContinuation(isolation: isolation) { continuation in begin(pending, continuation) }
    } onCancel: { [loop] in
      loop.execute { [self] in
        guard pending.continuation != nil else { return }
        cancel()
      }
    }
  }

  /// `perform`'s synchronous start: `pending`'s request to the staged target, `continuation` resumed (its outcome
  /// in `pending`) when it ends.
  private func begin(_ pending: PendingExchange, _ continuation: UnsafeContinuation<Void, Never>) {
    if Task.isCancelled {
      pending.outcome = .failure(UpstreamError(.cancelled, "cancelled"))
      continuation.resume()
      return
    }
    pending.continuation = continuation
    guard let target = staged else {
      pending.settle(.failure(UpstreamError(.transport, "no target staged for the kept connection")))
      return
    }
    staged = nil
    start(pending, to: target)
  }

  /// Starts `exchange`'s request; the exchange is settled on the loop exactly once (with `.cancelled` when
  /// cancelled).
  private func start(_ exchange: PendingExchange, to target: Target) {
    loop.assertOnLoop()
    precondition(current == nil, "one request at a time on a kept-alive connection")
    let request = exchange.request
    lastTargetName = target.name
    lastFailedBeforeConnecting = false
    guard let method = Self.method(request.method) else {
      exchange.settle(
        .failure(UpstreamError(.transport, "method \(request.method) is not carried by the kept connection")))
      return
    }
    if let old = connection, connectedTarget != target || misframed != nil || Self.holdsUnaskedBytes(old) {
      // Another target, or a connection whose framing cannot be trusted (bytes the server sent beyond an answer, or
      // before this request was sent): idle (no exchange in flight), so this frees nothing else.
      evhttp_connection_free(old)
      connection = nil
      misframed = nil
    }
    if connection == nil {
      guard let made = evhttp_connection_base_new(loop.base, nil, target.host, target.port) else {
        exchange.settle(
          .failure(UpstreamError(.transport, "cannot make a connection to \(target.host):\(target.port)")))
        return
      }
      evhttp_connection_set_max_body_size(made, maxBodyBytes)
      evhttp_connection_set_max_headers_size(made, Self.maxHeaderBytes)
      evhttp_connection_set_retries(made, 0)
      connection = made
      connectedTarget = target
      readTimeout = -1
    }
    guard let connection else { return }
    // evhttp's read and write inactivity timeout; the exchange's own deadline (below) ends the total time. Every
    // account's connection has the same one: a common timeout (evhttp re-arms it on every read and write).
    if readTimeout != request.timeout {
      var tv = loop.commonTimeout(seconds: max(0.001, request.timeout))
      evhttp_connection_set_timeout_tv(connection, &tv)
      readTimeout = request.timeout
    }
    exchange.onConnection(target: target, method: method, owner: self)
    current = exchange
    armDeadline(for: exchange, connecting: !Self.hasOpenSocket(connection))
    issue(exchange, on: connection)
  }

  /// Sends `exchange`'s request on `connection` (its first try, or its one retry on a fresh connection).
  private func issue(_ exchange: PendingExchange, on connection: OpaquePointer) {
    let request = exchange.request
    guard let target = exchange.target else {
      finish(exchange, .failure(UpstreamError(.transport, "no target for the kept connection's request")))
      return
    }
    // Unretained: `current` holds the exchange until it completes or is cancelled, and libevent calls back for it
    // only before that (a cancelled or freed request never calls back).
    let context = Unmanaged.passUnretained(exchange).toOpaque()
    guard let raw = evhttp_request_new(keepAliveRequestDone, context) else {
      finish(exchange, .failure(UpstreamError(.transport, "evhttp_request_new failed")))
      return
    }
    evhttp_request_set_error_cb(raw, keepAliveRequestError)
    let headers = evhttp_request_get_output_headers(raw)
    var added = evhttp_add_header(headers, "Host", String(target.authority))
    var hasAccept = false
    var hasAgent = false
    for (name, value) in request.headers {
      if added != 0 { break }
      hasAccept = hasAccept || name.caseInsensitiveEquals("Accept")
      hasAgent = hasAgent || name.caseInsensitiveEquals("User-Agent")
      added = evhttp_add_header(headers, name, value)
    }
    if added == 0 && !hasAgent { added = evhttp_add_header(headers, "User-Agent", Self.userAgent) }
    if added == 0 && !hasAccept { added = evhttp_add_header(headers, "Accept", "*/*") }
    if added == 0, let body = request.body, !body.isEmpty {
      added = body.withUnsafeBytes { evbuffer_add(evhttp_request_get_output_buffer(raw), $0.baseAddress, $0.count) }
    }
    guard added == 0 else {
      evhttp_request_free(raw)
      // OutgoingRequest.check ran first, so this is libevent's own refusal (or memory).
      finish(exchange, .failure(UpstreamError(.unsafeRequest, "\(request.label) request refused by the HTTP client")))
      return
    }
    exchange.raw = raw
    exchange.errorCode = nil
    exchange.onKeptSocket = Self.hasOpenSocket(connection)
    requestsSent += 1
    // On -1 the request is freed and its callback may have run already: `current` tells.
    if evhttp_make_request(connection, raw, exchange.method, String(target.path)) != 0, current === exchange {
      finish(exchange, .failure(UpstreamError(.transport, "cannot send the request to \(target.host):\(target.port)")))
      return
    }
    // On a connected socket evhttp wrote the request's head into the output at once; the header list is not read
    // again (but for `Connection`), and a held poll would keep it for its whole hold. A request still waiting for
    // its connection keeps its headers until it is written.
    if current === exchange, exchange.raw == raw, let headers,
      let event = evhttp_connection_get_bufferevent(connection), let output = bufferevent_get_output(event),
      evbuffer_get_length(output) > 0
    {
      HTTPRequest.dropAllButConnection(headers)
      if exchange.onKeptSocket, !exchange.retried, loop.atPassEnd(self) { awaitingPassEnd = exchange }
    }
  }

  /// The end of the loop's pass over its jobs (asked by `issue`): the request issued then, if it is still this
  /// connection's and its head still waits in the output, is written now (`writeAtOnce`).
  func passEnded() {
    guard let exchange = awaitingPassEnd else { return }
    awaitingPassEnd = nil
    guard current === exchange, exchange.raw != nil, !exchange.retried, let connection,
      let event = evhttp_connection_get_bufferevent(connection), let output = bufferevent_get_output(event),
      evbuffer_get_length(output) > 0
    else { return }
    Self.writeAtOnce(event, output)
  }

  /// Writes a request's head, which evhttp has put in a connected socket's output in this loop turn, before the loop
  /// polls again. evhttp leaves the writing to the bufferevent: it turns on the socket's write watch, and the next
  /// `epoll_wait` reports the socket writable (as an idle kept socket always is) for one `writev`; evhttp then turns
  /// the watch off and starts reading the answer. That is a loop turn and an `epoll_wait` of every poll cycle spent
  /// on a write that cannot block, and with the change list the watch's on and off are two `epoll_ctl` more. Here the
  /// bufferevent's own write step runs, with libevent's calls: the output's start unfrozen for `evbuffer_write` (a
  /// bufferevent freezes it so that only it drains the output; a frozen buffer writes nothing), frozen again, and when
  /// the whole head went out, `bufferevent_trigger` runs evhttp's write callback as the write watch would have —
  /// evhttp turns the watch off before the change list reaches the kernel, and reads the answer. Whatever does not go
  /// out at once (a full socket, a peer that has closed) stays in the output for the watch, the path it always had,
  /// and its failure reaches the request's callbacks as before. Only for a socket kept from an earlier exchange (a
  /// fresh connection's head is written by evhttp once the connect completes), and at the end of the loop's pass
  /// over its jobs rather than in the cycle's own job: the requests of every cycle the pass ran go out back to back.
  /// Written one per cycle, between the cycles' other work, each woke a legacy API on the same host again (at 1,000
  /// re-polls a second the kernel's wake-ups, `sock_def_readable`, went from 4 to 7 % of the relay's samples).
  private static func writeAtOnce(_ event: OpaquePointer, _ output: OpaquePointer) {
    let fd = bufferevent_getfd(event)
    guard fd >= 0 else { return }
    evbuffer_unfreeze(output, 1)
    let written = evbuffer_write(output, fd)
    evbuffer_freeze(output, 1)
    guard written > 0, evbuffer_get_length(output) == 0 else { return }
    bufferevent_trigger(event, Int16(EV_WRITE), 0)
  }

  /// Sends `exchange` once more when the server closed a kept connection under it before any answer: the race every
  /// keep-alive client meets when a server drops an idle connection just as a request goes out (a keep-alive
  /// timeout, a restart). libcurl retries this case once on a fresh connection too, so either client polls the same
  /// way. Only once, and only from a kept socket: a fresh connection that closes is the server's answer. False when
  /// the failure stands.
  fileprivate func retryOnFreshConnection(_ exchange: PendingExchange) -> Bool {
    guard current === exchange, exchange.onKeptSocket, !exchange.retried, let connection else { return false }
    exchange.retried = true
    armDeadline(for: exchange, connecting: true)  // a fresh connection: its connect is watched again
    issue(exchange, on: connection)
    return true
  }

  private static let userAgent = "pollcast/\(PollcastVersion.current)"

  /// One timer per connection, re-armed per exchange (and for its retry): first at the connect deadline (is the
  /// socket connected by then?) when `connecting`, then at the total deadline, counted from the exchange's start. A
  /// request on a kept socket, already connected, has only the total deadline: checking the connect made the timer
  /// fire once more for every poll held longer than the connect timeout (a wake-up, a `getpeername` and a re-arm
  /// per poll).
  private func armDeadline(for exchange: PendingExchange, connecting: Bool) {
    if deadline == nil {
      deadline = LoopTimer(loop: loop) { [weak self] in self?.deadlinePassed() }
    }
    let request = exchange.request
    let left = exchange.timeLeft
    exchange.checkingConnect = connecting && request.connectTimeout < left
    if exchange.checkingConnect {
      deadline?.schedule(after: max(0.001, request.connectTimeout), common: true)
    } else if request.timeout - left < 0.001 {
      // Armed as the exchange starts (not for its retry): the whole timeout, the same for every account's exchange.
      deadline?.schedule(after: max(0.001, request.timeout), common: true)
    } else {
      deadline?.schedule(after: max(0.001, left))
    }
  }

  private func deadlinePassed() {
    guard let exchange = current else { return }
    let request = exchange.request
    if exchange.checkingConnect {
      exchange.checkingConnect = false
      if isConnected() {
        deadline?.schedule(after: max(0.001, exchange.timeLeft))
        return
      }
      exchange.failedBeforeConnecting = true
      abort(exchange, UpstreamError(.timeout, "no connection within \(request.connectTimeout) s"))
      return
    }
    abort(exchange, UpstreamError(.timeout, "no complete answer within \(request.timeout) s"))
  }

  private func isConnected() -> Bool {
    guard let connection, let event = evhttp_connection_get_bufferevent(connection) else { return false }
    let fd = bufferevent_getfd(event)
    guard fd >= 0 else { return false }
    var address = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    return withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) }
    } == 0
  }

  /// Cancels the request in flight, if any: its completion gets `.cancelled`.
  func cancel() {
    guard let exchange = current else { return }
    abort(exchange, UpstreamError(.cancelled, "cancelled"))
  }

  /// Ends `exchange` before its answer: libevent cancels the request (resetting the connection, which is reopened
  /// for the next one) and does not call back for it.
  private func abort(_ exchange: PendingExchange, _ error: UpstreamError) {
    if let raw = exchange.raw {
      exchange.raw = nil
      evhttp_cancel_request(raw)
    }
    finish(exchange, .failure(error))
  }

  fileprivate func finish(_ exchange: PendingExchange, _ result: Result<UpstreamResponse, UpstreamError>) {
    guard current === exchange else { return }
    current = nil
    exchange.raw = nil
    exchange.owner = nil
    deadline?.cancel()
    lastFailedBeforeConnecting = exchange.failedBeforeConnecting
    exchange.settle(result)
  }
}

extension PendingExchange {
  /// libevent's verdict on the request: the answer, or why there is none.
  fileprivate func verdict(_ raw: OpaquePointer?, maxBody: Int) -> Result<UpstreamResponse, UpstreamError> {
    let duration = MonotonicClock.seconds() - started
    guard let raw, errorCode == nil else {
      switch errorCode {
      case EVREQ_HTTP_TIMEOUT:
        return .failure(UpstreamError(.timeout, "no complete answer within \(request.timeout) s"))
      case EVREQ_HTTP_DATA_TOO_LONG:
        return .failure(UpstreamError(.decoding, "response body larger than \(maxBody) bytes"))
      case EVREQ_HTTP_INVALID_HEADER:
        return .failure(
          UpstreamError(
            .transport, "request failed",
            cause: "the answer's head is not valid HTTP or is over \(KeepAliveConnection.maxHeaderBytes) bytes"))
      case EVREQ_HTTP_EOF:
        return .failure(
          UpstreamError(.transport, "request failed", cause: "connection closed before a complete answer"))
      default:
        return .failure(UpstreamError(.transport, "request failed", cause: "connection error"))
      }
    }
    let status = Int(evhttp_request_get_response_code(raw))
    // A request called back without an answer: the connection could not be made (refused, unreachable).
    guard status > 0 else {
      failedBeforeConnecting = true
      return .failure(UpstreamError(.transport, "request failed", cause: "cannot connect to the upstream"))
    }
    var body: [UInt8] = []
    if let buffer = evhttp_request_get_input_buffer(raw) {
      let length = evbuffer_get_length(buffer)
      if length > maxBody {
        return .failure(UpstreamError(.decoding, "response body larger than \(maxBody) bytes"))
      }
      if length > 0 {
        // An answer in one of the buffer's chains (a poll's usual answer) is copied from it straight; a longer one
        // is gathered. `Array(unsafeUninitializedCapacity:)` went through a generic allocation (a metadata lookup
        // at run time, once a poll); these two are the standard library's specialized paths.
        var chain = iovec()
        if evbuffer_peek(buffer, -1, nil, &chain, 1) == 1, chain.iov_len == length, let base = chain.iov_base {
          body = Array(UnsafeRawBufferPointer(start: base, count: length))
        } else {
          body = Array(repeating: 0, count: length)
          let copied = body.withUnsafeMutableBytes { evbuffer_copyout(buffer, $0.baseAddress, length) }
          if copied < length { body.removeLast(length - max(0, copied)) }
        }
      }
    }
    var fields: [(name: String, value: String)] = []
    if let wanted = request.wantedHeaders, let headers = evhttp_request_get_input_headers(raw) {
      var field = pollcast_evkeyvalq_first(headers)
      while let current = field {
        if let key = current.pointee.key, let value = current.pointee.value {
          let name = String(cString: key)
          if wanted.isEmpty {
            fields.append((name, String(cString: value)))
            if fields.count >= 200 { break }  // a hostile server's thousands of headers are not all kept
          } else if let match = wanted.first(where: { $0.caseInsensitiveEquals(name) }) {
            // The last of several fields of one name, as `UpstreamResponse.header` reads it.
            fields.removeAll { $0.name.caseInsensitiveEquals(match) }
            fields.append((match, String(cString: value)))
          }
        }
        field = pollcast_evkeyval_next(current)
      }
    }
    return .success(UpstreamResponse(status: status, body: body, duration: duration, headers: fields))
  }
}

/// A request on the kept connection (`perform`), and its outcome once settled. `UpstreamClient`'s exchange is one:
/// a request on its way is one object, not one per layer.
///
/// While on the connection it also holds the connection's state for it (one object per request on its way, not one
/// per layer: an account keeps it for as long as its poll hangs).
class PendingExchange: @unchecked Sendable {  // loop-confined
  let request: UpstreamRequest
  /// Set while the exchange runs; nil once it is settled.
  var continuation: UnsafeContinuation<Void, Never>?
  /// Nil until settled (`perform` returns with it set).
  var outcome: Result<UpstreamResponse, UpstreamError>?

  // The kept connection's state for the request (set by `onConnection`).
  fileprivate var target: KeepAliveConnection.Target?
  fileprivate var method = EVHTTP_REQ_GET
  fileprivate var started = 0.0
  /// The connection carrying the request, while it does: libevent's callbacks find it here.
  fileprivate weak var owner: KeepAliveConnection?
  fileprivate var raw: OpaquePointer?
  fileprivate var errorCode: evhttp_request_error?
  fileprivate var checkingConnect = false
  /// Sent on a socket kept from an earlier exchange (not one opened for it).
  fileprivate var onKeptSocket = false
  /// Sent a second time after the kept socket closed under it.
  fileprivate var retried = false
  /// Ended before a connection was made (refused, unreachable, the connect deadline passed): nothing was sent.
  fileprivate var failedBeforeConnecting = false

  init(_ request: UpstreamRequest) { self.request = request }

  /// What is left of the request's total time, counted from when the kept connection took it.
  fileprivate var timeLeft: Double { request.timeout - (MonotonicClock.seconds() - started) }

  fileprivate func onConnection(
    target: KeepAliveConnection.Target, method: evhttp_cmd_type, owner: KeepAliveConnection
  ) {
    self.target = target
    self.method = method
    self.owner = owner
    started = MonotonicClock.seconds()
  }

  /// Ends the exchange with `result` (once: later calls do nothing).
  func settle(_ result: Result<UpstreamResponse, UpstreamError>) {
    guard let continuation else { return }
    self.continuation = nil
    outcome = result
    continuation.resume()
  }
}

/// A C pointer handed to the loop to free there.
private struct UncheckedPointer: @unchecked Sendable {
  let pointer: OpaquePointer
  init(_ pointer: OpaquePointer) { self.pointer = pointer }
}

extension String {
  /// ASCII case-insensitive equality (header names), without making lowercased copies.
  fileprivate func caseInsensitiveEquals(_ other: String) -> Bool {
    func lower(_ byte: UInt8) -> UInt8 { byte >= 0x41 && byte <= 0x5A ? byte | 0x20 : byte }
    return utf8.count == other.utf8.count && zip(utf8, other.utf8).allSatisfy { lower($0) == lower($1) }
  }
}

/// The request's answer (or, with nil, its failure after `keepAliveRequestError`).
private let keepAliveRequestDone: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { raw, context in
  guard let context else { return }
  let exchange = Unmanaged<PendingExchange>.fromOpaque(context).takeUnretainedValue()
  guard let owner = exchange.owner else { return }
  // libevent frees the request after this returns (or has freed it already, for a failure).
  exchange.raw = nil
  // Closed before any answer on a kept socket: once more on a fresh one (libevent has reset the connection).
  if raw == nil, exchange.errorCode == EVREQ_HTTP_EOF, owner.retryOnFreshConnection(exchange) { return }
  if let raw, let refusal = owner.checkFraming(raw) {
    owner.finish(exchange, .failure(UpstreamError(.transport, "request failed", cause: refusal.description)))
    return
  }
  owner.finish(exchange, exchange.verdict(raw, maxBody: owner.maxBodyBytes))
}

private let keepAliveRequestError: @convention(c) (evhttp_request_error, UnsafeMutableRawPointer?) -> Void = {
  error, context in
  guard let context else { return }
  Unmanaged<PendingExchange>.fromOpaque(context).takeUnretainedValue().errorCode = error
}
