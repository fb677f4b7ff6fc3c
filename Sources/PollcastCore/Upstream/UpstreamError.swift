import Foundation

/// Why an upstream call failed. Every failure of the transport, the HTTP exchange or the body's shape maps to
/// one of these kinds; `message` says what happened, `cause` carries the underlying library's words.
public struct UpstreamError: Error, CustomStringConvertible, Sendable, Equatable {
  public enum Kind: Sendable, Equatable {
    /// Could not connect, connection reset, TLS failure, …
    case transport
    /// The request did not complete within its deadline.
    case timeout
    /// The server answered with a status that is not success.
    case status(Int)
    /// The body is not what the API promises (not JSON, wrong shape, too large).
    case decoding
    /// The session token was refused (401): start a new session.
    case sessionExpired
    /// The request was cancelled by a stop or restart; not a failure.
    case cancelled
    /// The request was refused before it left: a control byte in its method, URL or a header (`OutgoingRequest`).
    case unsafeRequest
    /// The subscriber's key cannot be placed in a request without changing what is asked (a dot segment or an empty
    /// segment in a URL path): the key is refused like one the API refused, and nothing is sent.
    case invalidCredential
  }

  public var kind: Kind
  public var message: String
  public var cause: String?
  /// Seconds the server asked the relay to wait before its next request (`Retry-After`, a recipe's `after`);
  /// the worker waits that long instead of its own backoff delay (bounded by `UpstreamError.maxRetryAfter`).
  public var retryAfter: Double?

  public init(_ kind: Kind, _ message: String, cause: String? = nil, retryAfter: Double? = nil) {
    self.kind = kind
    self.message = message
    self.cause = cause
    self.retryAfter = retryAfter
  }

  /// A server-given delay longer than this is cut to it: a broken header must not silence a feed for days.
  public static let maxRetryAfter = 3600.0

  /// Whether the error says the key (the API key, or a subscriber's) is refused: a 401, a 403 where the relay stops
  /// on refused keys, or a key that cannot be placed in a request at all.
  func refusesKey(stopWhenRefused: Bool) -> Bool {
    switch kind {
    case .status(401), .invalidCredential: true
    case .status(403): stopWhenRefused
    default: false
    }
  }

  public var description: String {
    cause.map { "\(message): \($0)" } ?? message
  }

  /// The outcome label used in metrics and logs.
  public var outcome: String {
    switch kind {
    case .transport: "transport_error"
    case .timeout: "timeout"
    case .status: "http_error"
    case .decoding: "decoding_error"
    case .sessionExpired: "session_expired"
    case .cancelled: "cancelled"
    case .unsafeRequest: "unsafe_request"
    case .invalidCredential: "invalid_credential"
    }
  }
}

/// One HTTP request to the legacy API.
public struct UpstreamRequest: Sendable {
  public enum Authentication: Sendable { case none, apiKey }

  public var method: String
  public var url: String
  public var headers: [(String, String)]
  public var body: [UInt8]?
  /// Total deadline in seconds (for a poll: the server's hold time plus a margin).
  public var timeout: Double
  public var connectTimeout: Double
  /// What the auth interceptor adds.
  public var authentication: Authentication
  /// Short name for logs and metrics: `session`, `last`, `poll`.
  public var label: String
  /// The response headers wanted in `UpstreamResponse.headers` (nil: none; empty: all). Naming them reads only
  /// those from libcurl: a poll whose answer has none of them allocates nothing for headers.
  public var wantedHeaders: [String]?
  /// Values never shown in a log line about this request (a session token in a URL path).
  public var redact: [String] = []
  /// libcurl closes the connection after this request instead of keeping it for reuse: set when the kept-alive
  /// connection takes the next request (`UpstreamClient`), which would leave libcurl's idle, one per account.
  var closesConnection = false

