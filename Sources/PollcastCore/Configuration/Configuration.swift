/// The whole configuration tree. Every key is documented in `Configuration.settings` (which also drives the
/// file keys, the `POLLCAST_*` variables and the flags) and in the README's reference table.
///
/// Precedence: defaults < `Config/pollcast.json` (or `--config FILE`) < environment < flags.
public struct Configuration: Codable, Sendable, Equatable {
  public struct Server: Codable, Sendable, Equatable {
    public var listen = "127.0.0.1:8080"
    public var maxHeaderBytes = 16 << 10
    public var maxURLBytes = 12 << 10
    public var maxBodyBytes = 64 << 10
    public var timeoutSeconds = 60.0
    public var backlog = 4096
    public var headerTimeoutSeconds = 10.0
    public var descriptorReserve = 64
    public var shutdownSpreadSeconds = 0.0
    public var shutdownDeadlineSeconds = 10.0
    /// 0: automatic, 90 % of what the descriptor limit leaves after the reserve.
    public var maxConnections = 0
    public var maxConnectionsPerAddress = 0
    public var maxConnectionsPerSubject = 32
    public var trustedProxies: [String] = []

    enum CodingKeys: String, CodingKey {
      case listen, backlog
      case maxConnections = "max_connections"
      case maxConnectionsPerAddress = "max_connections_per_address"
      case maxConnectionsPerSubject = "max_connections_per_subject"
      case trustedProxies = "trusted_proxies"
      case shutdownSpreadSeconds = "shutdown_spread_seconds"
      case shutdownDeadlineSeconds = "shutdown_deadline_seconds"
      case maxHeaderBytes = "max_header_bytes"
      case maxURLBytes = "max_url_bytes"
      case maxBodyBytes = "max_body_bytes"
      case timeoutSeconds = "timeout_seconds"
      case headerTimeoutSeconds = "header_timeout_seconds"
      case descriptorReserve = "descriptor_reserve"
    }
  }

  public struct CORS: Codable, Sendable, Equatable {
    public var allowedOrigins: [String] = []
    public var allowCredentials = false
    public var maxAgeSeconds = 600

    enum CodingKeys: String, CodingKey {
      case allowedOrigins = "allowed_origins"
      case allowCredentials = "allow_credentials"
      case maxAgeSeconds = "max_age_seconds"
    }
  }

  public struct SSE: Codable, Sendable, Equatable {
    public var heartbeatSeconds = 15.0
    public var retryMilliseconds = 3000
    public var maxPendingBytes = 1 << 20
    public var replayChunkBytes = 256 << 10
    /// 0 keeps streams open indefinitely.
    public var maxConnectionAgeSeconds = 0.0
    public var maxConnectionAgeJitterSeconds = 0.0

    enum CodingKeys: String, CodingKey {
      case maxConnectionAgeSeconds = "max_connection_age_seconds"
      case maxConnectionAgeJitterSeconds = "max_connection_age_jitter_seconds"
      case heartbeatSeconds = "heartbeat_seconds"
      case retryMilliseconds = "retry_ms"
      case maxPendingBytes = "max_pending_bytes"
      case replayChunkBytes = "replay_chunk_bytes"
    }
  }

  public struct Ring: Codable, Sendable, Equatable {
    public var maxEvents = 10_000
    public var maxBytes = 64 << 20
    /// 0 keeps events regardless of age.
    public var maxAgeSeconds = 0.0

    enum CodingKeys: String, CodingKey {
      case maxEvents = "max_events"
      case maxBytes = "max_bytes"
      case maxAgeSeconds = "max_age_seconds"
    }
  }

  public struct Log: Codable, Sendable, Equatable {
    public var level = "info"
    public var format = "logfmt"
  }

