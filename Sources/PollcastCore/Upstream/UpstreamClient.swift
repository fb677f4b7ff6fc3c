import Foundation

/// Something that sees every upstream request before it goes out and after it completes (seed 002's
/// interceptors): authentication, logging, metrics.
public protocol UpstreamInterceptor: Sendable {
  func prepare(_ request: inout UpstreamRequest)
  func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>)
}

extension UpstreamInterceptor {
  public func prepare(_ request: inout UpstreamRequest) {}
  public func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>) {}
}

/// Adds `Authorization: Bearer <api key>` to requests that ask for it.
public struct AuthInterceptor: UpstreamInterceptor {
  let apiKey: String
  public init(apiKey: String) { self.apiKey = apiKey }

  public func prepare(_ request: inout UpstreamRequest) {
    guard request.authentication == .apiKey, !apiKey.isEmpty else { return }
    request.headers.append(("Authorization", "Bearer \(apiKey)"))
  }
}

/// Logs each request and its outcome with tokens and keys redacted from the URL; headers are never logged.
public struct LoggingInterceptor: UpstreamInterceptor {
  let logger: Logger
  /// Values never shown, wherever they stand in a URL (a subscriber's credential in a path).
  let secrets: [String]
  public init(logger: Logger, secrets: [String] = []) {
    self.logger = logger
    self.secrets = secrets.filter { !$0.isEmpty }
  }

  private func shown(_ url: String, _ extra: [String] = []) -> String {
    UpstreamResponse.scrub(redactURL(url), secrets + extra)
  }

  public func prepare(_ request: inout UpstreamRequest) {
    logger.trace(
      "upstream request",
      metadata: ["upstream.call": request.label, "url": shown(request.url, request.redact), "method": request.method])
  }

  public func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>) {
    switch outcome {
    case .success(let response):
      logger.debug(
        "upstream response",
        metadata: [
          "upstream.call": request.label, "upstream.status": String(response.status),
          "duration_ms": String(Int(response.duration * 1000)),
        ])
    case .failure(let error) where error.kind == .cancelled:
      break
    case .failure(let error):
      logger.debug(
        "upstream request failed",
        metadata: [
          "upstream.call": request.label, "url": shown(request.url, request.redact),
          "error": UpstreamResponse.scrub(error.description, request.redact),
        ])
    }
  }
}

/// Fragments of query parameter names whose values are secrets (`api_key`, `access_token`, `X-Signature`, …).
/// Matching by fragment errs on the side of hiding: a value shown by mistake cannot be taken back.
let secretParameterFragments = [
  "token", "key", "secret", "password", "passwd", "pass", "auth", "sig", "session",
  "credential",
]

/// `url` with its userinfo (`user:password@`) and the values of secret query parameters replaced by `[redacted]`.
/// Used wherever a URL is shown: logs, `--print-config`, error messages.
public func redactURL(_ url: String) -> String {
  var text = url
  if let scheme = text.range(of: "://") {
    let authorityEnd = text[scheme.upperBound...].firstIndex { "/?#".contains($0) } ?? text.endIndex
    if let at = text[scheme.upperBound..<authorityEnd].lastIndex(of: "@") {
      text.replaceSubrange(scheme.upperBound..<at, with: "[redacted]")
    }
  }
  guard let question = text.firstIndex(of: "?") else { return text }
  let queryEnd = text[question...].firstIndex(of: "#") ?? text.endIndex
  let query = text[text.index(after: question)..<queryEnd]
  let redacted = query.split(separator: "&", omittingEmptySubsequences: false).map { pair -> String in
    guard let equals = pair.firstIndex(of: "=") else { return String(pair) }
    let name = pair[..<equals].lowercased()
    return secretParameterFragments.contains { name.contains($0) } ? "\(pair[..<equals])=[redacted]" : String(pair)
  }
  return String(text[...question]) + redacted.joined(separator: "&") + String(text[queryEnd...])
}

