import CJWT
import CSSL
import Foundation

/// What a verified subscriber token grants.
public struct TokenClaims: Sendable, Equatable {
  /// `sub`, when the token has one (admission counts connections per subject).
  public var subject: String?
  /// `exp`, seconds since the Unix epoch.
  public var expiresAt: Double
  /// `nbf`, when present.
  public var notBefore: Double?
  /// The `streams` claim; nil when it holds `"*"` (every stream).
  public var streams: Set<String>?
}

/// Why a token was refused. `code` is what the 401 body says in `reason`.
public enum TokenRejection: Error, Equatable, Sendable {
  case malformed(String)
  case wrongAlgorithm(String)
  case unknownKey
  case badSignature
  case missingExpiry
  case expired
  case notYetValid
  case wrongAudience
  case badStreams(String)

  public var code: String {
    switch self {
    case .malformed: "malformed"
    case .wrongAlgorithm: "wrong_algorithm"
    case .unknownKey: "unknown_key"
    case .badSignature: "bad_signature"
    case .missingExpiry: "missing_exp"
    case .expired: "expired"
    case .notYetValid: "not_yet_valid"
    case .wrongAudience: "wrong_audience"
    case .badStreams: "bad_streams_claim"
    }
  }

  public var message: String {
    switch self {
    case .malformed(let why): "the token is malformed: \(why)"
    case .wrongAlgorithm(let alg): "the token is signed with \(alg), not the configured algorithm"
    case .unknownKey: "the token's kid names no configured key"
    case .badSignature: "the token's signature does not verify"
    case .missingExpiry: "the token has no exp claim"
    case .expired: "the token has expired"
    case .notYetValid: "the token is not valid yet (nbf)"
    case .wrongAudience: "the token is not meant for this audience"
    case .badStreams(let why): "the streams claim is unusable: \(why)"
    }
  }
}

/// How `auth.mode = jwt` verifies: the algorithm, the key bytes read at start (by kid; "" for the key file), the
/// required audience and the clock leeway.
public struct JWTSettings: Sendable, Equatable {
  public var algorithm: JWTVerifier.Algorithm
  public var keys: [String: [UInt8]]
  public var audience: String?
  public var leeway: Double

  public init(algorithm: JWTVerifier.Algorithm, keys: [String: [UInt8]], audience: String?, leeway: Double) {
    self.algorithm = algorithm
    self.keys = keys
    self.audience = audience
    self.leeway = leeway
  }

  /// Loads the key file (HS256: its bytes are the secret, a trailing newline removed; RS256/ES256: a PEM public
  /// key) and, when given, every `<kid>.pem` / `<kid>.key` file of `keysDirectory`.
  public static func load(
    algorithm: JWTVerifier.Algorithm, keyFile: String, keysDirectory: String, audience: String?, leeway: Double
  ) throws(ConfigurationError) -> JWTSettings {
    var keys: [String: [UInt8]] = [:]
    var problems: [String] = []
    func read(_ path: String, _ key: String) -> [UInt8]? {
      guard let data = FileManager.default.contents(atPath: path) else {
        problems.append("\(key): cannot read \(path)")
        return nil
      }
      var bytes = [UInt8](data)
      if algorithm == .hs256 {
        while let last = bytes.last, last == 0x0A || last == 0x0D { bytes.removeLast() }
      }
      if let problem = KeyInspection.problem(bytes, path: path, algorithm: algorithm) {
        problems.append("\(key): \(problem)")
      }
      return bytes
    }
    if !keyFile.isEmpty, let bytes = read(keyFile, "auth.jwt.key_file") { keys[""] = bytes }
    if !keysDirectory.isEmpty {
      let names = (try? FileManager.default.contentsOfDirectory(atPath: keysDirectory)) ?? []
      if names.isEmpty { problems.append("auth.jwt.keys_directory: no key files in \(keysDirectory)") }
      for name in names.sorted() where name.hasSuffix(".pem") || name.hasSuffix(".key") {
        let kid = String(name.dropLast(4))
        if let bytes = read(keysDirectory + "/" + name, "auth.jwt.keys_directory") { keys[kid] = bytes }
      }
    }
    if keys.isEmpty && problems.isEmpty {
      problems.append("auth.jwt.key_file: auth.mode jwt needs a key file or auth.jwt.keys_directory")
    }
    guard problems.isEmpty else { throw ConfigurationError(problems: problems) }
    return JWTSettings(algorithm: algorithm, keys: keys, audience: audience, leeway: leeway)
  }

}

