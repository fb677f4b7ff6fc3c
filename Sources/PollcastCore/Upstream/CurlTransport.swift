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
  private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

  /// Transfers currently in progress.
  public var inFlight: Int { transfers.count }

  public init(loop: EventLoop) throws(UpstreamError) {
    _ = CurlTransport.globalInit
    guard let multi = curl_multi_init() else { throw UpstreamError(.transport, "curl_multi_init failed") }
    self.loop = loop
    self.multi = multi
    let context = Unmanaged.passUnretained(self).toOpaque()  // cleared in deinit via curl_multi_cleanup
    pollcast_multi_setopt_socket(multi, curlSocketCallback, context)
    pollcast_multi_setopt_timer(multi, curlTimerCallback, context)
    timer = LoopTimer(loop: loop) { [weak self] in self?.socketAction(pollcast_CURL_SOCKET_TIMEOUT, 0) }
  }

  deinit {
    for id in Array(transfers.keys) { cancel(id) }
    curl_multi_cleanup(multi)
    for (_, event) in sockets { event_free(event) }
  }

  /// Starts `request`; `completion` runs on the loop unless the transfer is cancelled first.
  @discardableResult
  public func start(
    _ request: UpstreamRequest, completion: @escaping (Result<UpstreamResponse, UpstreamError>) -> Void
  ) -> Int {
    let id = nextTransferID
    nextTransferID += 1
    guard let easy = curl_easy_init() else {
      completion(.failure(UpstreamError(.transport, "curl_easy_init failed")))
      return id
    }
    let transfer = Transfer(id: id, easy: easy, completion: completion, maxBody: maxBodyBytes)
    transfer.configure(request)
    transfers[id] = transfer
    let code = curl_multi_add_handle(multi, easy)
    if code != CURLM_OK {
      transfers[id] = nil
      transfer.cleanup()
      completion(
        .failure(
          UpstreamError(.transport, "curl_multi_add_handle failed", cause: String(cString: curl_multi_strerror(code)))))
    }
    return id
  }

  /// Cancels a transfer: its completion is never called.
  public func cancel(_ id: Int) {
    guard let transfer = transfers.removeValue(forKey: id) else { return }
    curl_multi_remove_handle(multi, transfer.easy)
    transfer.cleanup()
  }

  /// Cancels every transfer.
  public func cancelAll() {
    for id in Array(transfers.keys) { cancel(id) }
  }

  /// Runs `request` and returns the response. Cancelling the calling task cancels the transfer.
  /// Must be called from an actor that runs on this transport's loop.
  public func perform(_ request: UpstreamRequest, isolation: isolated (any Actor)? = #isolation)
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
          pending.id = start(request) { result in
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
    guard let event = event_new(loop.base, fd, flags, curlSocketEvent, context) else { return }
    event_add(event, nil)
    sockets[fd] = event
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
    curl_multi_socket_action(multi, fd, events, &running)
    collectCompleted()
  }

  private func collectCompleted() {
    var remaining: Int32 = 0
    while let message = curl_multi_info_read(multi, &remaining) {
      guard message.pointee.msg == CURLMSG_DONE, let easy = message.pointee.easy_handle else { continue }
      let result = pollcast_msg_result(message)
      var privatePointer: UnsafeMutableRawPointer?
      pollcast_easy_getinfo_pointer(easy, CURLINFO_PRIVATE, &privatePointer)
      let id = Int(bitPattern: privatePointer)
      guard let transfer = transfers.removeValue(forKey: id) else {
        curl_multi_remove_handle(multi, easy)
        continue
      }
      curl_multi_remove_handle(multi, easy)
      let outcome = transfer.outcome(result)
      transfer.cleanup()
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
  var body: [UInt8] = []
  var bodyTooLarge = false
  var headerList: UnsafeMutablePointer<curl_slist>?
  var requestBody: [CChar] = []
  let started = MonotonicClock.seconds()
  var timeout: Double = 0

  init(
    id: Int, easy: UnsafeMutableRawPointer, completion: @escaping (Result<UpstreamResponse, UpstreamError>) -> Void,
    maxBody: Int
  ) {
    self.id = id
    self.easy = easy
    self.completion = completion
    self.maxBody = maxBody
  }

  func configure(_ request: UpstreamRequest) {
    timeout = request.timeout
    pollcast_easy_setopt_string(easy, CURLOPT_URL, request.url)
    pollcast_easy_setopt_long(easy, CURLOPT_NOSIGNAL, 1)
    pollcast_easy_setopt_long(easy, CURLOPT_TIMEOUT_MS, max(1, Int(request.timeout * 1000)))
    pollcast_easy_setopt_long(easy, CURLOPT_CONNECTTIMEOUT_MS, max(1, Int(request.connectTimeout * 1000)))
    pollcast_easy_setopt_long(easy, CURLOPT_TCP_KEEPALIVE, 1)
    pollcast_easy_setopt_long(easy, CURLOPT_SSL_VERIFYPEER, 1)
    pollcast_easy_setopt_long(easy, CURLOPT_SSL_VERIFYHOST, 2)
    pollcast_easy_setopt_string(easy, CURLOPT_ACCEPT_ENCODING, "")  // every encoding libcurl supports
    pollcast_easy_setopt_string(easy, CURLOPT_USERAGENT, "pollcast/\(PollcastVersion.current)")
    pollcast_easy_setopt_long(easy, CURLOPT_PROTOCOLS, Int(CURLPROTO_HTTP | CURLPROTO_HTTPS))
    pollcast_easy_setopt_pointer(easy, CURLOPT_PRIVATE, UnsafeMutableRawPointer(bitPattern: id))
    // Unretained: the transport keeps this Transfer alive until the handle is removed and cleaned up.
    pollcast_easy_setopt_pointer(easy, CURLOPT_WRITEDATA, Unmanaged.passUnretained(self).toOpaque())
    pollcast_easy_setopt_write(easy, transferWrite)
    for (name, value) in request.headers {
      headerList = curl_slist_append(headerList, "\(name): \(value)")
    }
    if let body = request.body {
      requestBody = body.map { CChar(bitPattern: $0) }
      pollcast_easy_setopt_long(easy, CURLOPT_POSTFIELDSIZE, body.count)
      requestBody.withUnsafeMutableBufferPointer { buffer in
        _ = pollcast_easy_setopt_pointer(easy, CURLOPT_COPYPOSTFIELDS, buffer.baseAddress)
      }
    }
    if request.method != "GET" && !(request.method == "POST" && request.body != nil) {
      pollcast_easy_setopt_string(easy, CURLOPT_CUSTOMREQUEST, request.method)
    }
    if headerList != nil { pollcast_easy_setopt_slist(easy, CURLOPT_HTTPHEADER, headerList) }
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
    pollcast_easy_getinfo_long(easy, CURLINFO_RESPONSE_CODE, &status)
    return .success(UpstreamResponse(status: status, body: body, duration: duration))
  }

  func cleanup() {
    curl_easy_cleanup(easy)
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
