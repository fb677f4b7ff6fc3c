import CCurl
import CLibevent
import Foundation

/// libcurl's multi-socket API driven by the relay's libevent loop: curl's socket and timer callbacks become
/// libevent events, so a hanging long-poll costs nothing until its socket is readable or its deadline passes.
///
/// Loop-confined: create and use it on the loop thread only (the upstream worker, an actor on the loop, owns
/// it).
public final class CurlTransport: @unchecked Sendable {
  public let loop: EventLoop
  /// Largest response body accepted; larger is a decoding error (the body is never buffered without bound).
  public var maxBodyBytes = 16 << 20
  private let multi: UnsafeMutableRawPointer
  private var transfers: [Int: Transfer] = [:]
  private var nextTransferID = 1
  private var sockets: [Int32: OpaquePointer] = [:]
  private var timer: LoopTimer?
  /// Easy handles whose transfer ended, reset and kept for the next request: a new handle per poll (its
  /// allocation, defaults and cleanup) was the largest libcurl item of a per-user relay's profile.
  private var idleHandles: [UnsafeMutableRawPointer] = []
  /// Where transfers reached the host names of plain-HTTP URLs, for the kept-alive connections of this transport's
  /// clients (`UpstreamClient`); one book shared by a pool's transports (`TransportPool`).
  var addresses = AddressBook()
  /// Requests sent by this transport's clients over a kept-alive connection (`UpstreamClient`), and transfers made
  /// through libcurl: `pollcast_upstream_requests_total`, so an operator sees which client polls the API.
  public internal(set) var requestsKeptAlive = 0
  public private(set) var requestsThroughLibcurl = 0
  /// How many ended handles are kept; past that they are cleaned up. A burst of completions refills it, and each
  /// kept handle holds no connection (those live in the multi's pool) and no request state (`curl_easy_reset`).
  static let idleHandleLimit = 8
  /// libcurl's receive buffer per easy handle (`CURLOPT_BUFFERSIZE`), nil for its default of 16 KiB. Each
  /// handle keeps its buffer while it lives, and a per-user relay keeps a poll (a handle) in flight for every
  /// active account: transports shared by accounts set a smaller one, since their answers are small.
  public var receiveBufferBytes: Int?
  private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

  /// A timeout in seconds as libcurl's whole milliseconds: at least 1 (0 would mean none), at most about 31 years,
  /// NaN as 1. A request's timeout comes from configuration and recipes, and a `Double` past `Int.max` traps when
  /// converted.
  static func milliseconds(_ seconds: Double) -> Int {
    let millis = seconds * 1000
    guard !millis.isNaN else { return 1 }
    return Int(min(max(millis, 1), 1e12))
  }

  /// Transfers currently in progress.
  public var inFlight: Int { transfers.count }

  /// Transfers in progress started for `owner` (one account's client when several share the transport).
  public func inFlight(owner: ObjectIdentifier) -> Int { transfers.values.count { $0.owner == owner } }

  public init(loop: EventLoop) throws(UpstreamError) {
    _ = CurlTransport.globalInit
    guard let multi = curl_multi_init() else { throw UpstreamError(.transport, "curl_multi_init failed") }
    self.loop = loop
    self.multi = multi
    let context = Unmanaged.passUnretained(self).toOpaque()  // cleared in deinit via curl_multi_cleanup
    do {
      try CurlCall.check(pollcast_multi_setopt_socket(multi, curlSocketCallback, context), "CURLMOPT_SOCKETFUNCTION")
      try CurlCall.check(pollcast_multi_setopt_timer(multi, curlTimerCallback, context), "CURLMOPT_TIMERFUNCTION")
    } catch {
      curl_multi_cleanup(multi)
      throw error
    }
    timer = LoopTimer(loop: loop) { [weak self] in self?.socketAction(pollcast_CURL_SOCKET_TIMEOUT, 0) }
  }

  deinit {
    for id in Array(transfers.keys) { cancel(id) }
    for easy in idleHandles { curl_easy_cleanup(easy) }
    curl_multi_cleanup(multi)
    for (_, event) in sockets { event_free(event) }
  }