/// Verifies subscriber JWTs with libjwt (Debian's 1.10, on OpenSSL): HS256 with a shared secret, RS256 or ES256
/// with a PEM public key, optionally several keys selected by the token's `kid` (rotation without downtime).
///
/// libjwt 1.10's `jwt_decode` verifies with whatever algorithm the *token* names if the key fits it, so an HS256
/// token whose HMAC secret is the configured RS256 public key verifies. The header's `alg` is therefore checked
/// against the configured algorithm before decoding, and `jwt_get_alg` again after it. `alg: none` never passes:
/// it is not a configurable algorithm. Time checks (exp, nbf, leeway) are done here, per use, so a cached
/// verification never outlives its token.
///
/// Signature checks are cached by token (a bounded table): a browser reconnecting with the same token, or an
/// attacker replaying the same garbage, costs one table lookup instead of an RSA/ECDSA verification.
/// Loop-confined (the cache is mutable). HS256 is verified on the loop (about 100 µs with OpenSSL 3); RS256 and
/// ES256 (about 1 ms: libjwt parses the PEM key on every check) on a thread of their own (`verifyOffLoop`).
public final class JWTVerifier {
  public enum Algorithm: String, CaseIterable, Sendable {
    case hs256 = "HS256"
    case rs256 = "RS256"
    case es256 = "ES256"

    var libjwt: jwt_alg_t {
      switch self {
      case .hs256: JWT_ALG_HS256
      case .rs256: JWT_ALG_RS256
      case .es256: JWT_ALG_ES256
      }
    }
  }

  public private(set) var settings: JWTSettings
  public var algorithm: Algorithm { settings.algorithm }
  public var leeway: Double { settings.leeway }
  /// Longest token looked at; longer ones are refused unread.
  public static let maxTokenBytes = 8192

  private struct Verified {
    var token: String
    var outcome: Result<TokenClaims, TokenRejection>
  }
  private var cache: [Int: Verified] = [:]
  private let cacheLimit: Int
  private let seed = Int.random(in: .min ... .max)
  public private(set) var verifications = 0
  public private(set) var cacheHits = 0
  /// Signature checks running off the loop now, and the most allowed at once (more are refused with 503).
  public private(set) var inFlight = 0
  public let maxInFlight: Int
  /// Where RS256/ES256 checks run: one thread, so a flood of tokens costs at most one core and the loop keeps the
  /// other for fan-out.
  private static let checks = DispatchQueue(label: "pollcast.token-checks", qos: .userInitiated)

  public init(
    algorithm: Algorithm, keys: [String: [UInt8]], audience: String?, leeway: Double, cacheLimit: Int = 10_000,
    maxInFlight: Int = 512
  ) {
    self.settings = JWTSettings(algorithm: algorithm, keys: keys, audience: audience, leeway: leeway)
    self.cacheLimit = cacheLimit
    self.maxInFlight = maxInFlight
  }

  public convenience init(settings: JWTSettings, cacheLimit: Int = 10_000, maxInFlight: Int = 512) {
    self.init(
      algorithm: settings.algorithm, keys: settings.keys, audience: settings.audience, leeway: settings.leeway,
      cacheLimit: cacheLimit, maxInFlight: maxInFlight)
  }

  /// New keys (SIGHUP re-reads the key file and directory): checks from now on use them, and every cached
  /// outcome is forgotten, so a removed key stops verifying at once. The algorithm, audience and leeway may change
  /// too.
  public func replace(with settings: JWTSettings) {
    self.settings = settings
    cache.removeAll()
  }

  /// Whether a signature check costs enough to run off the loop. libjwt 1.10 parses the PEM public key on every
  /// RS256/ES256 check, which OpenSSL 3 makes cost about 1 ms (measured); HS256 costs tens of µs.
  public var checksOffLoop: Bool { settings.algorithm != .hs256 }

