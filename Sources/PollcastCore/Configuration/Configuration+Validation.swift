import Foundation

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
    if !(1...60_000).contains(server.loopProbeMilliseconds) {
      problems.append("server.loop_probe_ms: must be between 1 and 60000 (got \(server.loopProbeMilliseconds))")
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
        problems.append("cors.allowed_origins: \(Setting.shown(origin)) is not an origin like https://example.com")
      }
    }
    if cors.allowCredentials && cors.allowedOrigins.contains("*") {
      problems.append("cors.allow_credentials: cannot be true while cors.allowed_origins contains \"*\"")
    }
    if Logger.Level(name: log.level) == nil {
      problems.append(
        "log.level: \(Setting.shown(log.level)) is not one of \(Logger.Level.allCases.map(\.name).joined(separator: ", "))"
      )
    }
    if Logger.Format(rawValue: log.format) == nil {
      problems.append("log.format: \(Setting.shown(log.format)) is not logfmt or json")
    }
    if server.maxConnections < 0 { problems.append("server.max_connections: must not be negative (0: automatic)") }
    if server.maxConnectionsPerAddress < 0 {
      problems.append("server.max_connections_per_address: must not be negative (0: no limit)")
    }
    if server.maxConnectionsPerSubject < 0 {
      problems.append("server.max_connections_per_subject: must not be negative (0: no limit)")
    }
    for proxy in server.trustedProxies where AddressBlock(proxy) == nil {
      problems.append("server.trusted_proxies: \(Setting.shown(proxy)) is not an IP address or CIDR block")
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
    switch adapterKind {
    case .generic: !generic.urlTemplate.isEmpty
    case .recipe: !upstream.recipe.isEmpty
    default: !upstream.url.isEmpty
    }
  }

  /// Reads `upstream.recipe` (a file, or inline JSON) and parses it against `environment`.
  public mutating func loadRecipe(environment: [String: String]) {
    var loaded = LoadedRecipe()
    loaded.environment = environment
    let source = upstream.recipe.trimmingCharacters(in: .whitespacesAndNewlines)
    if source.isEmpty {
      loaded.problems = ["upstream.recipe: upstream.adapter recipe needs a recipe (a file path or an object)"]
    } else if source.hasPrefix("{") {
      loaded.text = source
    } else if let data = FileManager.default.contents(atPath: source) {
      loaded.text = String(decoding: data, as: UTF8.self)
    } else {
      loaded.problems = ["upstream.recipe: cannot read the recipe file \(source)"]
    }
    if loaded.problems.isEmpty {
      let context = Recipe.Context(
        environment: environment, hasCredential: authMode == .upstream || !upstream.apiKey.isEmpty)
      switch Recipe.parse(loaded.text, context: context) {
      case .success(var recipe):
        recipe.configuredHosts = upstream.allowedHosts
        loaded.recipe = recipe
        if authMode == .upstream && !recipe.usesCredential {
          loaded.problems.append(
            "recipe: auth.mode upstream needs the subscriber's key in a request: put {credential} in a header"
              + " (\"Authorization\": \"Bearer {credential}\"), the query or the URL")
        }
        if authMode == .upstream, let problem = recipe.userBindingProblem { loaded.problems.append(problem) }
      case .failure(let error): loaded.problems = error.problems
      }
    }
    loadedRecipe = loaded
  }

  func upstreamProblems() -> [String] {
    var problems: [String] = []
    func isHTTP(_ url: String) -> Bool { url.hasPrefix("http://") || url.hasPrefix("https://") }
    switch adapterKind {
    case .chat:
      if !upstream.url.isEmpty && !isHTTP(upstream.url) {
        problems.append("upstream.url: \(Setting.shown(redactURL(upstream.url))) must start with http:// or https://")
      }
      if let problem = OutgoingRequest.problem(inURL: upstream.url) { problems.append("upstream.url: \(problem)") }
    case .generic:
      if !generic.urlTemplate.isEmpty && !isHTTP(generic.urlTemplate) {
        problems.append(
          "generic.url_template: \(Setting.shown(redactURL(generic.urlTemplate))) must start with http:// or https://")
      }
      for (key, pointer) in [
        ("generic.events_pointer", generic.eventsPointer), ("generic.id_pointer", generic.idPointer),
      ]
      where !pointer.isEmpty && !pointer.hasPrefix("/") {
        problems.append("\(key): \(Setting.shown(pointer)) is not an RFC 6901 pointer (empty, or starting with /)")
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
        problems.append("generic.initial_cursor: \(Setting.shown(generic.initialCursor)) is not an unsigned integer")
      }
      if !(generic.timeoutSeconds > 0) { problems.append("generic.timeout_seconds: must be greater than 0") }
    case .recipe:
      problems += loadedRecipe.problems
    case nil:
      problems.append("upstream.adapter: \(Setting.shown(upstream.adapter)) is not chat, generic or recipe")
    }
    if UpstreamWorker.StartFrom(rawValue: upstream.startFrom) == nil {
      problems.append("upstream.start_from: \(Setting.shown(upstream.startFrom)) is not latest or earliest")
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
    for entry in upstream.allowedHosts {
      if let problem = AllowedHosts.problem(inEntry: entry) { problems.append("upstream.allowed_hosts: \(problem)") }
    }
    return problems
  }

  /// This configuration with secrets replaced, for `--print-config` and logs.
  public var redacted: Configuration {
    var copy = self
    if !copy.upstream.apiKey.isEmpty { copy.upstream.apiKey = "[redacted]" }
    copy.upstream.url = redactURL(copy.upstream.url)
    copy.store.redisURL = redactURL(copy.store.redisURL)
    copy.generic.urlTemplate = redactURL(copy.generic.urlTemplate)
    if copy.upstream.recipe.hasPrefix("{") {
      // An inline recipe may hold a token in a header or a var: its text is not shown.
      copy.upstream.recipe = "[inline recipe, \(copy.upstream.recipe.utf8.count) bytes, not shown]"
    }
    copy.generic.headers = copy.generic.headers.map { header in
      guard let colon = header.firstIndex(of: ":") else { return header }
      return String(header[...colon]) + " [redacted]"
    }
    return copy
  }
}

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
        problems.append(
          "store.redis_prefix: \(Setting.shown(store.redisPrefix)) must be non-empty, without braces or spaces")
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
      problems.append("store.kind: \(Setting.shown(store.kind)) is not memory, sqlite or redis")
    }
    if SQLiteEventStore.Synchronous(rawValue: store.synchronous) == nil {
      problems.append("store.synchronous: \(Setting.shown(store.synchronous)) is not normal or full")
    }
    return problems
  }

  /// Who fills the feeds, as a store records it: the adapter and the API's URL (scheme, host, port, path; no
  /// userinfo, secret query values redacted), so a store filled from one API is never served for another. The
  /// embedded demo fixture is one source whatever port it got.
  public var sourceIdentity: String {
    if isDemo { return "\(upstream.adapter) embedded demo fixture" }
    if adapterKind == .recipe, let recipe = loadedRecipe.recipe {
      return "recipe \(recipe.name) \(identityURL(recipe.identityURL))"
    }
    let url = adapterKind == .generic ? generic.urlTemplate : upstream.url
    return "\(upstream.adapter) \(identityURL(url))"
  }

  func authProblems() -> [String] {
    var problems: [String] = []
    if CredentialCharset(rawValue: auth.credentialCharset) == nil {
      problems.append("auth.credential_charset: \(Setting.shown(auth.credentialCharset)) is not b64token or visible")
    }
    if let problem = OutgoingRequest.problem(inHeaderValue: upstream.apiKey, "upstream.api_key") {
      problems.append("upstream.api_key: \(problem)")
    }
    if auth.cookieName.isEmpty || auth.cookieName.contains(where: { " ;=,\t\"".contains($0) }) {
      problems.append("auth.cookie_name: \(Setting.shown(auth.cookieName)) is not a cookie name")
    }
    if auth.maxFailuresPerMinute < 0 { problems.append("auth.max_failures_per_minute: must not be negative") }
    switch authMode {
    case .none?:
      break
    case .jwt:
      if JWTVerifier.Algorithm(rawValue: auth.jwt.algorithm) == nil {
        problems.append("auth.jwt.algorithm: \(Setting.shown(auth.jwt.algorithm)) is not HS256, RS256 or ES256")
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
      problems.append("auth.mode: \(Setting.shown(auth.mode)) is not none, jwt or upstream")
    }
    return problems
  }

}