  /// Starts `request`; `completion` runs on the loop unless the transfer is cancelled first.
  @discardableResult
  public func start(
    _ request: UpstreamRequest, owner: ObjectIdentifier? = nil,
    completion: @escaping (Result<UpstreamResponse, UpstreamError>) -> Void
  ) -> Int {
    loop.assertOnLoop()
    let id = nextTransferID
    nextTransferID += 1
    requestsThroughLibcurl += 1
    guard let easy = idleHandles.popLast() ?? curl_easy_init() else {
      completion(.failure(UpstreamError(.transport, "curl_easy_init failed")))
      return id
    }
    let transfer = Transfer(id: id, easy: easy, completion: completion, maxBody: maxBodyBytes)
    transfer.owner = owner
    transfer.receiveBufferBytes = receiveBufferBytes
    do throws(UpstreamError) {
      try transfer.configure(request)
      transfers[id] = transfer
      try CurlCall.check(curl_multi_add_handle(multi, easy), "curl_multi_add_handle")
    } catch {
      transfers[id] = nil
      recycle(transfer)
      completion(.failure(error))
    }
    return id
  }

  /// Cancels a transfer: its completion is never called.
  public func cancel(_ id: Int) {
    guard let transfer = transfers.removeValue(forKey: id) else { return }
    // Fails only for a handle that is not in this multi: a broken invariant, nothing to recover.
    let removed = curl_multi_remove_handle(multi, transfer.easy)
    assert(removed == CURLM_OK, "curl_multi_remove_handle: \(String(cString: curl_multi_strerror(removed)))")
    recycle(transfer)
  }

  /// Ends `transfer`'s use of its easy handle (removed from the multi, or never added): the handle is reset and
  /// kept for the next request, or cleaned up when enough are kept.
  private func recycle(_ transfer: Transfer) {
    transfer.releaseHeaders()
    if idleHandles.count < Self.idleHandleLimit {
      // Back to the defaults of a new handle: no URL, headers, body, method or private pointer survives.
      curl_easy_reset(transfer.easy)
      idleHandles.append(transfer.easy)
    } else {
      curl_easy_cleanup(transfer.easy)
    }
  }

  /// Ends every transfer with `error` (the loop cannot watch their sockets, or libcurl's multi failed): the
  /// worker backs off and retries instead of waiting for a deadline.
  private func failAll(_ error: UpstreamError) {
    let failed = transfers
    for id in failed.keys { cancel(id) }
    for (_, transfer) in failed { transfer.completion(.failure(error)) }
  }

  /// Cancels every transfer.
  public func cancelAll() {
    for id in Array(transfers.keys) { cancel(id) }
  }

  /// Cancels the transfers started for `owner`, leaving the others sharing the transport alone.
  public func cancelAll(owner: ObjectIdentifier) {
    for (id, transfer) in transfers where transfer.owner == owner { cancel(id) }
  }

