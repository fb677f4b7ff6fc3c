import Foundation
import PollcastCore

/// A real streaming HTTP/1.1 client over a blocking socket with deadlines: sends a request, parses the status
/// line and headers, de-chunks the body and parses it as SSE. Used for assertions that need exact bytes,
/// resets, or thousands of clients at once (see `TestClientGroup`).
final class TestSSEClient {
  let fd: Int32
  private(set) var status = 0
  private(set) var headers: [String: String] = [:]
  /// The response head as it came (status line and header lines), for tests that count repeated headers.
  private(set) var rawHead = ""
  private(set) var events: [SSEParser.Event] = []
  private(set) var parser = SSEParser()
  private(set) var isEOF = false
  private(set) var rawBody: [UInt8] = []
  private var buffer: [UInt8] = []
  private var headDone = false
  private var chunked = false
  private var chunkRemaining = 0
  private var chunkState = ChunkState.size
  private var sizeLine: [UInt8] = []
  private var consumed = 0

  private enum ChunkState { case size, data, dataCRLF, trailer, done }

  struct Failure: Error, CustomStringConvertible {
    var description: String
  }

  /// Connects and sends `GET path` (or another method) with extra headers. With `partial`, the blank line that
  /// ends the head is not sent (a slowloris client).
  convenience init(
    port: Int, path: String = "/events", method: String = "GET", headers extra: [(String, String)] = [],
    host: String = "127.0.0.1", partial: Bool = false
  ) throws {
    try self.init(rawPort: port, host: host)
    var request = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nAccept: text/event-stream\r\n"
    for (name, value) in extra { request += "\(name): \(value)\r\n" }
    if !partial { request += "\r\n" }
    try send(request)
  }

