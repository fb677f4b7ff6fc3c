/// Settings of the downstream HTTP server, from configuration.
public struct ServerSettings: Sendable, Equatable {
  public var host: String
  /// 0 picks a free port.
  public var port: Int
  /// Largest request line plus headers evhttp accepts (larger: 400/413 from evhttp).
  public var maxHeaderBytes: Int
  /// Longest request target accepted (longer: 414).
  public var maxURLBytes: Int
  /// Largest request body accepted.
  public var maxBodyBytes: Int
  /// evhttp's read/write timeout for requests and keep-alive connections, in seconds. A stream has no read
  /// timeout (its client sends nothing after the request); this bounds only how long its queued bytes may wait for
  /// a peer that stopped reading.
  public var timeout: Double
  /// listen(2) backlog.
  public var backlog: Int
  /// A connection must complete its first request within this many seconds (slowloris guard).
  public var headerTimeout: Double
  /// Descriptors kept free for health checks, metrics and the upstream: a new stream whose connection's
  /// descriptor falls inside the reserve (above the soft limit minus this) is refused with 503.
  public var descriptorReserve: Int
  public var cors: CORSPolicy
  /// Who may read what, and how many streams each may hold.
  public var access: AccessSettings
  /// How often the loop's lag probe runs, in seconds (`LoopLagProbe`).
  public var loopProbeInterval = 0.5

  public init(
    host: String = "127.0.0.1", port: Int = 8080, maxHeaderBytes: Int = 16 << 10, maxURLBytes: Int = 12 << 10,
    maxBodyBytes: Int = 64 << 10, timeout: Double = 60, backlog: Int = 4096, headerTimeout: Double = 10,
    descriptorReserve: Int = 64, cors: CORSPolicy = CORSPolicy(), access: AccessSettings = AccessSettings()
  ) {
    self.access = access
    self.headerTimeout = headerTimeout
    self.descriptorReserve = descriptorReserve
    self.host = host
    self.port = port
    self.maxHeaderBytes = maxHeaderBytes
    self.maxURLBytes = maxURLBytes
    self.maxBodyBytes = maxBodyBytes
    self.timeout = timeout
    self.backlog = backlog
    self.cors = cors
  }
}

/// Authentication and admission for `/events`.
public struct AccessSettings: Sendable, Equatable {
  /// nil: `auth.mode = none`.
  public var jwt: JWTSettings?
  public var cookieName: String
  public var allowQueryToken: Bool
  /// `maxConnections` 0 here means automatic (from the descriptor limit, at start).
  public var admission: Admission.Limits
  public var trustedProxies: [AddressBlock]
  /// `auth.mode = upstream`: each subscriber presents its own legacy key.
  public var perUser = false
  /// What a credential may hold (`auth.credential_charset`).
  public var credentialCharset = CredentialCharset.b64token

  public init(
    jwt: JWTSettings? = nil, cookieName: String = "pollcast_token", allowQueryToken: Bool = false,
    admission: Admission.Limits = .init(), trustedProxies: [AddressBlock] = []
  ) {
    self.jwt = jwt
    self.cookieName = cookieName
    self.allowQueryToken = allowQueryToken
    self.admission = admission
    self.trustedProxies = trustedProxies
  }

  public var mode: String { perUser ? "upstream" : jwt == nil ? "none" : "jwt" }
}
