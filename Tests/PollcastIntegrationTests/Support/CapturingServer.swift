import Foundation
import PollcastCore

/// A loopback HTTP/1.1 server that records every byte it receives, split into the requests it parsed, and answers
/// each with a canned response. It exists to prove what never reaches a legacy API: a header split by CR/LF, or a
/// second request smuggled behind the first, shows here as an extra header or an extra request.
final class CapturingServer: @unchecked Sendable {  // state behind `lock`; the accept thread owns the socket
  struct Request: Sendable {
    var line: String
    var headers: [(name: String, value: String)]
    var body: [UInt8]
  }

  private let lock = NSLock()
  private var requests: [Request] = []
  private var raw: [UInt8] = []
  private var stopped = false
  private let socket: ListeningSocket
  let status: Int
  let body: String
  /// Answers a request (its number from 0, the request) with a status and body instead of the canned ones.
  let respond: (@Sendable (Int, Request) -> (Int, String))?
  /// Answers a request with these exact bytes instead (a chunked body, a broken head, …), closing the connection
  /// after them when `close` is set.
  let rawRespond: (@Sendable (Int, Request) -> (bytes: String, close: Bool))?
  /// Bytes sent on the connection 200 ms after request N was answered, unasked (a forged answer waiting for the
  /// client's next request), or nil.
  let unsolicited: (@Sendable (Int) -> String?)?
  private var accepted = 0

  var port: Int { socket.port }
  var url: String { "http://127.0.0.1:\(socket.port)" }

  init(
    status: Int = 401, body: String = "{\"error\":\"no\"}",
    respond: (@Sendable (Int, Request) -> (Int, String))? = nil,
    rawRespond: (@Sendable (Int, Request) -> (bytes: String, close: Bool))? = nil,
    unsolicited: (@Sendable (Int) -> String?)? = nil
  ) throws {
    socket = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 16)
    self.status = status
    self.body = body
    self.respond = respond
    self.rawRespond = rawRespond
    self.unsolicited = unsolicited
    let flags = fcntl(socket.fd, F_GETFL)
    _ = fcntl(socket.fd, F_SETFL, flags & ~O_NONBLOCK)
    let thread = Thread { [self] in acceptLoop() }
    thread.start()
  }

  /// Every request parsed so far.
  var received: [Request] { lock.withLock { requests } }
  /// Connections accepted so far.
  var connections: Int { lock.withLock { accepted } }
  /// Every byte received so far, on every connection.
  var receivedBytes: [UInt8] { lock.withLock { raw } }

  func stop() {
    lock.withLock { stopped = true }
    shutdown(socket.fd, Int32(SHUT_RDWR))
    close(socket.fd)
  }

  private var isStopped: Bool { lock.withLock { stopped } }

  private func acceptLoop() {
    while !isStopped {
      let client = accept(socket.fd, nil, nil)
      guard client >= 0 else {
        if isStopped { return }
        continue
      }
      lock.withLock { accepted += 1 }
      let thread = Thread { [self] in serve(client) }
      thread.start()
    }
  }

  private func serve(_ fd: Int32) {
    defer { close(fd) }
    var timeout = timeval(tv_sec: 5, tv_usec: 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var buffer: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 16 << 10)
    serving: while !isStopped {
      // Answer every complete request in the buffer, then read more.
      while let (request, used) = CapturingServer.parse(buffer) {
        buffer.removeFirst(used)
        let number = lock.withLock {
          requests.append(request)
          return requests.count - 1
        }
        if let (bytes, close) = rawRespond?(number, request) {
          _ = bytes.utf8CString.withUnsafeBufferPointer { send(fd, $0.baseAddress, $0.count - 1, Int32(MSG_NOSIGNAL)) }
          if close { break serving }
          if let later = unsolicited?(number) {
            usleep(200_000)
            _ = later.utf8CString.withUnsafeBufferPointer {
              send(fd, $0.baseAddress, $0.count - 1, Int32(MSG_NOSIGNAL))
            }
          }
          continue
        }
        let (status, body) = respond?(number, request) ?? (self.status, self.body)
        let answer =
          "HTTP/1.1 \(status) Canned\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n"
          + body
        _ = answer.utf8CString.withUnsafeBufferPointer { send(fd, $0.baseAddress, $0.count - 1, Int32(MSG_NOSIGNAL)) }
      }
      let count = recv(fd, &chunk, chunk.count, 0)
      guard count > 0 else { break }
      buffer += chunk[0..<count]
      lock.withLock { raw += chunk[0..<count] }
    }
    if !buffer.isEmpty {
      // Bytes that never formed a request are recorded too (as a request with only a line), so they show.
      lock.withLock { requests.append(Request(line: String(decoding: buffer, as: UTF8.self), headers: [], body: [])) }
    }
  }

  /// One request from the front of `bytes` (head, then a Content-Length body), or nil when incomplete.
  static func parse(_ bytes: [UInt8]) -> (Request, Int)? {
    let end = Array("\r\n\r\n".utf8)
    guard bytes.count >= 4, let headEnd = (0...(bytes.count - 4)).first(where: { Array(bytes[$0..<$0 + 4]) == end })
    else { return nil }
    let head = String(decoding: bytes[0..<headEnd], as: UTF8.self)
    var lines = head.components(separatedBy: "\r\n")
    let line = lines.removeFirst()
    let headers = lines.map { text -> (name: String, value: String) in
      guard let colon = text.firstIndex(of: ":") else { return (text, "") }
      return (String(text[..<colon]), String(text[text.index(after: colon)...]).trimmingCharacters(in: .whitespaces))
    }
    let length = headers.first { $0.name.lowercased() == "content-length" }.flatMap { Int($0.value) } ?? 0
    let total = headEnd + 4 + length
    guard bytes.count >= total else { return nil }
    return (Request(line: line, headers: headers, body: Array(bytes[(headEnd + 4)..<total])), total)
  }
}