  /// Runs `request` and returns the response. Cancelling the calling task cancels the transfer.
  /// Must be called from an actor that runs on this transport's loop.
  public func perform(
    _ request: UpstreamRequest, owner: ObjectIdentifier? = nil, isolation: isolated (any Actor)? = #isolation
  )
    async throws(UpstreamError)
    -> UpstreamResponse
  {
    let pending = PendingTransfer()
    do {
      return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation(isolation: isolation) { continuation in
          if Task.isCancelled {
            continuation.resume(throwing: UpstreamError(.cancelled, "cancelled"))
            return
          }
          pending.continuation = continuation
          pending.id = start(request, owner: owner) { result in
            guard let continuation = pending.continuation else { return }
            pending.continuation = nil
            continuation.resume(with: result)
          }
        }
      } onCancel: { [loop] in
        loop.execute { [self] in
          guard let continuation = pending.continuation else { return }
          pending.continuation = nil
          if let id = pending.id { cancel(id) }
          continuation.resume(throwing: UpstreamError(.cancelled, "cancelled"))
        }
      }
    } catch let error as UpstreamError {
      throw error
    } catch {
      throw UpstreamError(.transport, "\(error)")
    }
  }

  // MARK: curl callbacks

  fileprivate func watchSocket(_ fd: Int32, what: Int32) {
    if let existing = sockets.removeValue(forKey: fd) {
      event_free(existing)
    }
    guard what != pollcast_CURL_POLL_REMOVE else { return }
    var flags = pollcast_EV_PERSIST
    if what == pollcast_CURL_POLL_IN || what == pollcast_CURL_POLL_INOUT { flags |= pollcast_EV_READ }
    if what == pollcast_CURL_POLL_OUT || what == pollcast_CURL_POLL_INOUT { flags |= pollcast_EV_WRITE }
    let context = Unmanaged.passUnretained(self).toOpaque()  // events are freed before self (deinit)
    do {
      let event = try LibeventCall.check(event_new(loop.base, fd, flags, curlSocketEvent, context), "event_new(curl)")
      sockets[fd] = event
      try LibeventCall.check(event_add(event, nil), "event_add(curl)")
    } catch {
      // Not from inside curl's callback: fail the transfers on the next turn.
      let failure = UpstreamError(.transport, "cannot watch an upstream socket", cause: error.description)
      loop.execute { [weak self] in self?.failAll(failure) }
    }
  }

  fileprivate func scheduleTimer(milliseconds: Int) {
    if milliseconds < 0 {
      timer?.cancel()
    } else {
      timer?.schedule(after: Double(milliseconds) / 1000)
    }
  }

  fileprivate func socketAction(_ fd: Int32, _ events: Int32) {
    var running: Int32 = 0
    do {
      try CurlCall.check(curl_multi_socket_action(multi, fd, events, &running), "curl_multi_socket_action")
    } catch {
      failAll(error)
      return
    }
    collectCompleted()
  }

  private func collectCompleted() {
    var remaining: Int32 = 0
    while let message = curl_multi_info_read(multi, &remaining) {
      guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
      let result = pollcast_msg_result(message)
      var privatePointer: UnsafeMutableRawPointer?
      // Cannot fail for a handle of ours (CURLINFO_PRIVATE was set); without it the handle is dropped below.
      let found = pollcast_easy_getinfo_pointer(easy, CURLINFO_PRIVATE, &privatePointer)
      let id = found == CURLE_OK ? Int(bitPattern: privatePointer) : 0
      guard let transfer = transfers.removeValue(forKey: id) else {
        curl_multi_remove_handle(multi, easy)
        continue
      }
      curl_multi_remove_handle(multi, easy)
      let outcome = transfer.outcome(result)
      recycle(transfer)
      transfer.completion(outcome)
    }
  }
}

/// One easy handle and what it collects.
private final class Transfer {
  let id: Int
  let easy: UnsafeMutableRawPointer
  let completion: (Result<UpstreamResponse, UpstreamError>) -> Void
  let maxBody: Int
  var owner: ObjectIdentifier?
  var body: [UInt8] = []
  var bodyTooLarge = false
  var wantedHeaders: [String]?
  var headerList: UnsafeMutablePointer<curl_slist>?
  var requestBody: [CChar] = []
  let started = MonotonicClock.seconds()
  var timeout: Double = 0
  var receiveBufferBytes: Int?

  init(
    id: Int, easy: UnsafeMutableRawPointer, completion: @escaping (Result<UpstreamResponse, UpstreamError>) -> Void,
    maxBody: Int
  ) {
    self.id = id
    self.easy = easy
    self.completion = completion
    self.maxBody = maxBody
  }