  /// Checks `token` at `now` (seconds since the Unix epoch), on the calling thread.
  public func verify(_ token: String, now: Double) -> Result<TokenClaims, TokenRejection> {
    if let hit = cached(token, now: now) { return hit }
    verifications += 1
    let outcome = JWTVerifier.checkSignature(token, settings: settings)
    remember(token, outcome)
    return timeChecked(outcome, now: now)
  }

  /// The answer for `token` at `now` if its signature was checked before.
  public func cached(_ token: String, now: Double) -> Result<TokenClaims, TokenRejection>? {
    guard let hit = cache[cacheKey(token)], hit.token == token else { return nil }
    cacheHits += 1
    return timeChecked(hit.outcome, now: now)
  }

  /// Checks `token`'s signature on the checking thread, then its times at `now` on return. Nil when
  /// `maxInFlight` checks are already waiting: the caller refuses the request (503) rather than queue without bound.
  public func verifyOffLoop(
    _ token: String, now: @escaping @Sendable () -> Double, isolation: isolated (any Actor)? = #isolation
  ) async -> Result<TokenClaims, TokenRejection>? {
    guard inFlight < maxInFlight else { return nil }
    inFlight += 1
    verifications += 1
    let settings = settings
    let outcome = await withCheckedContinuation { continuation in
      JWTVerifier.checks.async { continuation.resume(returning: JWTVerifier.checkSignature(token, settings: settings)) }
    }
    inFlight -= 1
    remember(token, outcome)
    return timeChecked(outcome, now: now())
  }

  private func cacheKey(_ token: String) -> Int {
    var hasher = Hasher()
    hasher.combine(seed)
    hasher.combine(token)
    return hasher.finalize()
  }

  private func remember(_ token: String, _ outcome: Result<TokenClaims, TokenRejection>) {
    if cache.count >= cacheLimit { cache.removeAll(keepingCapacity: true) }
    // Long tokens are not worth keeping (and bound the table's memory): 10,000 × 2 KiB at most.
    if token.utf8.count <= 2048 { cache[cacheKey(token)] = Verified(token: token, outcome: outcome) }
  }

  private func timeChecked(_ outcome: Result<TokenClaims, TokenRejection>, now: Double) -> Result<
    TokenClaims, TokenRejection
  > {
    guard case .success(let claims) = outcome else { return outcome }
    if now > claims.expiresAt + leeway { return .failure(.expired) }
    // An exp this far ahead is milliseconds (or a mistake): the stream would never end for the token's expiry.
    if claims.expiresAt > now + JWTVerifier.maxLifetime {
      return .failure(.malformed("exp is more than 100 years ahead (milliseconds instead of seconds?)"))
    }
    if let notBefore = claims.notBefore, now + leeway < notBefore { return .failure(.notYetValid) }
    return .success(claims)
  }

  /// Everything that does not depend on the time: shape, header, key, signature, claims. Thread-safe (libjwt and
  /// OpenSSL objects are made per call).
  static func checkSignature(_ token: String, settings: JWTSettings) -> Result<TokenClaims, TokenRejection> {
    let algorithm = settings.algorithm
    let keys = settings.keys
    let utf8 = token.utf8
    guard !utf8.isEmpty else { return .failure(.malformed("empty")) }
    guard utf8.count <= JWTVerifier.maxTokenBytes else {
      return .failure(.malformed("longer than \(JWTVerifier.maxTokenBytes) bytes"))
    }
    let base64url = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.".utf8)
    guard utf8.allSatisfy({ base64url.contains($0) }) else {
      return .failure(.malformed("not three base64url segments"))
    }
    let segments = token.split(separator: ".", omittingEmptySubsequences: false)
    guard segments.count == 3, !segments[0].isEmpty, !segments[1].isEmpty else {
      return .failure(.malformed("not three base64url segments"))
    }
    guard let headerBytes = JWTVerifier.base64URLDecode(segments[0]),
      let header = try? RawJSON.parse(String(decoding: headerBytes, as: UTF8.self)),
      case .object = header.value
    else { return .failure(.malformed("the header is not a JSON object")) }
    guard let alg = header["alg"]?.stringValue else { return .failure(.malformed("the header has no alg")) }
    guard alg == algorithm.rawValue else { return .failure(.wrongAlgorithm(String(alg.prefix(16)))) }
    guard !segments[2].isEmpty else { return .failure(.badSignature) }
    let kid = header["kid"]?.stringValue
    guard let key = kid.flatMap({ keys[$0] }) ?? (kid == nil ? keys[""] : nil) ?? (keys.count == 1 ? keys[""] : nil)
    else { return .failure(.unknownKey) }
    var decoded: OpaquePointer?
    let status = key.withUnsafeBufferPointer { buffer in
      jwt_decode(&decoded, token, buffer.baseAddress, Int32(buffer.count))
    }
    guard status == 0, let jwt = decoded else { return .failure(.badSignature) }
    defer { jwt_free(jwt) }
    guard jwt_get_alg(jwt) == algorithm.libjwt else { return .failure(.wrongAlgorithm(alg)) }
    guard let grantsText = jwt_get_grants_json(jwt, nil) else { return .failure(.malformed("no claims")) }
    defer { free(grantsText) }
    guard let claims = try? RawJSON.parse(String(cString: grantsText)), case .object = claims.value else {
      return .failure(.malformed("the claims are not a JSON object"))
    }
    return JWTVerifier.claims(from: claims, audience: settings.audience).map { claims in
      var claims = claims
      // A token without sub is a subject of its own: the per-subject cap bounds how many streams one leaked or
      // shared token opens (a digest, never the token, is what admission keeps).
      if claims.subject == nil { claims.subject = "token:" + JWTVerifier.digest(token) }
      return claims
    }
  }

