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
    public var loopProbeMilliseconds = 500

    enum CodingKeys: String, CodingKey {
      case listen, backlog
      case loopProbeMilliseconds = "loop_probe_ms"
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
    /// `upstream.adapter = recipe`: a file path, or the recipe's JSON text (starts with `{`).
    public var recipe = ""
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
    /// Hosts beyond those the recipe writes that a URL from an answer may name.
    public var allowedHosts: [String] = []
    /// Per-user relaying: accounts polling at once, accounts kept for resumes, ring bytes over all accounts.
    public var maxAccounts = 10_000
    public var maxRetainedAccounts = 50_000
    public var maxTotalRingBytes = 256 << 20

    enum CodingKeys: String, CodingKey {
      case adapter, url, recipe
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
      case allowedHosts = "allowed_hosts"
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
  /// The recipe read and parsed at load (`upstream.adapter = recipe`; not a file key).
  public var loadedRecipe = LoadedRecipe()

  enum CodingKeys: String, CodingKey {
    case server, store, auth, cors, sse, ring, log, upstream, generic
  }

  public init() {}
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
        throw ConfigurationError("\(Setting.shown(text)) is not [IPv6]:PORT")
      }
      host = text[text.index(after: text.startIndex)..<close]
      portText = text[text.index(close, offsetBy: 2)...]
    } else {
      guard let colon = text.lastIndex(of: ":") else {
        throw ConfigurationError("\(Setting.shown(text)) is not HOST:PORT")
      }
      host = text[..<colon]
      portText = text[text.index(after: colon)...]
    }
    guard !host.isEmpty else { throw ConfigurationError("\(Setting.shown(text)) has no host") }
    guard let port = Int(portText), (0...65535).contains(port) else {
      throw ConfigurationError("\(Setting.shown(text)) has no valid port (0-65535; 0 picks a free one)")
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
public enum AdapterKind: String, CaseIterable, Sendable { case chat, generic, recipe }

/// `upstream.recipe` as loaded: its text, the environment its `{env:…}` placeholders read, and the parsed recipe
/// (or the problems that kept it from parsing). Equal when text and environment are.
public struct LoadedRecipe: Sendable, Equatable {
  public var text = ""
  public var environment: [String: String] = [:]
  public var recipe: Recipe? { didSet { storage = recipe.map(RecipeStorage.init) } }
  /// The recipe held once for every account's adapter (per-user relaying makes thousands).
  public private(set) var storage: RecipeStorage?
  public var problems: [String] = []

  public init() {}

  public static func == (a: LoadedRecipe, b: LoadedRecipe) -> Bool {
    a.text == b.text && a.environment == b.environment && a.problems == b.problems
  }
}
