/// Why a `/events` request gets no stream: one type for every refusal (credential, scope, admission, capacity), that
/// knows its status, its JSON body, its `Retry-After` and what it counts.
///
/// Every refusal answers `application/json` with `Cache-Control: no-store` and the request's CORS headers; 503 and
/// 429 carry a jittered `Retry-After` (and `retry_after` in the body); 401 carries `WWW-Authenticate: Bearer`.
/// The credential is never echoed.
public struct StreamRefusal: Error, Sendable, Equatable {
  public var status: Int32
  /// The body's `error`.
  public var error: String
  public var message: String
  /// Fields of the body between `error` and `message` (`reason`, `stream`).
  public var details: [Detail] = []
  /// Base of the jittered `Retry-After` (seconds, drawn in base…2×base); nil sends none.
  public var retryBase: Double?
  /// `WWW-Authenticate`, for 401.
  public var challenge: String?
  /// Counted under `pollcast_auth_failures_total{reason}`.
  public var failure: String?
  /// Counts against the client's address for the failed-check throttle.
  public var throttles = false
  /// Counted under `pollcast_admission_refusals_total{reason}`.
  public var admission: Admission.Refusal?

  public struct Detail: Sendable, Equatable {
    public var name: String
    public var value: String
    public init(name: String, value: String) {
      self.name = name
      self.value = value
    }
  }

  public var reasonPhrase: String {
    switch status {
    case 401: "Unauthorized"
    case 403: "Forbidden"
    case 429: "Too Many Requests"
    default: "Service Unavailable"
    }
  }

  /// The JSON body, with `retry` (seconds) when the refusal carries one.
  public func body(retry: Int?) -> String {
    var fields = [("error", JSONText.quoted(error))]
    fields += details.map { ($0.name, JSONText.quoted($0.value)) }
    fields.append(("message", JSONText.quoted(message)))
    if let retry { fields.append(("retry_after", String(retry))) }
    return JSONText.object(fields) + "\n"
  }

  // MARK: The refusals

  /// 401: no credential where one is required. `noun` is what the mode calls it (`token`, `key`).
  public static func missingCredential(noun: String, error: String, cookieName: String, allowQuery: Bool) -> Self {
    var refusal = unauthorized(
      error: error, reason: "missing",
      message: "a \(noun) is required: Authorization: Bearer <\(noun)>, or the cookie \(cookieName)"
        + (allowQuery ? ", or ?access_token=<\(noun)>" : ""))
    refusal.challenge = "Bearer realm=\"pollcast\""
    refusal.throttles = false
    return refusal
  }

  /// 401: a credential that was checked and refused (`reason` names why). Counts as a failed check.
  public static func unauthorized(error: String, reason: String, message: String) -> Self {
    StreamRefusal(
      status: 401, error: error, message: message, details: [Detail(name: "reason", value: reason)],
      challenge: "Bearer realm=\"pollcast\", error=\"invalid_token\", error_description=\"\(reason)\"",
      failure: reason, throttles: true)
  }

  /// 403: a stream the credential (or its feed) does not carry.
  public static func forbiddenStream(_ stream: String, message: String) -> Self {
    StreamRefusal(
      status: 403, error: "forbidden_stream", message: message,
      details: [Detail(name: "stream", value: String(stream.prefix(256)))])
  }

  /// 503 (the relay cannot serve anyone now) or 429 (this client's share is used up), from admission control.
  public static func admission(_ refusal: Admission.Refusal, message: String, retryBase: Double) -> Self {
    StreamRefusal(
      status: refusal.status, error: refusal.rawValue, message: message, retryBase: retryBase, admission: refusal)
  }

  /// A refusal admission control gave (and counted already): `subjectNoun` names what the per-subject cap counts.
  public static func admitted(_ refusal: Admission.Refusal, subjectNoun: String, retryBase: Double) -> Self {
    let message =
      switch refusal {
      case .maxConnections: "the relay is at its stream limit: retry later"
      case .perAddress: "too many streams from this address"
      case .perSubject: "too many streams for this \(subjectNoun)"
      case .maxAccounts: "the relay serves as many accounts as it may"
      case .upstreamUnavailable: "the legacy API could not check the key"
      case .busy: "too many credential checks waiting"
      case .authThrottled: "too many failed credential checks from this address"
      }
    var answer = admission(refusal, message: message, retryBase: retryBase)
    answer.admission = nil
    return answer
  }

  /// 503 naming a reason that is not an admission cap (`feed_unavailable`).
  public static func unavailable(error: String, message: String, retryBase: Double = 5) -> Self {
    StreamRefusal(status: 503, error: error, message: message, retryBase: retryBase)
  }

  /// 503: too many credential checks are waiting (`what`: `token checks`, `key checks for the legacy API`).
  public static func busy(_ what: String, retryBase: Double) -> Self {
    admission(.busy, message: "too many \(what) waiting: retry later", retryBase: retryBase)
  }
}

extension HTTPRequest {
  /// Answers `refusal`, drawing its `Retry-After` from `random`.
  func refuse(_ refusal: StreamRefusal, cors: [(String, String)], random: inout SeededRandom) {
    let retry = refusal.retryBase.map { Admission.retryAfter(base: $0, random: &random) }
    var headers = cors
    if let retry { headers.append(("Retry-After", String(retry))) }
    if let challenge = refusal.challenge { headers.append(("WWW-Authenticate", challenge)) }
    headers.append(("Cache-Control", "no-store"))
    respond(
      status: refusal.status, reason: refusal.reasonPhrase, contentType: "application/json",
      body: refusal.body(retry: retry), headers: headers)
  }
}