  public struct Upstream: Codable, Sendable, Equatable {
    public var adapter = "chat"
    public var url = ""
    public var apiKey = ""
    public var pollTimeoutSeconds = 25.0
    public var requestMarginSeconds = 10.0
    public var requestTimeoutSeconds = 10.0
    public var connectTimeoutSeconds = 5.0
    public var backoffBaseSeconds = 2.0
    public var backoffCapSeconds = 30.0
    public var startFrom = "latest"
    /// 0 never idles.
    public var idleAfterSeconds = 0.0
    public var readyWindowSeconds = 60.0
    public var resyncIntervalSeconds = 60.0
    public var minPollIntervalSeconds = 1.0
    public var maxBodyBytes = 8 << 20
    /// Per-user relaying: accounts polling at once, accounts kept for resumes, ring bytes over all accounts.
    public var maxAccounts = 10_000
    public var maxRetainedAccounts = 50_000
    public var maxTotalRingBytes = 256 << 20

    enum CodingKeys: String, CodingKey {
      case adapter, url
      case maxAccounts = "max_accounts"
      case maxRetainedAccounts = "max_retained_accounts"
      case maxTotalRingBytes = "max_total_ring_bytes"
      case apiKey = "api_key"
      case pollTimeoutSeconds = "poll_timeout_seconds"
      case requestMarginSeconds = "request_margin_seconds"
      case requestTimeoutSeconds = "request_timeout_seconds"
      case connectTimeoutSeconds = "connect_timeout_seconds"
      case backoffBaseSeconds = "backoff_base_seconds"
      case backoffCapSeconds = "backoff_cap_seconds"
      case startFrom = "start_from"
      case idleAfterSeconds = "idle_after_seconds"
      case readyWindowSeconds = "ready_window_seconds"
      case resyncIntervalSeconds = "resync_interval_seconds"
      case minPollIntervalSeconds = "min_poll_interval_seconds"
      case maxBodyBytes = "max_body_bytes"
    }
  }

  public struct Auth: Codable, Sendable, Equatable {
    public struct JWT: Codable, Sendable, Equatable {
      public var algorithm = "HS256"
      public var keyFile = ""
      public var keysDirectory = ""
      public var audience = ""
      public var leewaySeconds = 30.0

      enum CodingKeys: String, CodingKey {
        case algorithm, audience
        case keyFile = "key_file"
        case keysDirectory = "keys_directory"
        case leewaySeconds = "leeway_seconds"
      }
    }

    public var mode = "none"
    public var cookieName = "pollcast_token"
    public var allowQueryToken = false
    public var credentialCharset = "b64token"
    public var maxFailuresPerMinute = 30
    /// Per-user relaying: how long a refused key is answered from memory, and an accepted one trusted.
    public var credentialCacheSeconds = 30.0
    public var jwt = JWT()

    enum CodingKeys: String, CodingKey {
      case mode, jwt
      case cookieName = "cookie_name"
      case allowQueryToken = "allow_query_token"
      case credentialCharset = "credential_charset"
      case maxFailuresPerMinute = "max_failures_per_minute"
      case credentialCacheSeconds = "credential_cache_seconds"
    }
  }

  public struct Generic: Codable, Sendable, Equatable {
    public var urlTemplate = ""
    public var eventsPointer = ""
    public var idPointer = "/id"
    public var headers: [String] = []
    public var stream = "default"
    public var timeoutSeconds = 60.0
    /// Digits; empty starts from 0.
    public var initialCursor = ""

    enum CodingKeys: String, CodingKey {
      case headers, stream
      case initialCursor = "initial_cursor"
      case urlTemplate = "url_template"
      case eventsPointer = "events_pointer"
      case idPointer = "id_pointer"
      case timeoutSeconds = "timeout_seconds"
    }
  }

  public struct Store: Codable, Sendable, Equatable {
    public var kind = "memory"
    public var path = ""
    public var synchronous = "normal"
    public var resetIfCorrupt = false
    public var resetOnSourceChange = false
    public var redisURL = "redis://127.0.0.1:6379"
    public var redisPrefix = "pollcast"
    public var leaseSeconds = 5.0
    public var nodeID = ""

    enum CodingKeys: String, CodingKey {
      case kind, path, synchronous
      case resetIfCorrupt = "reset_if_corrupt"
      case resetOnSourceChange = "reset_on_source_change"
      case redisURL = "redis_url"
      case redisPrefix = "redis_prefix"
      case leaseSeconds = "lease_seconds"
      case nodeID = "node_id"
    }
  }

