import Foundation

/// The assembly of a relay from a validated configuration: the settings of every part, the adapters, the store.
/// Configuration/ stays data and its validation; what turns it into running parts lives here, beside
/// `Relay.start(configuration:)`.
extension Configuration {
  /// The server settings this configuration describes (call after `validate()` passed); `access.jwt` is filled
  /// by `jwtSettings()`, which reads the key files.
  public var serverSettings: ServerSettings {
    let address = (try? ListenAddress.parse(server.listen)) ?? ListenAddress(host: "127.0.0.1", port: 8080)
    var settings = ServerSettings(
      host: address.host, port: address.port, maxHeaderBytes: server.maxHeaderBytes, maxURLBytes: server.maxURLBytes,
      maxBodyBytes: server.maxBodyBytes, timeout: server.timeoutSeconds, backlog: server.backlog,
      headerTimeout: server.headerTimeoutSeconds, descriptorReserve: server.descriptorReserve,
      cors: CORSPolicy(
        allowedOrigins: cors.allowedOrigins, allowCredentials: cors.allowCredentials, maxAge: cors.maxAgeSeconds),
      access: AccessSettings(
        jwt: nil, cookieName: auth.cookieName, allowQueryToken: auth.allowQueryToken,
        admission: Admission.Limits(
          maxConnections: server.maxConnections, maxPerAddress: server.maxConnectionsPerAddress,
          maxPerSubject: server.maxConnectionsPerSubject, maxFailuresPerMinute: auth.maxFailuresPerMinute),
        trustedProxies: server.trustedProxies.compactMap(AddressBlock.init)))
    settings.access.perUser = authMode == .upstream
    settings.loopProbeInterval = Double(server.loopProbeMilliseconds) / 1000
    settings.access.credentialCharset = CredentialCharset(rawValue: auth.credentialCharset) ?? .b64token
    return settings
  }

  public var feedSettings: FeedSettings {
    FeedSettings(
      ring: .init(
        maxEvents: ring.maxEvents, maxBytes: ring.maxBytes, maxAge: ring.maxAgeSeconds > 0 ? ring.maxAgeSeconds : nil),
      maxPendingBytes: sse.maxPendingBytes, heartbeatInterval: sse.heartbeatSeconds,
      retryMilliseconds: sse.retryMilliseconds, replayChunkBytes: sse.replayChunkBytes,
      maxConnectionAge: sse.maxConnectionAgeSeconds > 0 ? sse.maxConnectionAgeSeconds : nil,
      maxConnectionAgeJitter: sse.maxConnectionAgeJitterSeconds)
  }

  public var workerSettings: UpstreamWorker.Settings {
    var settings = UpstreamWorker.Settings()
    settings.startFrom = UpstreamWorker.StartFrom(rawValue: upstream.startFrom) ?? .latest
    settings.backoff = Backoff(base: upstream.backoffBaseSeconds, cap: upstream.backoffCapSeconds)
    settings.idleAfter = upstream.idleAfterSeconds > 0 ? upstream.idleAfterSeconds : nil
    settings.readyWindow = upstream.readyWindowSeconds
    settings.resyncInterval = upstream.resyncIntervalSeconds
    settings.minPollInterval = upstream.minPollIntervalSeconds
    return settings
  }

  var genericSettings: GenericAdapter.Settings {
    .init(
      urlTemplate: generic.urlTemplate, eventsPointer: generic.eventsPointer, idPointer: generic.idPointer,
      headers: generic.headers, stream: generic.stream, timeout: generic.timeoutSeconds,
      connectTimeout: upstream.connectTimeoutSeconds,
      initialCursor: ResumeDecision.parseEventID(generic.initialCursor) ?? 0)
  }

  /// The adapter this configuration names; with `credential` (per-user relaying), one that sends that key.
  public func makeAdapter(credential: String? = nil) -> UpstreamAdapter {
    if adapterKind == .generic {
      return GenericAdapter(settings: genericSettings, credential: credential)
    }
    if adapterKind == .recipe, let storage = loadedRecipe.storage {
      return RecipeAdapter(
        storage: storage, environment: loadedRecipe.environment,
        credential: credential ?? (upstream.apiKey.isEmpty ? nil : upstream.apiKey),
        pollTimeout: upstream.pollTimeoutSeconds + upstream.requestMarginSeconds,
        requestTimeout: upstream.requestTimeoutSeconds, connectTimeout: upstream.connectTimeoutSeconds)
    }
    return ChatAdapter(
      baseURL: upstream.url, holdSeconds: upstream.pollTimeoutSeconds, marginSeconds: upstream.requestMarginSeconds,
      requestTimeout: upstream.requestTimeoutSeconds, connectTimeout: upstream.connectTimeoutSeconds,
      credential: credential ?? (upstream.apiKey.isEmpty ? nil : upstream.apiKey))
  }

  /// Per-user relaying's bounds and timings (`auth.mode = upstream`).
  public var accountSettings: AccountHub.Settings {
    var settings = AccountHub.Settings()
    settings.maxActiveAccounts = upstream.maxAccounts
    settings.maxRetainedAccounts = upstream.maxRetainedAccounts
    settings.maxTotalRingBytes = upstream.maxTotalRingBytes
    settings.grace = upstream.idleAfterSeconds > 0 ? upstream.idleAfterSeconds : 30
    settings.credentialCacheSeconds = auth.credentialCacheSeconds
    return settings
  }

  /// Opens the store this configuration names (reading and checking a sqlite file).
  public func openStore(logger: Logger) throws(StoreError) -> EventStore {
    if storeKind == .redis, case .success(let address) = RedisAddress.parse(store.redisURL) {
      return RedisEventStore(
        address: address, prefix: store.redisPrefix, nodeID: store.nodeID.isEmpty ? nil : store.nodeID,
        commandTimeout: max(1, store.leaseSeconds), source: sourceIdentity, logger: logger)
    }
    guard storeKind == .sqlite else { return MemoryEventStore() }
    return try SQLiteEventStore.open(
      path: store.path, synchronous: SQLiteEventStore.Synchronous(rawValue: store.synchronous) ?? .normal,
      resetIfCorrupt: store.resetIfCorrupt, source: sourceIdentity, resetOnSourceChange: store.resetOnSourceChange,
      logger: logger)
  }

  /// What `auth.mode = jwt` verifies with, its key files read (call after `validate()` passed).
  public func jwtSettings() throws(ConfigurationError) -> JWTSettings? {
    guard authMode == .jwt, let algorithm = JWTVerifier.Algorithm(rawValue: auth.jwt.algorithm) else { return nil }
    return try JWTSettings.load(
      algorithm: algorithm, keyFile: auth.jwt.keyFile, keysDirectory: auth.jwt.keysDirectory,
      audience: auth.jwt.audience.isEmpty ? nil : auth.jwt.audience, leeway: auth.jwt.leewaySeconds)
  }
}
