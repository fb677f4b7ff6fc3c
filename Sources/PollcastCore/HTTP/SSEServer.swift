import CLibevent
import Foundation

/// The downstream HTTP server on evhttp: `/events` (SSE), health, metrics.
///
/// Runs on the event loop; evhttp's callbacks enter it with `assumeIsolated`.
public actor SSEServer {
  public nonisolated let loop: EventLoop
  /// The feeds a grant reads: the shared one, and per-account ones.
  public nonisolated let feeds: FeedHub
  public nonisolated var feed: Feed { feeds.shared }
  /// `auth.mode`: who may read what.
  public nonisolated let authenticator: any Authenticator
  public nonisolated let settings: ServerSettings
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  private var listener: HTTPListener?
  private let scratch = EventBuffer()
  private var openStreams = 0
  private var reserveRefusals = 0
  /// The soft limit on descriptors, read once at start (the relay raises it before).
  private var descriptorLimit = Int.max
  let logger: Logger
  /// Extra routes (`/metrics`, `/readyz`, …) served by other components: path → handler.
  var routes: [String: Route] = [:]
  var admission: Admission
  private let addresses: ClientAddressResolver
  private var retryRandom = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  var logLimiter = LogLimiter()
  /// Refused credentials by reason (`missing`, `expired`, …).
  private var authFailures: [String: Int] = [:]

  /// A handler for a plain (non-streaming) endpoint: returns status, content type and body.
  public struct Route: Sendable {
    public typealias Answer = (status: Int32, contentType: String, body: String)
    public var methods: Set<String>
    public var answer: Answering
    /// How a route answers.
    public enum Answering: Sendable {
      /// At once, on the loop.
      case now(@Sendable () -> Answer)
      /// Later: the request is parked (a client that leaves frees it) while this runs on the loop, so a long answer
      /// can be built in turns that let the loop serve everyone else between them (`/metrics` over thousands of
      /// per-user accounts).
      case later(@Sendable () async -> Answer)
    }
    public init(methods: Set<String> = ["GET", "HEAD"], handler: @escaping @Sendable () -> Answer) {
      self.methods = methods
      self.answer = .now(handler)
    }
    public init(methods: Set<String> = ["GET", "HEAD"], asyncHandler: @escaping @Sendable () async -> Answer) {
      self.methods = methods
      self.answer = .later(asyncHandler)
    }
  }

  public init(
    loop: EventLoop, feeds: FeedHub, authenticator: any Authenticator, settings: ServerSettings, logger: Logger
  ) {
    // The server enters the feeds with assumeIsolated: they must run on the same loop.
    precondition(feeds.shared.loop === loop, "the SSE server and its feeds must share one event loop")
    self.loop = loop
    self.feeds = feeds
    self.authenticator = authenticator
    self.settings = settings
    self.logger = logger
    admission = Admission(limits: settings.access.admission)
    addresses = ClientAddressResolver(trusted: settings.access.trustedProxies)
  }

  public func addRoute(_ path: String, _ route: Route) {
    routes[path] = route
  }

  /// Binds and starts accepting. Returns the bound address (`host:port`, with the real port when 0 was asked).
  public func start() throws(ServerError) -> String {
    let listener = HTTPListener(loop: loop, logger: logger) { [weak self] request in
      self?.assumeIsolated { $0.handle(request) }
    }
    try listener.start(
      host: settings.host, port: settings.port,
      limits: .init(
        maxHeaderBytes: settings.maxHeaderBytes, maxBodyBytes: settings.maxBodyBytes, timeout: settings.timeout,
        backlog: settings.backlog, headerTimeout: settings.headerTimeout))
    self.listener = listener
    authenticator.onLateRefusal { [weak self] address in
      self?.assumeIsolated { server in
        server.authFailures["invalid_credential", default: 0] += 1
        server.admission.recordFailure(address, now: MonotonicClock.seconds())
      }
    }
    let limit = descriptorSoftLimit()
    if limit > 0 { descriptorLimit = limit }
    if admission.limits.maxConnections == 0 {
      // Automatic: streams stop being admitted well before descriptors run out (health checks, the upstream,
      // and connections still in their first request keep the rest).
      let usable = (limit > 0 ? limit : 1024) - settings.descriptorReserve
      admission.limits.maxConnections = max(1, Int(Double(usable) * 0.9))
    }
    return listener.address
  }

  /// Streams currently open.
  public var openStreamCount: Int { openStreams }

  public var protectionCounters: ProtectionCounters {
    ProtectionCounters(
      accept: listener?.acceptCounters ?? .init(), reserveRefusals: reserveRefusals,
      admissionRefusals: admission.refusals, authFailures: authFailures,
      tokenVerifications: authenticator.verificationCounters?.checks ?? 0,
      tokenCacheHits: authenticator.verificationCounters?.cacheHits ?? 0,
      maxConnections: admission.limits.maxConnections, authMode: authenticator.mode)
  }

  /// Stops accepting, ends every stream with a last comment, waits for them to flush (up to `deadline`
  /// seconds), then frees the server.
  public func shutdown(deadline: Double = 5, spread: Double = 0) async {
    guard let listener else { return }
    listener.stopAccepting()
    let ended = await feeds.finishAll(comment: "pollcast shutting down", spread: spread)
    logger.info("ending streams", metadata: ["streams": "\(ended)"])
    let until = MonotonicClock.seconds() + max(0, deadline - spread)
    while openStreams > 0 && MonotonicClock.seconds() < until {
      try? await Task.sleep(for: .milliseconds(20))
    }
    if openStreams > 0 {
      logger.warning("streams still open at the shutdown deadline", metadata: ["streams": "\(openStreams)"])
    }
    listener.close()
    self.listener = nil
  }

  // MARK: Streams: parse → throttle → authenticate → feed for the grant → admit → open

  func handleEvents(_ request: HTTPRequest, cors: [(String, String)]) {
    let query = request.queryItems
    var streams: Set<String>?
    var queryLastID: String?
    for (name, value) in query {
      switch name {
      case "stream":
        guard !value.isEmpty else {
          request.respondError(
            status: 400, reason: "Bad Request", message: "stream= must name a stream", headers: cors)
          return
        }
        streams = (streams ?? []).union([value])
      case "lastEventId", "last_event_id", "last-event-id":
        if queryLastID == nil { queryLastID = value }
      default:
        break
      }
    }
    // Who is asking, and what may it read, before anything about the feed is said.
    let address = addresses.resolve(
      peer: request.peerAddress ?? "unknown", forwardedFor: request.header("X-Forwarded-For"))
    let monotonic = MonotonicClock.seconds()
    let ask = StreamAsk(
      streams: streams, requestedID: request.header("Last-Event-ID") ?? queryLastID, address: address, cors: cors)
    if let refusal = admission.throttled(address, now: monotonic) {
      refuse(
        request, ask,
        StreamRefusal.admitted(
          refusal, subjectNoun: authenticator.subjectNoun,
          retryBase: admission.throttleRemaining(address, now: monotonic) / 2))
      return
    }
    let credential = CredentialAsk(
      authorization: request.header("Authorization"), cookie: request.header("Cookie"), query: query,
      address: address)
    switch authenticator.authenticate(credential) {
    case .decided(let outcome):
      open(request, ask, outcome)
    case .wait(let check):
      // The request waits, watched, while the check runs off the loop; the loop goes on.
      park(request) { server in
        await check(server)
      } then: {
        $0.open($1, ask, $2)
      }
    }
  }

  /// Parks `request` (watched: a client that leaves frees it) while `work` runs, then answers it on the loop
  /// with the result, unless the client left meanwhile.
  func park<T: Sendable>(
    _ request: HTTPRequest, _ work: @escaping (isolated SSEServer) async -> T,
    then answer: @escaping (isolated SSEServer, HTTPRequest, T) -> Void
  ) {
    guard let pending = PendingRequest(request, loop: loop) else { return }
    listener?.responseStaysOpen()
    let task = Task {
      let result = await work(self)
      guard let request = pending.resume() else { return }  // the client left meanwhile
      request.setHeader("Connection", "close")  // no keep-alive deadline was armed for a parked request
      answer(self, request, result)
    }
    // A client that leaves cancels its wait (a key check with no waiter left is cancelled too).
    pending.onLeft = { task.cancel() }
  }

  /// What a `/events` request asked for, carried across an off-loop credential check.
  private struct StreamAsk: Sendable {
    var streams: Set<String>?
    var requestedID: String?
    var address: String
    var cors: [(String, String)]
  }

  /// Applies the credential check's outcome, finds the grant's feed, checks the streams asked for, then the
  /// descriptor reserve and admission, then starts the stream.
  private func open(_ request: HTTPRequest, _ ask: StreamAsk, _ outcome: Result<Grant, StreamRefusal>) {
    let grant: Grant
    let feed: Feed
    switch outcome.flatMap({ grant in feeds.open(grant, asking: ask.streams).map { (grant, $0) } }) {
    case .success(let opened): (grant, feed) = opened
    case .failure(let refusal): return refuse(request, ask, refusal)
    }
    var streams = ask.streams
    if let granted = grant.streams {
      if let outside = streams?.subtracting(granted).sorted().first {
        return refuse(request, ask, .forbiddenStream(outside, message: "the credential does not grant this stream"))
      }
      streams = streams ?? granted
    }
    if request.method == .head {
      addStreamHeaders(request, cors: ask.cors, feed: feed)
      evhttp_send_reply(request.raw, 200, "OK", nil)
      return
    }
    guard let connection = request.connection else {
      request.respondError(status: 500, reason: "Internal Server Error", message: "no connection")
      return
    }
    // Descriptors are handed out lowest first, so a connection whose descriptor lies within the reserve means the
    // process is that close to its limit: refuse the stream, keep the rest for health checks and the upstream.
    if let bufferevent = evhttp_connection_get_bufferevent(connection),
      Int(bufferevent_getfd(bufferevent)) >= descriptorLimit - settings.descriptorReserve
    {
      reserveRefusals += 1
      request.respondError(
        status: 503, reason: "Service Unavailable", message: "too many open connections: retry later",
        headers: [("Retry-After", String(Int.random(in: 2...10))), ("Connection", "close")])
      return
    }
    if let reason = feed.assumeIsolated({ $0.unavailableReason }) {
      return refuse(request, ask, .unavailable(error: "feed_unavailable", message: reason))
    }
    let address = ask.address
    let subject = grant.subject
    if let refusal = admission.admit(address: address, subject: subject) {
      warnAtCap(refusal, address: address)
      return refuse(
        request, ask,
        StreamRefusal.admitted(
          refusal, subjectNoun: authenticator.subjectNoun, retryBase: refusal == .maxConnections ? 5 : 10))
    }
    // The stream's headers go on only now: a refusal above is a plain answer with its own Content-Type.
    addStreamHeaders(request, cors: ask.cors, feed: feed)
    // Streams end only when the server ends them; closing lets evhttp free the connection with the reply.
    request.setHeader("Connection", "close")
    let sink = SSEConnection(
      request: request.raw, connection: connection, scratch: scratch, loop: loop, writeTimeout: settings.timeout)
    listener?.responseStaysOpen()
    sink.begin()
    openStreams += 1
    let subscriber = feed.assumeIsolated { feed in
      feed.attach(
        sink: sink, requestedID: ask.requestedID, streams: streams, end: grant.end,
        revocationKey: grant.revocationKey)
    }
    sink.onClose = { [weak self] in
      self?.assumeIsolated { server in
        server.openStreams -= 1
        server.admission.release(address: address, subject: subject)
        feed.assumeIsolated { $0.detach(subscriber) }  // its own feed: the shared one, or its account's
      }
    }
  }

  private func addStreamHeaders(_ request: HTTPRequest, cors: [(String, String)], feed: Feed) {
    let head = feed.assumeIsolated { $0.headID }
    request.addHeader("Content-Type", "text/event-stream; charset=utf-8")
    request.addHeader("Cache-Control", "no-cache, no-store, no-transform")
    request.addHeader("X-Accel-Buffering", "no")
    request.addHeader("X-Pollcast-Head-Id", String(head))
    for (name, value) in cors { request.addHeader(name, value) }
  }

  // MARK: Refusals

  /// Counts `refusal` (auth failures, the failed-check throttle, admission) and answers it.
  private func refuse(_ request: HTTPRequest, _ ask: StreamAsk, _ refusal: StreamRefusal) {
    if let failure = refusal.failure { authFailures[failure, default: 0] += 1 }
    if refusal.throttles { admission.recordFailure(ask.address, now: MonotonicClock.seconds()) }
    if let counted = refusal.admission { admission.count(counted) }
    request.refuse(refusal, cors: ask.cors, random: &retryRandom)
  }
}