  public var server = Server()
  public var store = Store()
  public var auth = Auth()
  public var cors = CORS()
  public var sse = SSE()
  public var ring = Ring()
  public var log = Log()
  public var upstream = Upstream()
  public var generic = Generic()
  /// `--demo`: the upstream is the embedded fixture, started anew on a new port each run (not a file key).
  public var isDemo = false

  enum CodingKeys: String, CodingKey {
    case server, store, auth, cors, sse, ring, log, upstream, generic
  }

  public init() {}
}

extension Configuration {
  public var logger: Logger {
    Logger(
      label: "pollcast", level: Logger.Level(name: log.level) ?? .info,
      format: Logger.Format(rawValue: log.format) ?? .logfmt)
  }

  /// Every problem with this configuration, at once; empty when it is usable.
  public func problems() -> [String] {
    var problems: [String] = []
    do { _ = try ListenAddress.parse(server.listen) } catch { problems.append("server.listen: \(error)") }
    func positive(_ value: Int, _ key: String) {
      if value <= 0 { problems.append("\(key): must be greater than 0 (got \(value))") }
    }
    positive(server.maxHeaderBytes, "server.max_header_bytes")
    positive(server.maxURLBytes, "server.max_url_bytes")
    positive(server.maxBodyBytes, "server.max_body_bytes")
    positive(server.backlog, "server.backlog")
    positive(sse.maxPendingBytes, "sse.max_pending_bytes")
    positive(sse.replayChunkBytes, "sse.replay_chunk_bytes")
    positive(ring.maxEvents, "ring.max_events")
    positive(ring.maxBytes, "ring.max_bytes")
    if server.maxURLBytes > server.maxHeaderBytes {
      problems.append(
        "server.max_url_bytes: \(server.maxURLBytes) exceeds server.max_header_bytes (\(server.maxHeaderBytes)), "
          + "which also bounds the request line")
    }
    if !(server.timeoutSeconds > 0) { problems.append("server.timeout_seconds: must be greater than 0") }
    if !(server.headerTimeoutSeconds > 0) {
      problems.append("server.header_timeout_seconds: must be greater than 0")
    }
    if server.descriptorReserve < 8 { problems.append("server.descriptor_reserve: must be at least 8") }
    if !(sse.heartbeatSeconds > 0) {
      problems.append("sse.heartbeat_seconds: must be greater than 0")
    } else if sse.heartbeatSeconds >= server.timeoutSeconds {
      problems.append(
        "sse.heartbeat_seconds: \(sse.heartbeatSeconds) must be below server.timeout_seconds "
          + "(\(server.timeoutSeconds)), or idle streams time out")
    }
    if sse.retryMilliseconds < 0 { problems.append("sse.retry_ms: must not be negative") }
    if sse.maxConnectionAgeSeconds < 0 {
      problems.append("sse.max_connection_age_seconds: must not be negative (0 disables)")
    }
    if sse.maxConnectionAgeJitterSeconds < 0 {
      problems.append("sse.max_connection_age_jitter_seconds: must not be negative")
    }
    if server.shutdownSpreadSeconds < 0 { problems.append("server.shutdown_spread_seconds: must not be negative") }
    if !(server.shutdownDeadlineSeconds > server.shutdownSpreadSeconds) {
      problems.append(
        "server.shutdown_deadline_seconds: must exceed server.shutdown_spread_seconds (\(server.shutdownSpreadSeconds))"
      )
    }
    if ring.maxAgeSeconds < 0 { problems.append("ring.max_age_seconds: must not be negative (0 disables)") }
    if cors.maxAgeSeconds < 0 { problems.append("cors.max_age_seconds: must not be negative") }
    for origin in cors.allowedOrigins where origin != "*" {
      if !(origin.hasPrefix("http://") || origin.hasPrefix("https://")) || origin.hasSuffix("/") {
        problems.append("cors.allowed_origins: \"\(origin)\" is not an origin like https://example.com")
      }
    }
    if cors.allowCredentials && cors.allowedOrigins.contains("*") {
      problems.append("cors.allow_credentials: cannot be true while cors.allowed_origins contains \"*\"")
    }
    if Logger.Level(name: log.level) == nil {
      problems.append(
        "log.level: \"\(log.level)\" is not one of \(Logger.Level.allCases.map(\.name).joined(separator: ", "))")
    }
    if Logger.Format(rawValue: log.format) == nil {
      problems.append("log.format: \"\(log.format)\" is not logfmt or json")
    }
    if server.maxConnections < 0 { problems.append("server.max_connections: must not be negative (0: automatic)") }
    if server.maxConnectionsPerAddress < 0 {
      problems.append("server.max_connections_per_address: must not be negative (0: no limit)")
    }
    if server.maxConnectionsPerSubject < 0 {
      problems.append("server.max_connections_per_subject: must not be negative (0: no limit)")
    }
    for proxy in server.trustedProxies where AddressBlock(proxy) == nil {
      problems.append("server.trusted_proxies: \"\(proxy)\" is not an IP address or CIDR block")
    }
    problems += authProblems()
    problems += upstreamProblems()
    problems += storeProblems()
    return problems
  }
}

