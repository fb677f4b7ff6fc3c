import Foundation

/// What a subscriber's request carries for its credential check.
public struct CredentialAsk: Sendable {
  public var authorization: String?
  public var cookie: String?
  public var query: [(String, String)]
  /// The client's address (after trusted proxies), for the failed-check throttle.
  public var address: String

  public init(authorization: String?, cookie: String?, query: [(String, String)], address: String) {
    self.authorization = authorization
    self.cookie = cookie
    self.query = query
    self.address = address
  }
}

/// What an accepted credential may read: which feed, which of its streams, as whom, until when.
public struct Grant: Sendable, Equatable {
  /// Which feed a grant reads: the shared one, or one account's (per-user relaying).
  public enum FeedKey: Hashable, Sendable {
    case shared
    case account(String)
  }

  public var feed: FeedKey = .shared
  /// The streams granted (nil: every stream of the feed). A request that names none reads these.
  public var streams: Set<String>?
  /// Who holds the grant, for the per-subject stream cap.
  public var subject: String?
  /// When the grant ends by itself (a token's expiry).
  public var end: GrantEnd?
  /// What a revocation names (per-user relaying: a digest of the key), so that the streams of one key end together.
  public var revocationKey: String?
  /// The credential that restarts the feed's upstream loop if it stopped since the check (per-user relaying).
  var activation: String?

  public init(
    feed: FeedKey = .shared, streams: Set<String>? = nil, subject: String? = nil, end: GrantEnd? = nil,
    revocationKey: String? = nil
  ) {
    self.feed = feed
    self.streams = streams
    self.subject = subject
    self.end = end
    self.revocationKey = revocationKey
  }
}

/// A grant's own end: at `at` (monotonic seconds) the stream ends with a last id-less event, so the client's
/// Last-Event-ID stays that of the last event it got, and it reconnects with a fresh credential.
public struct GrantEnd: Sendable, Equatable {
  public var at: Double
  public var type: String
  public var data: String

  /// A token's expiry: `event: token-expired`, `{"reason":"token_expired","expired_at":"<exp>"}`.
  public static func tokenExpiry(at monotonic: Double, expiresAt unix: Double) -> GrantEnd {
    GrantEnd(
      at: monotonic, type: "token-expired",
      data: JSONText.object([
        "reason": JSONText.quoted("token_expired"), "expired_at": JSONText.quoted(String(Int64(unix))),
      ]))
  }
}

/// The answer to a credential: known in this loop turn, or after an off-loop wait (a signature on the checking
/// thread, a call to the legacy API). The wait runs isolated to the caller, on the event loop.
public enum Authentication: Sendable {
  case decided(Result<Grant, StreamRefusal>)
  case wait(@Sendable (isolated any Actor) async -> Result<Grant, StreamRefusal>)
}

/// `auth.mode`: a request's credential in, a grant or a refusal out. The server knows no mode; each mode is one
/// conformance. Called on the event loop.
public protocol Authenticator: AnyObject, Sendable {
  /// `none`, `jwt` or `upstream`, for `/metrics`.
  var mode: String { get }
  /// What the per-subject cap calls a subject in its refusal (`subject`, `account`).
  var subjectNoun: String { get }
  func authenticate(_ ask: CredentialAsk) -> Authentication
  /// Signature checks done and answered from the cache (jwt); nil for modes without.
  var verificationCounters: (checks: Int, cacheHits: Int)? { get }
  /// New token keys (SIGHUP); false when the mode checks no tokens.
  func reload(_ jwt: JWTSettings) -> Bool
  /// A credential accepted without a check and refused later (its first poll): `handler` gets the address that
  /// brought it, which then counts a failed check.
  func onLateRefusal(_ handler: @escaping @Sendable (String) -> Void)
}

extension Authenticator {
  public var verificationCounters: (checks: Int, cacheHits: Int)? { nil }
  public func reload(_ jwt: JWTSettings) -> Bool { false }
  public func onLateRefusal(_ handler: @escaping @Sendable (String) -> Void) {}
}

/// Where a credential is looked for and what it may hold, and what a mode calls it in refusals.
struct CredentialRule: Sendable {
  var cookieName: String
  var allowQuery: Bool
  var charset: CredentialCharset
  /// In the "required" message: `token`, `key`.
  var noun: String
  /// In the body's `error`: `missing_<kind>`, `invalid_<kind>`.
  var kind: String

  init(_ access: AccessSettings, noun: String, kind: String) {
    cookieName = access.cookieName
    allowQuery = access.allowQueryToken
    charset = access.credentialCharset
    self.noun = noun
    self.kind = kind
  }

  /// The credential, or the 401 that answers its absence or its shape. A malformed one counts as a failed check: a
  /// client probing with crafted values is throttled like one guessing keys.
  func extract(_ ask: CredentialAsk) -> Result<String, StreamRefusal> {
    switch CredentialExtractor.lookup(
      authorization: ask.authorization, cookie: ask.cookie, query: ask.query, cookieName: cookieName,
      allowQuery: allowQuery, charset: charset)
    {
    case .found(let credential, _):
      return .success(credential)
    case .missing:
      return .failure(
        .missingCredential(noun: noun, error: "missing_\(kind)", cookieName: cookieName, allowQuery: allowQuery))
    case .malformed(let source):
      return .failure(
        .unauthorized(
          error: "malformed_credential", reason: "malformed_credential",
          message: "the credential in the \(source.rawValue) is not a token (\(charset.rawValue))"))
    }
  }