  /// Tokens whose exp is further ahead than this are refused.
  static let maxLifetime: Double = 100 * 365.25 * 86_400

  /// SHA-256 of `text`, in hex: a stable name for a token that must never be kept itself.
  static func digest(_ text: String) -> String {
    var bytes = [UInt8](repeating: 0, count: 32)
    var length: UInt32 = 0
    let input = Array(text.utf8)
    _ = input.withUnsafeBufferPointer { buffer in
      EVP_Digest(buffer.baseAddress, buffer.count, &bytes, &length, EVP_sha256(), nil)
    }
    return bytes.prefix(Int(length)).lowercaseHex
  }

  static func claims(from claims: RawJSON, audience: String?) -> Result<TokenClaims, TokenRejection> {
    func number(_ value: RawJSON) -> Double? {
      guard case .number(let text) = value.value, let number = Double(text), number.isFinite else { return nil }
      return number
    }
    guard let expValue = claims["exp"] else { return .failure(.missingExpiry) }
    guard let exp = number(expValue) else { return .failure(.malformed("exp is not a number")) }
    var notBefore: Double?
    if let nbfValue = claims["nbf"] {
      guard let nbf = number(nbfValue) else { return .failure(.malformed("nbf is not a number")) }
      notBefore = nbf
    }
    if let audience {
      var audiences: [String] = []
      switch claims["aud"]?.value {
      case .string(let one): audiences = [one]
      case .array(let many): audiences = many.compactMap(\.stringValue)
      default: break
      }
      guard audiences.contains(audience) else { return .failure(.wrongAudience) }
    }
    guard let streamsValue = claims["streams"] else { return .failure(.badStreams("missing")) }
    guard case .array(let list) = streamsValue.value else { return .failure(.badStreams("not an array")) }
    var streams = Set<String>()
    for item in list {
      guard let name = item.stringValue, !name.isEmpty, name.utf8.count <= 256 else {
        return .failure(.badStreams("every entry must be a non-empty string"))
      }
      streams.insert(name)
    }
    let subject = claims["sub"]?.stringValue.map { String($0.prefix(256)) }
    return .success(
      TokenClaims(
        subject: subject, expiresAt: exp, notBefore: notBefore, streams: streams.contains("*") ? nil : streams))
  }

  /// Base64url (no padding) to bytes, through Foundation's base64 decoder.
  static func base64URLDecode(_ text: Substring) -> Data? {
    var bytes = text.utf8.map { byte -> UInt8 in
      switch byte {
      case UInt8(ascii: "-"): UInt8(ascii: "+")
      case UInt8(ascii: "_"): UInt8(ascii: "/")
      default: byte
      }
    }
    while bytes.count % 4 != 0 { bytes.append(UInt8(ascii: "=")) }
    return Data(base64Encoded: Data(bytes))
  }
}