extension Configuration {
  /// Whether an upstream is configured (the relay can also run with only in-process sources).
  public var hasUpstream: Bool {
    adapterKind == .generic ? !generic.urlTemplate.isEmpty : !upstream.url.isEmpty
  }

  func upstreamProblems() -> [String] {
    var problems: [String] = []
    func isHTTP(_ url: String) -> Bool { url.hasPrefix("http://") || url.hasPrefix("https://") }
    switch adapterKind {
    case .chat:
      if !upstream.url.isEmpty && !isHTTP(upstream.url) {
        problems.append("upstream.url: \"\(redactURL(upstream.url))\" must start with http:// or https://")
      }
      if let problem = OutgoingRequest.problem(inURL: upstream.url) { problems.append("upstream.url: \(problem)") }
    case .generic:
      if !generic.urlTemplate.isEmpty && !isHTTP(generic.urlTemplate) {
        problems.append(
          "generic.url_template: \"\(redactURL(generic.urlTemplate))\" must start with http:// or https://")
      }
      for (key, pointer) in [
        ("generic.events_pointer", generic.eventsPointer), ("generic.id_pointer", generic.idPointer),
      ]
      where !pointer.isEmpty && !pointer.hasPrefix("/") {
        problems.append("\(key): \"\(pointer)\" is not an RFC 6901 pointer (empty, or starting with /)")
      }
      for header in generic.headers {
        if case .failure(let error) = OutgoingRequest.header(line: header) {
          problems.append("generic.headers: \(error.message)")
        }
      }
      if let problem = OutgoingRequest.problem(inURL: generic.urlTemplate) {
        problems.append("generic.url_template: \(problem)")
      }
      if generic.stream.isEmpty { problems.append("generic.stream: must not be empty") }
      if !generic.initialCursor.isEmpty && ResumeDecision.parseEventID(generic.initialCursor) == nil {
        problems.append("generic.initial_cursor: \"\(generic.initialCursor)\" is not an unsigned integer")
      }
      if !(generic.timeoutSeconds > 0) { problems.append("generic.timeout_seconds: must be greater than 0") }
    case nil:
      problems.append("upstream.adapter: \"\(upstream.adapter)\" is not chat or generic")
    }
    if UpstreamWorker.StartFrom(rawValue: upstream.startFrom) == nil {
      problems.append("upstream.start_from: \"\(upstream.startFrom)\" is not latest or earliest")
    }
    for (key, value) in [
      ("upstream.poll_timeout_seconds", upstream.pollTimeoutSeconds),
      ("upstream.request_timeout_seconds", upstream.requestTimeoutSeconds),
      ("upstream.connect_timeout_seconds", upstream.connectTimeoutSeconds),
      ("upstream.backoff_cap_seconds", upstream.backoffCapSeconds),
      ("upstream.ready_window_seconds", upstream.readyWindowSeconds),
      ("upstream.resync_interval_seconds", upstream.resyncIntervalSeconds),
    ] where !(value > 0) {
      problems.append("\(key): must be greater than 0")
    }
    for (key, value) in [
      ("upstream.min_poll_interval_seconds", upstream.minPollIntervalSeconds),
      ("upstream.request_margin_seconds", upstream.requestMarginSeconds),
      ("upstream.backoff_base_seconds", upstream.backoffBaseSeconds),
      ("upstream.idle_after_seconds", upstream.idleAfterSeconds),
    ] where !(value >= 0) {
      problems.append("\(key): must not be negative")
    }
    if upstream.backoffBaseSeconds > upstream.backoffCapSeconds {
      problems.append("upstream.backoff_base_seconds: must not exceed upstream.backoff_cap_seconds")
    }
    if upstream.maxBodyBytes <= 0 { problems.append("upstream.max_body_bytes: must be greater than 0") }
    return problems
  }