/// `url` as an identity: without its userinfo at all (a changed password is the same API), secret query values
/// redacted, and a trailing slash dropped.
public func identityURL(_ url: String) -> String {
  var text = url
  if let scheme = text.range(of: "://") {
    let authorityEnd = text[scheme.upperBound...].firstIndex { "/?#".contains($0) } ?? text.endIndex
    if let at = text[scheme.upperBound..<authorityEnd].lastIndex(of: "@") {
      text.removeSubrange(scheme.upperBound...at)
    }
  }
  text = redactURL(text)
  while text.hasSuffix("/") { text.removeLast() }
  return text
}

/// Percent-encodes a query parameter value.
///
/// RFC 3986's unreserved characters (ASCII letters, digits, `-._~`) stay; every other UTF-8 byte becomes `%XX`.
/// Done by hand over the bytes: Foundation's `addingPercentEncoding` with a `CharacterSet` cost a seventh of the
/// relay's CPU when every poll of 2,000 accounts encoded its token and cursor.
public func encodeQueryValue(_ value: String) -> String {
  func unreserved(_ byte: UInt8) -> Bool {
    (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || (byte >= 0x30 && byte <= 0x39)
      || byte == 0x2D || byte == 0x2E || byte == 0x5F || byte == 0x7E
  }
  if value.utf8.allSatisfy(unreserved) { return value }
  let hex = Array("0123456789ABCDEF".utf8)
  var bytes: [UInt8] = []
  bytes.reserveCapacity(value.utf8.count * 3)
  for byte in value.utf8 {
    if unreserved(byte) {
      bytes.append(byte)
    } else {
      bytes += [0x25, hex[Int(byte >> 4)], hex[Int(byte & 0x0F)]]
    }
  }
  return String(decoding: bytes, as: UTF8.self)
}

/// Where libcurl reached a host name, and when.
struct LearnedAddress: Equatable {
  var name: String
  var port: UInt16
  var address: String
  var at: Double
}

/// Where libcurl last reached the host names of plain-HTTP URLs (a few: a recipe may send its session step and its
/// polls to different hosts). Kept-alive connections connect there (`UpstreamClient`): a name is never resolved
/// outside libcurl, which resolves without blocking, tries every address and caches answers. Shared by the
/// transports of a pool, so that one account's answer serves every account's next connection. Loop-confined.
final class AddressBook: @unchecked Sendable {  // loop-confined
  static let limit = 4
  var entries: [LearnedAddress] = []
  /// How long a learned address may be used for a new connection, as libcurl's own DNS cache keeps an answer
  /// (`CURLOPT_DNS_CACHE_TIMEOUT`'s default). A connection already open is used for as long as it stays open, as
  /// libcurl reuses its own; after this a new connection goes through libcurl, which resolves the name again.
  var lifetime = 60.0
}

/// The relay's transport: libcurl and the kept connection behind the interceptor chain.
public final class UpstreamClient: UpstreamTransport, @unchecked Sendable {  // loop-confined, like its transport
  public let transport: CurlTransport
  public let interceptors: [UpstreamInterceptor]

  /// The kept-alive connection for plain-HTTP requests (see `KeepAliveConnection`); made on first use.
  private var keptConnection: KeepAliveConnection?
  /// The kept connection's last parsed target (see `KeepAliveConnection.target(for:after:)`).
  private var lastTarget: KeepAliveConnection.Target?

  public var maxBodyBytes: Int { transport.maxBodyBytes }

  public init(transport: CurlTransport, interceptors: [UpstreamInterceptor]) {
    self.transport = transport
    self.interceptors = interceptors
  }

  /// Requests sent on the kept-alive connection so far (the rest went through libcurl).
  public var keptAliveRequests: Int { keptConnection?.requestsSent ?? 0 }

  /// Sends `held.request` through the interceptors, with the outcome written into it (`held.outcome`).
  /// Every account keeps this chain of frames while its poll hangs: a request passed by value to an async call is
  /// copied into the caller's frame (105 bytes, twice, in `RecipeAdapter.poll`), and a response or a typed error
  /// returned takes slots in both frames; a reference is one word.
  ///
  /// Every step but the calls is synchronous, and the exchange's values are in a class whose `let` the calls borrow:
  /// an async frame holds every value and temporary of its body (a copy of a `var` property among them). The kept
  /// connection writes its outcome into the exchange: no response or error passes through this frame.
  public func send(held: HeldRequest, isolation: isolated (any Actor)?) async {
    let exchange = begin(held)
    if let connection = exchange.connection {
      await connection.perform(exchange)
      keptEnded(exchange, on: connection)
    }
    if exchange.outcome == nil { await throughLibcurl(exchange) }
    end(exchange, into: held)
  }

  /// `end` for `send(held:)`: the outcome goes into `held`.
  @inline(never)
  private func end(_ exchange: Exchange, into held: HeldRequest) {
    held.outcome = Result { () throws(UpstreamError) in try end(exchange) }
  }

  @inline(never)
  private func begin(_ held: HeldRequest) -> Exchange { begin(held.request) }

  /// One request on its way: as the interceptors prepared it, how it is carried (by the kept connection; nil:
  /// libcurl), and its outcome once known.
  private final class Exchange: PendingExchange, @unchecked Sendable {  // loop-confined
    /// The request as the interceptors prepared it.
    var prepared: UpstreamRequest { request }
    /// The kept connection carrying the request (the exchange is its pending exchange); nil when libcurl does.
    var connection: KeepAliveConnection?
    /// libcurl closes its connection after this request (see `keptRoute` and `reroutes`).
    var closesConnection = false
  }

  /// The interceptors' preparation, the last check (nothing reaches the wire unchecked) and the route: the kept
  /// connection when it carries the request, else libcurl. A request the check refuses has its outcome already.
  @inline(never)
  private func begin(_ request: UpstreamRequest) -> Exchange {
    var prepared = request
    for interceptor in interceptors { interceptor.prepare(&prepared) }
    let exchange = Exchange(prepared)
    do throws(UpstreamError) {
      try OutgoingRequest.check(prepared)
    } catch {
      exchange.outcome = .failure(error)
      return exchange
    }
    if let connection = keptRoute(prepared, exchange) {
      transport.requestsKeptAlive += 1
      exchange.connection = connection
    }
    return exchange
  }

  /// The kept connection's outcome is the exchange's, unless it failed and `reroutes` sends the request to libcurl
  /// at once.
  @inline(never)
  private func keptEnded(_ exchange: Exchange, on connection: KeepAliveConnection) {
    // `perform` returns with an outcome; were one missing, the request is not sent again.
    if exchange.outcome == nil { exchange.outcome = .failure(UpstreamError(.cancelled, "cancelled")) }
    if let reason = connection.misframed {
      // A server whose framing this client cannot follow: libcurl carries every later request of this client, and
      // the kept connection (idle now) is freed with its socket.
      keptRefusedBecause = reason
      keptConnection = nil
      // An answer refused for its framing was not used: an idempotent request goes again through libcurl at once.
      if reason.refusedAnswer, Self.idempotent.contains(exchange.prepared.method) {
        exchange.outcome = nil
        return
      }
    }
    guard case .failure(let error) = exchange.outcome, reroutes(error, on: connection) else { return }
    exchange.outcome = nil
    exchange.closesConnection = true
  }

  private static let idempotent: Set<String> = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]

  /// Why the kept connection is no longer used by this client (its server's framing could not be trusted), or nil.
  var keptRefusedBecause: KeepAliveConnection.Misframing?

  /// The request through libcurl; an address it reached a name at is learned. In a function of its own, so that its
  /// frame is made only when libcurl carries a request.
  @inline(never)
  private func throughLibcurl(_ exchange: Exchange, isolation: isolated (any Actor)? = #isolation) async {
    var request = exchange.prepared
    request.closesConnection = exchange.closesConnection
    do {
      exchange.outcome = .success(try await transport.perform(request, owner: ObjectIdentifier(self)))
    } catch {
      exchange.outcome = .failure(error)
    }
    learn(request, exchange)
  }

  /// Tells the interceptors how the exchange ended, last one first.
  @inline(never)
  private func end(_ exchange: Exchange) throws(UpstreamError) -> UpstreamResponse {
    let outcome = exchange.outcome ?? .failure(UpstreamError(.transport, "no outcome"))
    for interceptor in interceptors.reversed() { interceptor.completed(exchange.prepared, outcome: outcome) }
    return try outcome.get()
  }

  /// The kept connection, with `request`'s target staged on it, when it carries `request`; nil when libcurl does.
  /// A request to a name not reached lately goes through libcurl, which then closes its connection: the kept
  /// connection takes the next request, and libcurl's would stay open beside it, one idle socket per account.
  /// Synchronous, like every step of `send` but its calls: an async frame holds every value of its body, and every
  /// account keeps `send`'s frame while its poll hangs.
  @inline(never)
  private func keptRoute(_ request: UpstreamRequest, _ exchange: Exchange) -> KeepAliveConnection? {
    guard keptConnection?.busy != true, keptRefusedBecause == nil,
      let parsed = KeepAliveConnection.target(for: request, after: lastTarget)
    else { return nil }
    // Kept without its path, which would hold the whole previous URL.
    lastTarget = parsed
    lastTarget?.path = ""
    guard let target = addressed(parsed) else {
      exchange.closesConnection = true
      return nil
    }
    let connection = keptConnection ?? KeepAliveConnection(loop: transport.loop, maxBodyBytes: transport.maxBodyBytes)
    keptConnection = connection
    connection.stage(target)
    return connection
  }

  /// True when a failure on the kept connection should go to libcurl at once: the request was to a name, its learned
  /// address took no connection (the API moved, as a restarted container does) and nothing was sent. The address is
  /// forgotten; libcurl resolves the name afresh.
  @inline(never)
  private func reroutes(_ error: UpstreamError, on connection: KeepAliveConnection) -> Bool {
    guard error.kind != .cancelled, let name = connection.lastTargetName, connection.lastFailedBeforeConnecting else {
      return false
    }
    transport.addresses.entries.removeAll { $0.name == name }
    return true
  }

  /// `parsed` with the address to connect to: itself for an IP address; for a name, the address libcurl reached it
  /// at, while a connection to it is open or the address is fresh; nil when libcurl must resolve the name.
  private func addressed(_ parsed: KeepAliveConnection.Target) -> KeepAliveConnection.Target? {
    guard parsed.named else { return parsed }
    guard let learned = transport.addresses.entries.first(where: { $0.name == parsed.name && $0.port == parsed.port })
    else {
      return nil
    }
    var target = parsed
    target.host = learned.address
    if MonotonicClock.seconds() - learned.at <= transport.addresses.lifetime { return target }
    if keptConnection?.holdsOpenSocket(to: target) == true { return target }
    return nil
  }

  /// Keeps the address libcurl reached `request`'s host name at, when the URL names one the kept connection could
  /// carry (any answer proves the address, whatever its status).
  @inline(never)
  private func learn(_ request: UpstreamRequest, _ exchange: Exchange) {
    guard case .success(let response) = exchange.outcome, let address = response.peerAddress,
      let parsed = KeepAliveConnection.target(for: request), let name = parsed.name,
      KeepAliveConnection.isAddress(address)
    else { return }
    transport.addresses.entries.removeAll { $0.name == name && $0.port == parsed.port }
    if transport.addresses.entries.count >= AddressBook.limit {
      transport.addresses.entries.removeFirst()
    }
    transport.addresses.entries.append(
      LearnedAddress(name: name, port: parsed.port, address: address, at: MonotonicClock.seconds()))
  }

  /// Cancels this client's transfers (not those of other clients sharing the transport).
  public func cancelAll() {
    transport.cancelAll(owner: ObjectIdentifier(self))
    keptConnection?.cancel()
  }

  /// This client's transfers in progress.
  public var inFlight: Int {
    transport.inFlight(owner: ObjectIdentifier(self)) + (keptConnection?.busy == true ? 1 : 0)
  }
}