  func configure(_ request: UpstreamRequest) throws(UpstreamError) {
    timeout = request.timeout
    wantedHeaders = request.wantedHeaders
    // A URL curl refuses (bad scheme, malformed) fails here with libcurl's reason, not later as a hang.
    try CurlCall.check(pollcast_easy_setopt_string(easy, CURLOPT_URL, request.url), "CURLOPT_URL")
    try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1), "CURLOPT_NOSIGNAL")
    try CurlCall.check(
      pollcast_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, CurlTransport.milliseconds(request.timeout)),
      "CURLOPT_TIMEOUT_MS")
    try CurlCall.check(
      pollcast_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, CurlTransport.milliseconds(request.connectTimeout)),
      "CURLOPT_CONNECTTIMEOUT_MS")
    try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1), "CURLOPT_TCP_KEEPALIVE")
    if request.closesConnection {
      try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_FORBID_REUSE, 1), "CURLOPT_FORBID_REUSE")
    }
    if let receiveBufferBytes {
      try CurlCall.check(
        pollcast_easy_setopt_long(easy, CURLOPT_BUFFERSIZE, max(1024, receiveBufferBytes)), "CURLOPT_BUFFERSIZE")
    }
    try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1), "CURLOPT_SSL_VERIFYPEER")
    try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2), "CURLOPT_SSL_VERIFYHOST")
    // Every encoding libcurl supports.
    try CurlCall.check(pollcast_easy_setopt_string(easy, CURLOPT_ACCEPT_ENCODING, ""), "CURLOPT_ACCEPT_ENCODING")
    try CurlCall.check(
      pollcast_easy_setopt_string(easy, CURLOPT_USERAGENT, "pollcast/\(PollcastVersion.current)"), "CURLOPT_USERAGENT")
    try CurlCall.check(
      pollcast_easy_setopt_long(easy, CURLOPT_PROTOCOLS, Int(CURLPROTO_HTTP | CURLPROTO_HTTPS)), "CURLOPT_PROTOCOLS")
    try CurlCall.check(
      pollcast_easy_setopt_pointer(easy, CURLOPT_PRIVATE, UnsafeMutableRawPointer(bitPattern: id)), "CURLOPT_PRIVATE")
    // Unretained: the transport keeps this Transfer alive until the handle is removed and cleaned up.
    try CurlCall.check(
      pollcast_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, Unmanaged.passUnretained(self).toOpaque()),
      "CURLOPT_WRITEDATA")
    try CurlCall.check(pollcast_easy_setopt_write(easy, transferWrite), "CURLOPT_WRITEFUNCTION")
    for (name, value) in request.headers {
      guard let appended = curl_slist_append(headerList, "\(name): \(value)") else {
        throw UpstreamError(.transport, "curl_slist_append failed")
      }
      headerList = appended
    }
    if let body = request.body {
      requestBody = body.map { CChar(bitPattern: $0) }
      try CurlCall.check(pollcast_easy_setopt_long(easy, CURLOPT_POSTFIELDSIZE, body.count), "CURLOPT_POSTFIELDSIZE")
      let code = requestBody.withUnsafeMutableBufferPointer { buffer in
        pollcast_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, buffer.baseAddress)
      }
      try CurlCall.check(code, "CURLOPT_COPYPOSTFIELDS")
    }
    if request.method != "GET" && !(request.method == "POST" && request.body != nil) {
      try CurlCall.check(
        pollcast_easy_setopt_string(easy, CURLOPT_CUSTOMREQUEST, request.method), "CURLOPT_CUSTOMREQUEST")
    }
    if headerList != nil {
      try CurlCall.check(pollcast_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, headerList), "CURLOPT_HTTPHEADER")
    }
  }

  func append(_ bytes: UnsafeRawBufferPointer) -> Bool {
    if body.count + bytes.count > maxBody {
      bodyTooLarge = true
      return false
    }
    body.append(contentsOf: bytes)
    return true
  }

  func outcome(_ code: CURLcode) -> Result<UpstreamResponse, UpstreamError> {
    let duration = MonotonicClock.seconds() - started
    if bodyTooLarge {
      return .failure(UpstreamError(.decoding, "response body larger than \(maxBody) bytes"))
    }
    guard code == CURLE_OK else {
      let cause = String(cString: curl_easy_strerror(code))
      if code == CURLE_OPERATION_TIMEDOUT {
        return .failure(UpstreamError(.timeout, "no complete answer within \(timeout) s", cause: cause))
      }
      return .failure(UpstreamError(.transport, "request failed", cause: cause))
    }
    var status = 0
    do throws(UpstreamError) {
      try CurlCall.check(pollcast_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status), "CURLINFO_RESPONSE_CODE")
    } catch {
      return .failure(error)
    }
    if hasConflictingLength() {
      return .failure(
        UpstreamError(
          .transport, "request failed",
          cause: "the answer has conflicting Content-Length or Transfer-Encoding fields"))
    }
    var peer: UnsafeMutablePointer<CChar>?
    let peerAddress =
      pollcast_easy_getinfo_string(easy, CURLINFO_PRIMARY_IP, &peer) == CURLE_OK
      ? peer.map { String(cString: $0) } : nil
    return .success(
      UpstreamResponse(
        status: status, body: body, duration: duration, headers: wantedHeaders.map(receivedHeaders) ?? [],
        peerAddress: peerAddress?.isEmpty == false ? peerAddress : nil))
  }

  /// Two `Content-Length` fields that differ, or one beside `Transfer-Encoding`, in the final answer: libcurl takes
  /// the last length, a server or proxy may have meant the first, so the answer is refused as the kept connection
  /// refuses it.
  private func hasConflictingLength() -> Bool {
    var first: UnsafeMutablePointer<curl_header>?
    guard curl_easy_header(easy, "Content-Length", 0, UInt32(CURLH_HEADER), -1, &first) == CURLHE_OK, let first else {
      return false
    }
    var chunked: UnsafeMutablePointer<curl_header>?
    if curl_easy_header(easy, "Transfer-Encoding", 0, UInt32(CURLH_HEADER), -1, &chunked) == CURLHE_OK {
      return true
    }
    let value = first.pointee.value.map { String(cString: $0) }
    for index in 1..<max(1, first.pointee.amount) {
      var other: UnsafeMutablePointer<curl_header>?
      guard curl_easy_header(easy, "Content-Length", index, UInt32(CURLH_HEADER), -1, &other) == CURLHE_OK else {
        continue
      }
      if other?.pointee.value.map({ String(cString: $0) }) != value { return true }
    }
    return false
  }

  /// The final answer's header fields (only `names`, or all when it is empty), read with libcurl's header API (no
  /// callback of ours parses them).
  private func receivedHeaders(_ names: [String]) -> [(name: String, value: String)] {
    var fields: [(name: String, value: String)] = []
    if !names.isEmpty {
      for name in names {
        var first: UnsafeMutablePointer<curl_header>?
        guard curl_easy_header(easy, name, 0, UInt32(CURLH_HEADER), -1, &first) == CURLHE_OK, let first,
          var value = first.pointee.value
        else { continue }
        // The last of several fields of one name, as `UpstreamResponse.header` reads it.
        let count = first.pointee.amount
        var final: UnsafeMutablePointer<curl_header>?
        if count > 1, curl_easy_header(easy, name, count - 1, UInt32(CURLH_HEADER), -1, &final) == CURLHE_OK,
          let last = final?.pointee.value
        {
          value = last
        }
        fields.append((name, String(cString: value)))
      }
      return fields
    }
    var previous: UnsafeMutablePointer<curl_header>?
    while let field = curl_easy_nextheader(easy, UInt32(CURLH_HEADER), -1, previous) {
      if let name = field.pointee.name, let value = field.pointee.value {
        fields.append((String(cString: name), String(cString: value)))
      }
      previous = field
      if fields.count >= 200 { break }  // a hostile server's thousands of headers are not all kept
    }
    return fields
  }

  /// Frees the request's header list: called once the handle no longer uses it (removed, or never added).
  func releaseHeaders() {
    if let headerList { curl_slist_free_all(headerList) }
    headerList = nil
  }
}