  public init(
    method: String = "GET", url: String, headers: [(String, String)] = [], body: [UInt8]? = nil, timeout: Double = 10,
    connectTimeout: Double = 5, authentication: Authentication = .none, label: String
  ) {
    self.method = method
    self.url = url
    self.headers = headers
    self.body = body
    self.timeout = timeout
    self.connectTimeout = connectTimeout
    self.authentication = authentication
    self.label = label
  }
}

/// A completed HTTP exchange (any status).
public struct UpstreamResponse: Sendable {
  public var status: Int
  public var body: [UInt8]
  /// Seconds from start to completion.
  public var duration: Double
  /// The final answer's header fields in order (only when the request `wantsHeaders`).
  public var headers: [(name: String, value: String)]
  /// The IP address the answer came from, when libcurl made the request (`CURLINFO_PRIMARY_IP`): how a name in the
  /// URL is polled over the kept-alive connection afterwards (`UpstreamClient`).
  public var peerAddress: String?

  public init(
    status: Int, body: [UInt8], duration: Double, headers: [(name: String, value: String)] = [],
    peerAddress: String? = nil
  ) {
    self.status = status
    self.body = body
    self.duration = duration
    self.headers = headers
    self.peerAddress = peerAddress
  }

  /// The value of the last header field named `name` (case-insensitive), if any.
  public func header(_ name: String) -> String? {
    headers.last { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
  }

  /// The body as text, with every invalid UTF-8 sequence replaced by U+FFFD (see `RepairedText`).
  public func text() -> RepairedText { RepairedText(body) }
}

/// Text decoded from bytes that should be UTF-8. A legacy API sometimes stores bytes that are not (a truncated
/// multi-byte character, Latin-1 from an old import): rejecting the whole answer for one such message would stall
/// the stream forever, since the cursor could never move past it. Each invalid sequence becomes U+FFFD, and the
/// byte offsets of those replacements are kept so the messages that contain them can be counted and logged.
public struct RepairedText: Sendable {
  public let text: String
  /// UTF-8 offsets in `text` where a U+FFFD replaced invalid input, ascending.
  public let repairs: [Int]

  public init(_ bytes: [UInt8]) {
    // Valid UTF-8 decodes to exactly its own bytes, and a repair never does (U+FFFD stands where invalid bytes
    // were), so equal bytes prove the text valid. `String(decoding:as:)` is the standard library's specialized
    // path; `String(validating:as:)` went through a generic one (metadata lookups at run time, once a poll).
    let decoded = String(decoding: bytes, as: UTF8.self)
    if RepairedText.same(decoded, bytes) {
      text = decoded
      repairs = []
      return
    }
    var output: [UInt8] = []
    output.reserveCapacity(bytes.count + 16)
    var found: [Int] = []
    var iterator = bytes.makeIterator()
    var parser = Unicode.UTF8.ForwardParser()
    loop: while true {
      switch parser.parseScalar(from: &iterator) {
      case .valid(let encoded): output.append(contentsOf: encoded)
      case .error:
        found.append(output.count)
        output.append(contentsOf: [0xEF, 0xBF, 0xBD])
      case .emptyInput: break loop
      }
    }
    text = String(decoding: output, as: UTF8.self)
    repairs = found
  }

  private static func same(_ text: String, _ bytes: [UInt8]) -> Bool {
    var text = text
    guard text.utf8.count == bytes.count else { return false }
    return text.withUTF8 { utf8 in
      bytes.withUnsafeBufferPointer { raw in
        utf8.count == 0 || memcmp(utf8.baseAddress!, raw.baseAddress!, utf8.count) == 0
      }
    }
  }

  /// Whether the `count` bytes at `offset` contain a replacement.
  public func repaired(offset: Int, count: Int) -> Bool {
    guard !repairs.isEmpty else { return false }
    var low = 0
    var high = repairs.count
    while low < high {
      let middle = (low + high) / 2
      if repairs[middle] < offset { low = middle + 1 } else { high = middle }
    }
    return low < repairs.count && repairs[low] < offset + count
  }
}