  /// This configuration with secrets replaced, for `--print-config` and logs.
  public var redacted: Configuration {
    var copy = self
    if !copy.upstream.apiKey.isEmpty { copy.upstream.apiKey = "[redacted]" }
    copy.upstream.url = redactURL(copy.upstream.url)
    copy.store.redisURL = redactURL(copy.store.redisURL)
    copy.generic.urlTemplate = redactURL(copy.generic.urlTemplate)
    copy.generic.headers = copy.generic.headers.map { header in
      guard let colon = header.firstIndex(of: ":") else { return header }
      return String(header[...colon]) + " [redacted]"
    }
    return copy
  }
}

/// `HOST:PORT` or `[IPv6]:PORT`.
public struct ListenAddress: Equatable, Sendable {
  public var host: String
  public var port: Int

  public static func parse(_ text: String) throws(ConfigurationError) -> ListenAddress {
    let host: Substring
    let portText: Substring
    if text.hasPrefix("[") {
      guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
        throw ConfigurationError("\"\(text)\" is not [IPv6]:PORT")
      }
      host = text[text.index(after: text.startIndex)..<close]
      portText = text[text.index(close, offsetBy: 2)...]
    } else {
      guard let colon = text.lastIndex(of: ":") else { throw ConfigurationError("\"\(text)\" is not HOST:PORT") }
      host = text[..<colon]
      portText = text[text.index(after: colon)...]
    }
    guard !host.isEmpty else { throw ConfigurationError("\"\(text)\" has no host") }
    guard let port = Int(portText), (0...65535).contains(port) else {
      throw ConfigurationError("\"\(text)\" has no valid port (0-65535; 0 picks a free one)")
    }
    return ListenAddress(host: String(host), port: port)
  }
}

/// A configuration value or file is not usable.
public struct ConfigurationError: Error, CustomStringConvertible, Sendable, Equatable {
  public var problems: [String]
  public init(_ problem: String) { problems = [problem] }
  public init(problems: [String]) { self.problems = problems }
  public var description: String { problems.joined(separator: "\n") }
}

/// `auth.mode`: who may read what.
public enum AuthMode: String, CaseIterable, Sendable { case none, jwt, upstream }
/// `store.kind`: where rings, ids and cursors live.
public enum StoreKind: String, CaseIterable, Sendable { case memory, sqlite, redis }
/// `upstream.adapter`: the legacy API's shape.
public enum AdapterKind: String, CaseIterable, Sendable { case chat, generic }

extension Configuration {
  /// The typed mode, kind and adapter (nil: not one of them; `problems()` names it). The file, environment and
  /// flags carry them as text; code branches on these.
  public var authMode: AuthMode? { AuthMode(rawValue: auth.mode) }
  public var storeKind: StoreKind? { StoreKind(rawValue: store.kind) }
  public var adapterKind: AdapterKind? { AdapterKind(rawValue: upstream.adapter) }

