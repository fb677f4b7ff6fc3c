import CLibevent
import Foundation
import PollcastCore

/// One benchmark SSE client: a libevent bufferevent on the bench's loop, bound to one of several 127.0.0.x
/// source addresses (so tens of thousands of connections do not run out of ephemeral ports).
final class BenchSubscriber {
  let index: Int
  private var bufferevent: OpaquePointer?
  private var scanner = StreamScanner()
  /// Weak: the recorder owns its subscribers, and a late callback after it is gone must find nothing.
  weak var runner: BenchRecorder?
  private(set) var connected = false
  /// The id this connection resumed from: what to resume from again if it fails before any event arrives
  /// (the scanner starts empty on every connection).
  private var resumedFrom: [UInt8] = []
  private(set) var closed = false

  init(index: Int, runner: BenchRecorder) {
    self.index = index
    self.runner = runner
  }

  deinit { close() }

  /// Connects from `source` to `target` and sends the request; `lastEventID` resumes.
  func connect(
    loop: EventLoop, source: String, target: sockaddr_in, host: String, path: String, lastEventID: [UInt8]?,
    token: String? = nil
  ) -> Bool {
    scanner = StreamScanner()
    resumedFrom = lastEventID ?? []
    connected = false
    closed = false
    let fd = socket(
      AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return false }
    var local = sockaddr_in()
    local.sin_family = sa_family_t(AF_INET)
    inet_pton(AF_INET, source, &local.sin_addr)
    let bound = withUnsafePointer(to: &local) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        Glibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
      }
    }
    guard bound == 0, let bev = bufferevent_socket_new(loop.base, fd, Int32(BEV_OPT_CLOSE_ON_FREE.rawValue)) else {
      Glibc.close(fd)
      return false
    }
    bufferevent = bev
    let context = Unmanaged.passUnretained(self).toOpaque()  // freed in close() before self goes away
    bufferevent_setcb(bev, benchRead, nil, benchEvent, context)
    bufferevent_enable(bev, pollcast_EV_READ | pollcast_EV_WRITE)
    var request = "GET \(path) HTTP/1.1\r\nHost: \(host)\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n"
    if let token { request += "Authorization: Bearer \(token)\r\n" }
    if let lastEventID, !lastEventID.isEmpty {
      request += "Last-Event-ID: \(String(decoding: lastEventID, as: UTF8.self))\r\n"
    }
    request += "\r\n"
    request.withUTF8 { _ = bufferevent_write(bev, $0.baseAddress, $0.count) }
    var address = target
    let result = withUnsafeMutablePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        bufferevent_socket_connect(bev, $0, Int32(MemoryLayout<sockaddr_in>.size))
      }
    }
    return result == 0
  }

  /// The last id seen on this subscriber's stream, across its connections.
  var lastEventID: [UInt8] { scanner.lastEventID.isEmpty ? resumedFrom : scanner.lastEventID }

  func close() {
    if let bufferevent { bufferevent_free(bufferevent) }
    bufferevent = nil
    if !closed {
      closed = true
      if connected { runner?.subscriberClosed(self) }
    }
  }

  fileprivate func readable() {
    guard let bev = bufferevent else { return }
    let input = bufferevent_get_input(bev)
    let length = evbuffer_get_length(input)
    guard length > 0, let bytes = evbuffer_pullup(input, length) else { return }
    let wasHeadDone = scanner.headDone
    let now = EventIDAllocator.nowMicroseconds()
    guard let runner else { return }
    scanner.feed(UnsafeRawBufferPointer(start: bytes, count: length)) { event in
      runner.delivered(event, to: index, at: now)
    }
    evbuffer_drain(input, length)
    if !wasHeadDone && scanner.headDone {
      connected = scanner.status == 200
      runner.subscriberConnected(self, status: scanner.status)
    }
  }

  fileprivate func failed(_ events: Int16) {
    let wasConnected = connected
    close()
    if !wasConnected { runner?.subscriberFailed(self) }
  }
}

/// What a subscriber reports to.
protocol BenchRecorder: AnyObject {
  func delivered(_ event: StreamScanner.Event, to subscriber: Int, at micros: UInt64)
  func subscriberConnected(_ subscriber: BenchSubscriber, status: Int)
  func subscriberClosed(_ subscriber: BenchSubscriber)
  func subscriberFailed(_ subscriber: BenchSubscriber)
}

private let benchRead: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = { _, context in
  guard let context else { return }
  Unmanaged<BenchSubscriber>.fromOpaque(context).takeUnretainedValue().readable()
}

private let benchEvent: @convention(c) (OpaquePointer?, Int16, UnsafeMutableRawPointer?) -> Void = {
  _, events, context in
  guard let context else { return }
  // BEV_EVENT_CONNECTED needs no action: the request is already queued.
  if events & Int16(BEV_EVENT_CONNECTED) != 0 { return }
  Unmanaged<BenchSubscriber>.fromOpaque(context).takeUnretainedValue().failed(events)
}
