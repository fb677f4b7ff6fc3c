import CLibevent
import Foundation

/// The downstream HTTP server on evhttp: `/events` (SSE), health, metrics.
///
/// Runs on the event loop; evhttp's callbacks enter it with `assumeIsolated`.
public actor SSEServer {
  public nonisolated let loop: EventLoop
  public nonisolated let feed: Feed
  public nonisolated let settings: ServerSettings
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  private var listener: HTTPListener?
  private let scratch = EventBuffer()
  private var openStreams = 0
  private var reserveRefusals = 0
  /// The soft limit on descriptors, read once at start (the relay raises it before).
  private var descriptorLimit = Int.max
  private let logger: Logger
  /// Extra routes (`/metrics`, `/readyz`, …) served by other components: path → handler.
  private var routes: [String: Route] = [:]
  /// `auth.mode = jwt`: the token verifier (nil with `none`).
  private let verifier: JWTVerifier?
  /// `auth.mode = upstream`: the per-account feeds and loops (nil otherwise).
  public nonisolated let hub: AccountHub?
  private var admission: Admission
  private let addresses: ClientAddressResolver
  private var retryRandom = SeededRandom(seed: UInt64.random(in: 0...UInt64.max))
  private var logLimiter = LogLimiter()
  /// Refused credentials by reason (`missing`, `expired`, …).
  private var authFailures: [String: Int] = [:]

  /// A handler for a plain (non-streaming) endpoint: returns status, content type and body.
  public struct Route: Sendable {
    public var methods: Set<String>
    public var handler: @Sendable () -> (status: Int32, contentType: String, body: String)
    public init(
      methods: Set<String> = ["GET", "HEAD"],
      handler: @escaping @Sendable () -> (status: Int32, contentType: String, body: String)
    ) {
      self.methods = methods
      self.handler = handler
    }
  }

  public init(loop: EventLoop, feed: Feed, settings: ServerSettings, logger: Logger, hub: AccountHub? = nil) {
    // The server enters the feed with assumeIsolated: both must run on the same loop.
    precondition(feed.loop === loop, "the SSE server and its feed must share one event loop")
    precondition(hub.map { $0.loop === loop } ?? true, "the SSE server and the account hub must share one loop")
    self.hub = hub
    self.loop = loop
    self.feed = feed
    self.settings = settings
    self.logger = logger
    verifier = settings.access.jwt.map { JWTVerifier(settings: $0) }
    admission = Admission(limits: settings.access.admission)
    addresses = ClientAddressResolver(trusted: settings.access.trustedProxies)
  }

  /// Replaces the token keys (`auth.mode = jwt`); false when the server does not check tokens.
  @discardableResult
  public func reloadKeys(_ jwt: JWTSettings) -> Bool {
    guard let verifier else { return false }
    verifier.replace(with: jwt)
    return true
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
    hub?.assumeIsolated { hub in
      hub.onUnverifiedKeyRefused { [weak self] address in
        self?.assumeIsolated { server in
          server.authFailures["invalid_credential", default: 0] += 1
          server.admission.recordFailure(address, now: MonotonicClock.seconds())
        }
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

  /// What the server refused or cut to protect itself, for `/metrics`.
  public struct ProtectionCounters: Sendable {
    public var accept = AcceptGuard.Counters()
    /// Streams refused because their descriptor fell inside the reserve.
    public var reserveRefusals = 0
    /// Streams refused by admission control, by reason.
    public var admissionRefusals: [Admission.Refusal: Int] = [:]
    /// Credentials refused, by reason.
    public var authFailures: [String: Int] = [:]
    /// Token signature checks done, and those answered from the cache.
    public var tokenVerifications = 0
    public var tokenCacheHits = 0
    /// The overall stream cap in force (automatic or configured).
    public var maxConnections = 0
    public var authMode = "none"
  }

  public var protectionCounters: ProtectionCounters {
    ProtectionCounters(
      accept: listener?.acceptCounters ?? .init(), reserveRefusals: reserveRefusals,
      admissionRefusals: admission.refusals, authFailures: authFailures,
      tokenVerifications: verifier?.verifications ?? 0, tokenCacheHits: verifier?.cacheHits ?? 0,
      maxConnections: admission.limits.maxConnections, authMode: settings.access.mode)
  }

  /// Stops accepting, ends every stream with a last comment, waits for them to flush (up to `deadline`
  /// seconds), then frees the server.
  public func shutdown(deadline: Double = 5, spread: Double = 0) async {
    guard let listener else { return }
    listener.stopAccepting()
    var ended = await feed.finishAll(comment: "pollcast shutting down", spread: spread)
    if let hub { ended += await hub.shutdown(comment: "pollcast shutting down", spread: spread) }
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

  // MARK: Requests

  private func handle(_ request: HTTPRequest) {
    if let connection = request.connection, ClosingConnections.isMarked(connection) {
      request.respondError(
        status: 400, reason: "Bad Request", message: "nothing is read after a CONNECT on this connection",
        headers: [("Connection", "close")])
      return
    }
    if request.uriLength > settings.maxURLBytes {
      request.respondError(
        status: 414, reason: "URI Too Long", message: "request target longer than \(settings.maxURLBytes) bytes")
      return
    }
    if let problem = request.framingProblem {
      request.respondError(
        status: 400, reason: "Bad Request", message: "ambiguous request framing: \(problem)",
        headers: [("Connection", "close")])
      return
    }
    guard let path = request.path else {
      request.respondError(
        status: 400, reason: "Bad Request", message: "malformed request target", headers: [("Connection", "close")])
      return
    }
    let origin = request.header("Origin")
    let cors = settings.cors.responseHeaders(origin: origin)
    if request.method == .connect || request.method == .other {
      // No route takes these. An unknown method may carry a body evhttp did not read: answer and close, so nothing
      // that follows on the connection is read as a request. evhttp never closes after a CONNECT (it expects a
      // tunnel) and sends no Content-Length for one: the answer gets an explicit `Content-Length: 0`, and the
      // connection is marked so that whatever is pipelined behind it is refused and the connection closed.
      if request.method == .connect, let connection = request.connection { ClosingConnections.mark(connection) }
      request.respond(
        status: 405, reason: "Method Not Allowed",
        contentType: request.method == .connect ? nil : "text/plain; charset=utf-8",
        body: request.method == .connect ? "" : "method not allowed\n",
        headers: cors
          + [("Allow", allowedMethods(path)), ("Connection", "close")]
          + (request.method == .connect ? [("Content-Length", "0")] : []))
      return
    }
    if path == "/events" {
      switch request.method {
      case .get, .head: handleEvents(request, cors: cors)
      case .options: handlePreflight(request, origin: origin)
      default: methodNotAllowed(request, allow: "GET, HEAD, OPTIONS", cors: cors)
      }
      return
    }
    if let route = routes[path] {
      if request.method == .options {
        handlePreflight(request, origin: origin)
        return
      }
      guard route.methods.contains(request.method.rawValue) else {
        methodNotAllowed(request, allow: (route.methods.sorted() + ["OPTIONS"]).joined(separator: ", "), cors: cors)
        return
      }
      let answer = route.handler()
      request.respond(
        status: answer.status, reason: reasonPhrase(answer.status), contentType: answer.contentType,
        body: request.method == .head ? "" : answer.body, headers: cors + [("Cache-Control", "no-store")])
      return
    }
    request.respondError(status: 404, reason: "Not Found", message: "no such path: \(path)", headers: cors)
  }

  /// The `Allow` value of a path.
  private func allowedMethods(_ path: String) -> String {
    if path == "/events" { return "GET, HEAD, OPTIONS" }
    guard let route = routes[path] else { return "GET, HEAD, OPTIONS" }
    return (route.methods.sorted() + ["OPTIONS"]).joined(separator: ", ")
  }

  private func methodNotAllowed(_ request: HTTPRequest, allow: String, cors: [(String, String)]) {
    request.respondError(
      status: 405, reason: "Method Not Allowed", message: "method \(request.method.rawValue) not allowed here",
      headers: cors + [("Allow", allow)])
  }

  private func handlePreflight(_ request: HTTPRequest, origin: String?) {
    guard let origin else {
      request.respond(status: 204, reason: "No Content", headers: [("Allow", "GET, HEAD, OPTIONS")])
      return
    }
    switch settings.cors.preflight(
      origin: origin, requestMethod: request.header("Access-Control-Request-Method"),
      requestHeaders: request.header("Access-Control-Request-Headers"))
    {
    case .allowed(let headers):
      request.respond(status: 204, reason: "No Content", headers: headers.map { ($0.name, $0.value) })
    case .refused(let why):
      request.respondError(status: 403, reason: "Forbidden", message: "CORS preflight refused: \(why)")
    }
  }

  private func handleEvents(_ request: HTTPRequest, cors: [(String, String)]) {
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
    let requestedID = request.header("Last-Event-ID") ?? queryLastID
    // Who is asking, and what may it read (auth.mode), before anything about the feed is said.
    let address = addresses.resolve(
      peer: request.peerAddress ?? "unknown", forwardedFor: request.header("X-Forwarded-For"))
    let monotonic = MonotonicClock.seconds()
    if let refusal = admission.throttled(address, now: monotonic) {
      refuse(request, refusal, cors: cors, retryBase: admission.throttleRemaining(address, now: monotonic) / 2)
      return
    }
    let ask = StreamAsk(streams: streams, requestedID: requestedID, address: address, cors: cors)
    if let hub {
      openAccountStream(request, ask, hub: hub, query: query)
      return
    }
    guard let verifier else {
      openStream(request, ask, identity: nil)
      return
    }
    guard let credential = credential(of: request, query: query, cors: cors, address: address) else { return }
    let now = Date().timeIntervalSince1970
    if let known = verifier.cached(credential, now: now) {
      openStream(request, ask, identity: known)
    } else if !verifier.checksOffLoop {
      openStream(request, ask, identity: verifier.verify(credential, now: now))
    } else {
      // RS256/ES256: the check runs on its own thread; the request waits, watched, and the loop goes on.
      park(request) { server in
        await server.verifier?.verifyOffLoop(credential, now: { Date().timeIntervalSince1970 }) ?? nil
      } then: { server, request, outcome in
        guard let outcome else {
          server.refuseBusy(request, cors: cors)
          return
        }
        server.openStream(request, ask, identity: outcome)
      }
    }
  }

  /// The subscriber's credential (header, cookie, query), or nil after answering 401.
  private func credential(
    of request: HTTPRequest, query: [(String, String)], cors: [(String, String)], address: String
  ) -> String? {
    switch CredentialExtractor.lookup(
      authorization: request.header("Authorization"), cookie: request.header("Cookie"), query: query,
      cookieName: settings.access.cookieName, allowQuery: settings.access.allowQueryToken,
      charset: settings.access.credentialCharset)
    {
    case .found(let credential, _):
      return credential
    case .missing:
      authFailures["missing", default: 0] += 1
      unauthorized(request, reason: "missing", message: missingCredentialMessage, cors: cors)
    case .malformed(let source):
      // Counts as a failed check: a client probing with crafted values is throttled like one guessing keys.
      authFailures["malformed_credential", default: 0] += 1
      admission.recordFailure(address, now: MonotonicClock.seconds())
      unauthorized(
        request, reason: "malformed_credential",
        message:
          "the credential in the \(source.rawValue) is not a token (\(settings.access.credentialCharset.rawValue))",
        cors: cors)
    }
    return nil
  }

  /// Parks `request` (watched: a client that leaves frees it) while `work` runs, then answers it on the loop
  /// with the result, unless the client left meanwhile.
  private func park<T: Sendable>(
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

  /// `auth.mode = upstream`: the subscriber's legacy key opens its account's feed. A key the hub already knows
  /// (accepted for an active account, or refused lately) is answered in this turn; otherwise the request waits,
  /// watched, while the legacy API is asked.
  private func openAccountStream(
    _ request: HTTPRequest, _ ask: StreamAsk, hub: AccountHub, query: [(String, String)]
  ) {
    guard let credential = credential(of: request, query: query, cors: ask.cors, address: ask.address) else {
      return
    }
    if let known = hub.assumeIsolated({ $0.cached(credential) }) {
      answer(request, ask, known, credential: credential)
      return
    }
    park(request) { _ in
      await hub.resolve(credential, address: ask.address)
    } then: { server, request, outcome in
      server.answer(request, ask, outcome, credential: credential)
    }
  }

  private func answer(
    _ request: HTTPRequest, _ ask: StreamAsk, _ outcome: AccountHub.Outcome, credential: String
  ) {
    switch outcome {
    case .admitted(let account):
      // The check may have finished some turns ago: make sure the account's loop still runs before attaching.
      guard hub?.assumeIsolated({ $0.ensureActive(account, credential: credential) }) ?? true else {
        admission.count(.maxAccounts)
        unavailable(
          request, error: "max_accounts", message: "the relay serves as many accounts as it may: retry later",
          cors: ask.cors)
        return
      }
      openStream(
        request, ask, identity: nil, account: account, grant: hub?.assumeIsolated { $0.grant(for: credential) })
    case .refused(let reason):
      authFailures[reason, default: 0] += 1
      admission.recordFailure(ask.address, now: MonotonicClock.seconds())
      unauthorized(
        request, reason: reason, message: "the legacy API does not accept this key", cors: ask.cors)
    case .unavailable:
      admission.count(.upstreamUnavailable)
      unavailable(
        request, error: "upstream_unavailable", message: "the legacy API could not check the key: retry later",
        cors: ask.cors)
    case .full:
      admission.count(.maxAccounts)
      unavailable(
        request, error: "max_accounts", message: "the relay serves as many accounts as it may: retry later",
        cors: ask.cors)
    case .busy:
      admission.count(.busy)
      unavailable(
        request, error: "busy", message: "too many key checks waiting for the legacy API: retry later",
        cors: ask.cors)
    }
  }

  /// 503 with a jittered Retry-After and a JSON body naming why.
  private func unavailable(_ request: HTTPRequest, error: String, message: String, cors: [(String, String)]) {
    let retry = Admission.retryAfter(base: 5, random: &retryRandom)
    let body = JSONText.object([
      "error": JSONText.quoted(error), "message": JSONText.quoted(message), "retry_after": String(retry),
    ])
    request.respond(
      status: 503, reason: "Service Unavailable", contentType: "application/json", body: body + "\n",
      headers: cors + [("Retry-After", String(retry)), ("Cache-Control", "no-store")])
  }

  /// What a `/events` request asked for, carried across an off-loop credential check.
  private struct StreamAsk: Sendable {
    var streams: Set<String>?
    var requestedID: String?
    var address: String
    var cors: [(String, String)]
  }

  /// Applies the credential check's outcome (nil: `auth.mode = none`), then the descriptor reserve and admission,
  /// then starts the stream.
  private func openStream(
    _ request: HTTPRequest, _ ask: StreamAsk, identity: Result<TokenClaims, TokenRejection>?,
    account: AccountHub.Account? = nil, grant: String? = nil
  ) {
    let feed = account?.feed ?? self.feed
    let cors = ask.cors
    let address = ask.address
    var streams = ask.streams
    let requestedID = ask.requestedID
    var subject = account.map { "account:\($0.key)" }
    var expiry: (monotonic: Double, unix: Double)?
    if let account, let asked = streams, let outside = asked.subtracting(account.streams).sorted().first {
      forbidden(request, stream: outside, cors: cors, by: "this account does not read this stream")
      return
    }
    switch identity {
    case nil:
      break
    case .failure(let rejection)?:
      authFailures[rejection.code, default: 0] += 1
      admission.recordFailure(address, now: MonotonicClock.seconds())
      unauthorized(request, reason: rejection.code, message: rejection.message, cors: cors)
      return
    case .success(let claims)?:
      subject = claims.subject
      let now = Date().timeIntervalSince1970
      expiry = (MonotonicClock.seconds() + (claims.expiresAt + (verifier?.leeway ?? 0) - now), claims.expiresAt)
      if let allowed = claims.streams {
        if let asked = streams {
          if let outside = asked.subtracting(allowed).sorted().first {
            forbidden(request, stream: outside, cors: cors, by: "the token does not grant this stream")
            return
          }
        } else {
          streams = allowed
        }
      }
    }
    if request.method == .head {
      addStreamHeaders(request, cors: cors, feed: feed)
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
      unavailable(request, error: "feed_unavailable", message: reason, cors: cors)
      return
    }
    if let refusal = admission.admit(address: address, subject: subject) {
      if refusal == .perAddress && settings.access.trustedProxies.isEmpty
        && (address.hasPrefix("127.") || address == "::1")
      {
        // Everyone seems to come from loopback: most likely a proxy in front that is not in trusted_proxies.
        logger.limited(
          .warning, "per-address stream limit reached for a loopback address",
          metadata: [
            "address": address, "limit": String(admission.limits.maxPerAddress),
            "hint": "if a proxy runs in front, list it in server.trusted_proxies",
          ], limiter: &logLimiter)
      }
      if refusal == .maxConnections {
        logger.limited(
          .warning, "stream limit reached: refusing new streams with 503",
          metadata: ["limit": String(admission.limits.maxConnections)], limiter: &logLimiter)
      }
      refuse(request, refusal, cors: cors, retryBase: refusal == .maxConnections ? 5 : 10)
      return
    }
    // The stream's headers go on only now: a refusal above is a plain answer with its own Content-Type.
    addStreamHeaders(request, cors: cors, feed: feed)
    // Streams end only when the server ends them; closing lets evhttp free the connection with the reply.
    request.setHeader("Connection", "close")
    let sink = SSEConnection(
      request: request.raw, connection: connection, scratch: scratch, loop: loop, writeTimeout: settings.timeout)
    listener?.responseStaysOpen()
    sink.begin()
    openStreams += 1
    let subscriber = feed.assumeIsolated { feed in
      feed.attach(sink: sink, requestedID: requestedID, streams: streams, expiry: expiry, grant: grant)
    }
    sink.onClose = { [weak self] in
      self?.assumeIsolated { server in
        server.openStreams -= 1
        server.admission.release(address: address, subject: subject)
        feed.assumeIsolated { $0.detach(subscriber) }  // its own feed: the shared one, or its account's
      }
    }
  }

  /// 503: too many token checks are waiting for the checking thread.
  private func refuseBusy(_ request: HTTPRequest, cors: [(String, String)]) {
    admission.count(.busy)
    let retry = Admission.retryAfter(base: 2, random: &retryRandom)
    let body = JSONText.object([
      "error": JSONText.quoted("busy"), "message": JSONText.quoted("too many token checks waiting: retry later"),
      "retry_after": String(retry),
    ])
    request.respond(
      status: 503, reason: "Service Unavailable", contentType: "application/json", body: body + "\n",
      headers: cors + [("Retry-After", String(retry)), ("Cache-Control", "no-store")])
  }

  private func addStreamHeaders(_ request: HTTPRequest, cors: [(String, String)], feed: Feed) {
    let head = feed.assumeIsolated { $0.headID }
    request.addHeader("Content-Type", "text/event-stream; charset=utf-8")
    request.addHeader("Cache-Control", "no-cache, no-store, no-transform")
    request.addHeader("X-Accel-Buffering", "no")
    request.addHeader("X-Pollcast-Head-Id", String(head))
    for (name, value) in cors { request.addHeader(name, value) }
  }

  private var missingCredentialMessage: String {
    let what = hub == nil ? "token" : "key"
    return "a \(what) is required: Authorization: Bearer <\(what)>, or the cookie \(settings.access.cookieName)"
      + (settings.access.allowQueryToken ? ", or ?access_token=<\(what)>" : "")
  }

  /// 401 with `WWW-Authenticate: Bearer` and a JSON body naming the reason. The credential is never echoed.
  private func unauthorized(_ request: HTTPRequest, reason: String, message: String, cors: [(String, String)]) {
    let challenge =
      reason == "missing"
      ? "Bearer realm=\"pollcast\""
      : "Bearer realm=\"pollcast\", error=\"invalid_token\", error_description=\"\(reason)\""
    let noun = hub == nil ? "token" : "credential"
    let body = JSONText.object([
      "error": JSONText.quoted(
        reason == "missing" ? "missing_\(noun)" : reason == "malformed_credential" ? reason : "invalid_\(noun)"),
      "reason": JSONText.quoted(reason), "message": JSONText.quoted(message),
    ])
    request.respond(
      status: 401, reason: "Unauthorized", contentType: "application/json", body: body + "\n",
      headers: cors + [("WWW-Authenticate", challenge), ("Cache-Control", "no-store")])
  }

  private func forbidden(_ request: HTTPRequest, stream: String, cors: [(String, String)], by message: String) {
    let body = JSONText.object([
      "error": JSONText.quoted("forbidden_stream"), "stream": JSONText.quoted(String(stream.prefix(256))),
      "message": JSONText.quoted(message),
    ])
    request.respond(
      status: 403, reason: "Forbidden", contentType: "application/json", body: body + "\n",
      headers: cors + [("Cache-Control", "no-store")])
  }

  /// 503 (the server is full) or 429 (this client's share is used up), with a jittered Retry-After.
  private func refuse(_ request: HTTPRequest, _ refusal: Admission.Refusal, cors: [(String, String)], retryBase: Double)
  {
    let retry = Admission.retryAfter(base: retryBase, random: &retryRandom)
    let message =
      switch refusal {
      case .maxConnections: "the relay is at its stream limit: retry later"
      case .perAddress: "too many streams from this address"
      case .perSubject: hub == nil ? "too many streams for this subject" : "too many streams for this account"
      case .maxAccounts: "the relay serves as many accounts as it may"
      case .upstreamUnavailable: "the legacy API could not check the key"
      case .busy: "too many credential checks waiting"
      case .authThrottled: "too many failed credential checks from this address"
      }
    let body = JSONText.object([
      "error": JSONText.quoted(refusal.rawValue), "message": JSONText.quoted(message),
      "retry_after": String(retry),
    ])
    request.respond(
      status: refusal.status, reason: refusal.status == 503 ? "Service Unavailable" : "Too Many Requests",
      contentType: "application/json", body: body + "\n",
      headers: cors + [("Retry-After", String(retry)), ("Cache-Control", "no-store")])
  }
}

private func reasonPhrase(_ status: Int32) -> String {
  switch status {
  case 200: "OK"
  case 204: "No Content"
  case 400: "Bad Request"
  case 404: "Not Found"
  case 503: "Service Unavailable"
  default: "Status"
  }
}