  func storeProblems() -> [String] {
    var problems: [String] = []
    switch storeKind {
    case .memory:
      break
    case .sqlite:
      if store.path.isEmpty {
        problems.append("store.path: store.kind sqlite needs a file path (--store-path /var/lib/pollcast/pollcast.db)")
      }
    case .redis:
      if case .failure(let problem) = RedisAddress.parse(store.redisURL) {
        problems.append("store.redis_url: \(problem)")
      }
      if store.redisPrefix.isEmpty || store.redisPrefix.contains(where: { "{} ".contains($0) }) {
        problems.append("store.redis_prefix: \"\(store.redisPrefix)\" must be non-empty, without braces or spaces")
      }
      if !(0.2...600).contains(store.leaseSeconds) {
        problems.append("store.lease_seconds: \(store.leaseSeconds) is not within 0.2-600")
      }
      if upstream.idleAfterSeconds > 0 && authMode != .upstream {
        // Per-user relaying: it is each account's grace on each node, which goes by that node's subscribers.
        problems.append(
          "upstream.idle_after_seconds: with store.kind redis the leader polls for every node's subscribers and"
            + " cannot idle on its own count; set it to 0")
      }
    case nil:
      problems.append("store.kind: \"\(store.kind)\" is not memory, sqlite or redis")
    }
    if SQLiteEventStore.Synchronous(rawValue: store.synchronous) == nil {
      problems.append("store.synchronous: \"\(store.synchronous)\" is not normal or full")
    }
    return problems
  }

  /// Who fills the feeds, as a store records it: the adapter and the API's URL (scheme, host, port, path; no
  /// userinfo, secret query values redacted), so a store filled from one API is never served for another. The
  /// embedded demo fixture is one source whatever port it got.
  public var sourceIdentity: String {
    if isDemo { return "\(upstream.adapter) embedded demo fixture" }
    let url = adapterKind == .generic ? generic.urlTemplate : upstream.url
    return "\(upstream.adapter) \(identityURL(url))"
  }

  func authProblems() -> [String] {
    var problems: [String] = []
    if CredentialCharset(rawValue: auth.credentialCharset) == nil {
      problems.append("auth.credential_charset: \"\(auth.credentialCharset)\" is not b64token or visible")
    }
    if let problem = OutgoingRequest.problem(inHeaderValue: upstream.apiKey, "upstream.api_key") {
      problems.append("upstream.api_key: \(problem)")
    }
    if auth.cookieName.isEmpty || auth.cookieName.contains(where: { " ;=,\t\"".contains($0) }) {
      problems.append("auth.cookie_name: \"\(auth.cookieName)\" is not a cookie name")
    }
    if auth.maxFailuresPerMinute < 0 { problems.append("auth.max_failures_per_minute: must not be negative") }
    switch authMode {
    case .none?:
      break
    case .jwt:
      if JWTVerifier.Algorithm(rawValue: auth.jwt.algorithm) == nil {
        problems.append("auth.jwt.algorithm: \"\(auth.jwt.algorithm)\" is not HS256, RS256 or ES256")
      }
      if auth.jwt.keyFile.isEmpty && auth.jwt.keysDirectory.isEmpty {
        problems.append("auth.jwt.key_file: auth.mode jwt needs a key file or auth.jwt.keys_directory")
      }
      if !(auth.jwt.leewaySeconds >= 0 && auth.jwt.leewaySeconds <= 600) {
        problems.append("auth.jwt.leeway_seconds: must be between 0 and 600")
      }
    case .upstream:
      if adapterKind == .generic && !generic.urlTemplate.isEmpty
        && !GenericAdapter.usesCredential(genericSettings)
      {
        problems.append(
          "generic.headers: auth.mode upstream needs the subscriber's key in a request: put {credential} in a"
            + " header (\"Authorization: Bearer {credential}\") or in generic.url_template")
      }
      if !(auth.credentialCacheSeconds >= 1 && auth.credentialCacheSeconds <= 3600) {
        problems.append("auth.credential_cache_seconds: must be between 1 and 3600")
      }
      if upstream.maxAccounts < 1 { problems.append("upstream.max_accounts: must be at least 1") }
      if upstream.maxRetainedAccounts < upstream.maxAccounts {
        problems.append("upstream.max_retained_accounts: must be at least upstream.max_accounts")
      }
      if upstream.maxTotalRingBytes < 1 { problems.append("upstream.max_total_ring_bytes: must be at least 1") }
    case nil:
      problems.append("auth.mode: \"\(auth.mode)\" is not none, jwt or upstream")
    }
    return problems
  }

}