  /// Connects and sends nothing.
  init(rawPort port: Int, host: String = "127.0.0.1") throws {
    fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw Failure(description: "socket: \(String(cString: strerror(errno)))") }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = UInt16(port).bigEndian
    inet_pton(AF_INET, host, &address.sin_addr)
    let connected = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard connected == 0 else {
      let message = String(cString: strerror(errno))
      close(fd)
      throw Failure(description: "connect: \(message)")
    }
  }

  deinit { if fd >= 0 { close(fd) } }

  func send(_ text: String) throws { try sendBytes(Array(text.utf8)) }

  func sendBytes(_ bytes: [UInt8]) throws {
    var offset = 0
    while offset < bytes.count {
      let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
      guard sent > 0 else { throw Failure(description: "send: \(String(cString: strerror(errno)))") }
      offset += sent
    }
  }

  /// Closes with a TCP reset (SO_LINGER 0), like a client that crashed or a network drop.
  func reset() {
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    shutdown(fd, Int32(SHUT_RDWR))
  }

  /// Reads what is available within `timeout` seconds (one poll + read). Returns false on EOF.
  @discardableResult
  func pump(timeout: Double) throws -> Bool {
    guard !isEOF else { return false }
    var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    let ready = poll(&descriptor, 1, Int32(max(0, timeout * 1000)))
    if ready <= 0 { return true }
    return try readAvailable()
  }

  /// Reads once (the socket must be readable). Returns false on EOF.
  func readAvailable() throws -> Bool {
    var chunk = [UInt8](repeating: 0, count: 65536)
    let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
    if count == 0 || (count < 0 && (errno == ECONNRESET || errno == EPIPE)) {
      isEOF = true
      return false
    }
    if count < 0 {
      if errno == EAGAIN || errno == EINTR { return true }
      throw Failure(description: "recv: \(String(cString: strerror(errno)))")
    }
    ingest(chunk[..<count])
    return true
  }

  private func ingest(_ bytes: ArraySlice<UInt8>) {
    if headDone {
      body(bytes)
      return
    }
    buffer.append(contentsOf: bytes)
    guard let end = buffer.firstRange(of: [13, 10, 13, 10]) else { return }
    let head = String(decoding: buffer[..<end.lowerBound], as: UTF8.self)
    rawHead = head
    let rest = buffer[end.upperBound...]
    buffer = []
    var lines = head.components(separatedBy: "\r\n")
    let statusLine = lines.removeFirst().split(separator: " ")
    status = statusLine.count > 1 ? Int(statusLine[1]) ?? 0 : 0
    for line in lines {
      guard let colon = line.firstIndex(of: ":") else { continue }
      headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
    }
    chunked = headers["transfer-encoding"]?.lowercased() == "chunked"
    headDone = true
    body(rest)
  }

  private func body(_ bytes: ArraySlice<UInt8>) {
    guard chunked else {
      deliver(bytes)
      return
    }
    var index = bytes.startIndex
    while index < bytes.endIndex {
      switch chunkState {
      case .size:
        let byte = bytes[index]
        index += 1
        if byte == 10 {
          let text = String(decoding: sizeLine, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
          sizeLine = []
          chunkRemaining = Int(text.split(separator: ";").first.map(String.init) ?? "", radix: 16) ?? 0
          chunkState = chunkRemaining == 0 ? .trailer : .data
        } else {
          sizeLine.append(byte)
        }
      case .data:
        let take = min(chunkRemaining, bytes.endIndex - index)
        deliver(bytes[index..<(index + take)])
        index += take
        chunkRemaining -= take
        if chunkRemaining == 0 { chunkState = .dataCRLF }
      case .dataCRLF:
        if bytes[index] == 10 { chunkState = .size }
        index += 1
      case .trailer, .done:
        chunkState = .done
        index = bytes.endIndex
      }
    }
  }

  private func deliver(_ bytes: ArraySlice<UInt8>) {
    rawBody.append(contentsOf: bytes)
    events.append(contentsOf: parser.feed(bytes))
  }

  /// Whether the chunked body ended with its last chunk (a clean end of stream).
  var endedCleanly: Bool { chunkState == .done || chunkState == .trailer }

  var bodyText: String { String(decoding: rawBody, as: UTF8.self) }

  /// Reads until the response head arrived.
  func waitForHead(timeout: Double = 5) throws {
    let deadline = MonotonicClock.seconds() + timeout
    while !headDone {
      guard MonotonicClock.seconds() < deadline else { throw Failure(description: "no response head in time") }
      guard try pump(timeout: 0.05) else { throw Failure(description: "closed before the response head") }
    }
  }

  /// Reads until `count` events arrived (or throws at the deadline / EOF).
  @discardableResult
  func waitForEvents(_ count: Int, timeout: Double = 10) throws -> [SSEParser.Event] {
    let deadline = MonotonicClock.seconds() + timeout
    while events.count < count {
      guard MonotonicClock.seconds() < deadline else {
        throw Failure(description: "got \(events.count) of \(count) events in time")
      }
      guard try pump(timeout: 0.05) else {
        throw Failure(description: "stream ended after \(events.count) of \(count) events")
      }
    }
    return events
  }

  /// Reads until the server closes the connection.
  func waitForEOF(timeout: Double = 10) throws {
    let deadline = MonotonicClock.seconds() + timeout
    while try pump(timeout: 0.05) {
      guard MonotonicClock.seconds() < deadline else { throw Failure(description: "server did not close in time") }
    }
  }

  /// Reads until `predicate` holds.
  func waitUntil(timeout: Double = 10, _ what: String, _ predicate: (TestSSEClient) -> Bool) throws {
    let deadline = MonotonicClock.seconds() + timeout
    while !predicate(self) {
      guard MonotonicClock.seconds() < deadline else { throw Failure(description: "timed out waiting for \(what)") }
      guard try pump(timeout: 0.05) else { throw Failure(description: "stream ended while waiting for \(what)") }
    }
  }

  /// Message events (not `upstream` status) with their ids.
  var messageIDs: [UInt64] {
    events.filter { $0.type == "message" }.compactMap { UInt64($0.lastEventID) }
  }
}

/// Many clients read with one poll(2) loop.
struct TestClientGroup {
  var clients: [TestSSEClient]

  /// Pumps every client until `predicate` holds for all of them.
  func waitUntilAll(timeout: Double, _ what: String, _ predicate: (TestSSEClient) -> Bool) throws {
    let deadline = MonotonicClock.seconds() + timeout
    var pending = clients.filter { !predicate($0) }
    while !pending.isEmpty {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(
          description: "\(pending.count) of \(clients.count) clients still waiting for \(what)")
      }
      var descriptors = pending.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
      let ready = poll(&descriptors, nfds_t(descriptors.count), 50)
      if ready > 0 {
        for (index, descriptor) in descriptors.enumerated() where descriptor.revents != 0 {
          guard try pending[index].readAvailable() else {
            throw TestSSEClient.Failure(description: "a client's stream ended while waiting for \(what)")
          }
        }
      }
      pending = pending.filter { !predicate($0) }
    }
  }
}
