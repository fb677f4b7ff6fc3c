import CLibevent
import Foundation

/// An evhttp server bound to one address, with explicit limits, that hands every request to `handler` on the
/// loop thread. The SSE server and the legacy fixture are both built on it. Loop-confined.
public final class HTTPListener: @unchecked Sendable {
  public struct Limits: Sendable {
    public var maxHeaderBytes: Int
    public var maxBodyBytes: Int
    /// evhttp's read/write timeout for connections, in seconds.
    public var timeout: Double
    public var backlog: Int
    /// A connection must complete its first request within this many seconds.
    public var headerTimeout: Double
    /// Whether a keep-alive connection must also complete each later request within `headerTimeout` of its
    /// previous answer. The guard then owns evhttp's close callback between requests (evhttp keeps one per
    /// connection): a handler that sets its own close callback on a connection which goes on to carry further
    /// requests (the fixture's hang-up watch) must turn this off. Streams and connections that close after
    /// their answer are unaffected.
    public var keepAliveDeadline: Bool

    public init(
      maxHeaderBytes: Int = 16 << 10, maxBodyBytes: Int = 1 << 20, timeout: Double = 60, backlog: Int = 4096,
      headerTimeout: Double = 10, keepAliveDeadline: Bool = true
    ) {
      self.keepAliveDeadline = keepAliveDeadline
      self.maxHeaderBytes = maxHeaderBytes
      self.maxBodyBytes = maxBodyBytes
      self.timeout = timeout
      self.backlog = backlog
      self.headerTimeout = headerTimeout
    }
  }

  public let loop: EventLoop
  private var http: OpaquePointer?
  private var boundSocket: OpaquePointer?
  private let handler: (HTTPRequest) -> Void
  private let logger: Logger
  private var acceptGuard: AcceptGuard?
  /// `host:port` once started.
  public private(set) var address = ""
  public private(set) var port = 0

  public init(
    loop: EventLoop, logger: Logger = Logger(label: "pollcast.http", level: .warning),
    handler: @escaping (HTTPRequest) -> Void
  ) {
    self.loop = loop
    self.logger = logger
    self.handler = handler
  }

  deinit {
    // evhttp first: freeing it frees the connections, whose bufferevents the guard still holds a reference to.
    if let http { evhttp_free(http) }
    acceptGuard?.release()
  }

  /// Accept pauses, shed clients and header timeouts so far.
  public var acceptCounters: AcceptGuard.Counters { acceptGuard?.counters ?? .init() }

  /// Binds and starts accepting.
  public func start(host: String, port: Int, limits: Limits) throws(ServerError) {
    try start(socket: ListeningSocket.bind(host: host, port: port, backlog: limits.backlog), limits: limits)
  }

  /// Starts accepting on a socket bound beforehand (it is closed with the listener).
  public func start(socket: ListeningSocket, limits: Limits) throws(ServerError) {
    guard let http = evhttp_new(loop.base) else {
      Glibc.close(socket.fd)
      throw ServerError.libevent("evhttp_new")
    }
    evhttp_set_max_headers_size(http, limits.maxHeaderBytes)
    evhttp_set_max_body_size(http, limits.maxBodyBytes)
    // Every accepted connection's: a common timeout (`EventLoop.commonTimeout`).
    var timeout = loop.commonTimeout(seconds: limits.timeout)
    evhttp_set_timeout_tv(http, &timeout)
    // Every method reaches the handler, which answers 405 with Allow itself (evhttp would answer its 501 page).
    // libevent 2.1 marks a method it does not know (FOO, PROPFIND) as EVHTTP_REQ_UNKNOWN_ (1 << 15, private to
    // http-internal.h); allowing that bit too brings those to the handler as well.
    let unknownMethod: UInt32 = 1 << 15
    let everyMethod =
      EVHTTP_REQ_GET.rawValue | EVHTTP_REQ_POST.rawValue | EVHTTP_REQ_HEAD.rawValue | EVHTTP_REQ_PUT.rawValue
      | EVHTTP_REQ_DELETE.rawValue | EVHTTP_REQ_OPTIONS.rawValue | EVHTTP_REQ_TRACE.rawValue
      | EVHTTP_REQ_CONNECT.rawValue | EVHTTP_REQ_PATCH.rawValue | unknownMethod
    evhttp_set_allowed_methods(http, UInt16(everyMethod))
    let acceptGuard = AcceptGuard(loop: loop, logger: logger, headerTimeout: limits.headerTimeout)
    keepAliveDeadline = limits.keepAliveDeadline
    // Unretained: the guard lives as long as evhttp (both are freed in close/deinit, evhttp first).
    evhttp_set_bevcb(http, acceptGuardBufferevent, Unmanaged.passUnretained(acceptGuard).toOpaque())
    // Unretained: evhttp (and so this callback) is freed in stopAccepting/deinit, before self goes away.
    evhttp_set_gencb(http, httpListenerRequest, Unmanaged.passUnretained(self).toOpaque())
    guard let bound = evhttp_accept_socket_with_handle(http, socket.fd) else {
      evhttp_free(http)
      Glibc.close(socket.fd)
      throw ServerError.libevent("evhttp_accept_socket_with_handle")
    }
    self.http = http
    self.boundSocket = bound
    if let listener = evhttp_bound_socket_get_listener(bound) { acceptGuard.attach(listener: listener, http: http) }
    self.acceptGuard = acceptGuard
    self.address = socket.address
    self.port = socket.port
  }

  /// Closes the listening socket; connections already accepted go on.
  public func stopAccepting() {
    if let http, let boundSocket {
      acceptGuard?.detachListener()
      evhttp_del_accept_socket(http, boundSocket)
      self.boundSocket = nil
    }
  }

  /// Frees the server and every connection it still has.
  public func close() {
    stopAccepting()
    if let http { evhttp_free(http) }
    http = nil
    acceptGuard?.release()
    acceptGuard = nil
  }

  fileprivate func dispatch(_ request: HTTPRequest) {
    loop.assertOnLoop()
    let connection = request.connection
    if let connection { acceptGuard?.requestArrived(on: connection) }
    streamStarted = false
    handler(request)
    // A complete answer went out and evhttp keeps the connection for another request: that request gets the
    // header deadline too. A stream (or a connection marked to close) is not idle.
    if let connection, keepAliveDeadline, !streamStarted, !ClosingConnections.isMarked(connection) {
      acceptGuard?.awaitNextRequest(on: connection)
    }
  }

  private var keepAliveDeadline = true
  /// Set by `responseStaysOpen()` during the handler.
  private var streamStarted = false

  /// The handler calls this when the request it is handling is not answered completely before the handler
  /// returns (a stream, or an answer parked for later), so its connection is not held to the deadline between
  /// requests.
  public func responseStaysOpen() {
    loop.assertOnLoop()
    streamStarted = true
  }
}

private let httpListenerRequest: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  request, context in
  guard let request, let context else { return }
  Unmanaged<HTTPListener>.fromOpaque(context).takeUnretainedValue().dispatch(HTTPRequest(raw: request))
}
