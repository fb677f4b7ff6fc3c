import CLibevent

/// The server's plain routes and the request checks every path goes through first.
extension SSEServer {
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

  func handle(_ request: HTTPRequest) {
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
    if let problem = request.headerValueProblem {
      request.respondError(
        status: 400, reason: "Bad Request", message: "malformed header: \(problem)", headers: [("Connection", "close")])
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
      let head = request.method == .head
      let reply: (HTTPRequest, Route.Answer) -> Void = { request, answer in
        request.respond(
          status: answer.status, reason: reasonPhrase(answer.status), contentType: answer.contentType,
          body: head ? "" : answer.body, headers: cors + [("Cache-Control", "no-store")])
      }
      switch route.answer {
      case .now(let handler): reply(request, handler())
      case .later(let handler):
        park(request, { _ in await handler() }, then: { _, request, answer in reply(request, answer) })
      }
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

  /// Logs (rate-limited) when a cap refuses streams in a way an operator should hear about.
  func warnAtCap(_ refusal: Admission.Refusal, address: String) {
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