  func refused(_ reason: String, message: String) -> StreamRefusal {
    .unauthorized(error: "invalid_\(kind)", reason: reason, message: message)
  }
}

/// `auth.mode = none`: everyone reads the shared feed.
public final class OpenAccess: Authenticator {
  public init() {}
  public var mode: String { "none" }
  public var subjectNoun: String { "subject" }
  public func authenticate(_ ask: CredentialAsk) -> Authentication { .decided(.success(Grant())) }
}

/// `auth.mode = jwt`: a signed token grants streams of the shared feed until it expires.
public final class TokenAuthenticator: Authenticator, @unchecked Sendable {  // the verifier is loop-confined
  private let verifier: JWTVerifier
  private let rule: CredentialRule

  public init(_ settings: JWTSettings, access: AccessSettings) {
    verifier = JWTVerifier(settings: settings)
    rule = CredentialRule(access, noun: "token", kind: "token")
  }

  public var mode: String { "jwt" }
  public var subjectNoun: String { "subject" }
  public var verificationCounters: (checks: Int, cacheHits: Int)? { (verifier.verifications, verifier.cacheHits) }

  public func reload(_ jwt: JWTSettings) -> Bool {
    verifier.replace(with: jwt)
    return true
  }

  public func authenticate(_ ask: CredentialAsk) -> Authentication {
    let token: String
    switch rule.extract(ask) {
    case .success(let found): token = found
    case .failure(let refusal): return .decided(.failure(refusal))
    }
    let now = Date().timeIntervalSince1970
    if let known = verifier.cached(token, now: now) { return .decided(grant(known, now: now)) }
    guard verifier.checksOffLoop else { return .decided(grant(verifier.verify(token, now: now), now: now)) }
    // RS256/ES256: the signature is checked on its own thread while the request waits.
    return .wait { isolation in
      guard
        let outcome = await self.verifier.verifyOffLoop(
          token, now: { Date().timeIntervalSince1970 }, isolation: isolation)
      else { return .failure(.busy("token checks", retryBase: 2)) }
      return self.grant(outcome, now: Date().timeIntervalSince1970)
    }
  }

  private func grant(_ outcome: Result<TokenClaims, TokenRejection>, now: Double) -> Result<Grant, StreamRefusal> {
    switch outcome {
    case .failure(let rejection):
      return .failure(rule.refused(rejection.code, message: rejection.message))
    case .success(let claims):
      let ends = MonotonicClock.seconds() + (claims.expiresAt + verifier.leeway - now)
      return .success(
        Grant(
          streams: claims.streams, subject: claims.subject,
          end: .tokenExpiry(at: ends, expiresAt: claims.expiresAt)))
    }
  }
}

/// `auth.mode = upstream`: the subscriber's own legacy key opens its account's feed. A key the hub already knows
/// (accepted for an active account, or refused lately) is answered in this turn; otherwise the legacy API is asked.
public final class AccountAuthenticator: Authenticator {
  private let hub: AccountHub
  private let rule: CredentialRule

  public init(hub: AccountHub, access: AccessSettings) {
    self.hub = hub
    rule = CredentialRule(access, noun: "key", kind: "credential")
  }

  public var mode: String { "upstream" }
  public var subjectNoun: String { "account" }

  public func onLateRefusal(_ handler: @escaping @Sendable (String) -> Void) {
    hub.assumeIsolated { $0.onUnverifiedKeyRefused(handler) }
  }

  public func authenticate(_ ask: CredentialAsk) -> Authentication {
    let key: String
    switch rule.extract(ask) {
    case .success(let found): key = found
    case .failure(let refusal): return .decided(.failure(refusal))
    }
    if let known = hub.assumeIsolated({ $0.cached(key) }) { return .decided(grant(known, credential: key)) }
    let address = ask.address
    return .wait { [hub] _ in
      let outcome = await hub.resolve(key, address: address)
      return self.grant(outcome, credential: key)
    }
  }

  private func grant(_ outcome: AccountHub.Outcome, credential: String) -> Result<Grant, StreamRefusal> {
    switch outcome {
    case .admitted(let account):
      var grant = Grant(
        feed: .account(account.key), subject: "account:\(account.key)",
        revocationKey: hub.assumeIsolated { $0.grant(for: credential) })
      grant.activation = credential
      return .success(grant)
    case .refused(let reason):
      return .failure(rule.refused(reason, message: "the legacy API does not accept this key"))
    case .unavailable:
      var refusal = StreamRefusal.admission(
        .upstreamUnavailable, message: "the legacy API could not check the key: retry later", retryBase: 5)
      // A failed check counts like a refused one: an API that answers made-up keys with an error (a 404, a 500)
      // must not take one upstream call per made-up key from the same address.
      refusal.throttles = true
      return .failure(refusal)
    case .full:
      return .failure(FeedHub.noRoom)
    case .busy:
      return .failure(
        .admission(.busy, message: "too many key checks waiting for the legacy API: retry later", retryBase: 5))
    }
  }
}