/// Bridges a transfer to an async caller; touched on the loop only.
private final class PendingTransfer: @unchecked Sendable {
  var id: Int?
  var continuation: CheckedContinuation<UpstreamResponse, Error>?
}

private let transferWrite: @convention(c) (UnsafeMutablePointer<CChar>?, Int, Int, UnsafeMutableRawPointer?) -> Int = {
  data, size, count, context in
  guard let context else { return 0 }
  let transfer = Unmanaged<Transfer>.fromOpaque(context).takeUnretainedValue()
  let total = size * count
  guard let data else { return total }
  return transfer.append(UnsafeRawBufferPointer(start: data, count: total)) ? total : 0
}

private let curlSocketCallback:
  @convention(c) (UnsafeMutableRawPointer?, curl_socket_t, Int32, UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) ->
    Int32 = { _, fd, what, context, _ in
      guard let context else { return 0 }
      Unmanaged<CurlTransport>.fromOpaque(context).takeUnretainedValue().watchSocket(fd, what: what)
      return 0
    }

private let curlTimerCallback: @convention(c) (UnsafeMutableRawPointer?, Int, UnsafeMutableRawPointer?) -> Int32 = {
  _, milliseconds, context in
  guard let context else { return 0 }
  Unmanaged<CurlTransport>.fromOpaque(context).takeUnretainedValue().scheduleTimer(milliseconds: milliseconds)
  return 0
}

private let curlSocketEvent: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  fd, events, context in
  guard let context else { return }
  var flags: Int32 = 0
  if events & pollcast_EV_READ != 0 { flags |= pollcast_CURL_CSELECT_IN }
  if events & pollcast_EV_WRITE != 0 { flags |= pollcast_CURL_CSELECT_OUT }
  Unmanaged<CurlTransport>.fromOpaque(context).takeUnretainedValue().socketAction(fd, flags)
}
