import CJWT
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
        if bytes.count < 32 {
          problems.append("\(key): an HS256 secret needs at least 32 bytes (\(path) has \(bytes.count))")
        }
      } else if !String(decoding: bytes, as: UTF8.self).contains("-----BEGIN PUBLIC KEY-----") {
        problems.append("\(key): \(path) is not a PEM public key (-----BEGIN PUBLIC KEY-----)")
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
/// Loop-confined (the cache is mutable); verification is synchronous (≈ µs for HS256, tens of µs for ES256).
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

  public let algorithm: Algorithm
  public let audience: String?
  public let leeway: Double
  /// kid → key bytes. The key file's key is under "" (used by tokens without a kid).
  private let keys: [String: [UInt8]]
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

  public init(
    algorithm: Algorithm, keys: [String: [UInt8]], audience: String?, leeway: Double, cacheLimit: Int = 10_000
  ) {
    self.algorithm = algorithm
    self.keys = keys
    self.audience = audience
    self.leeway = leeway
    self.cacheLimit = cacheLimit
  }

  public convenience init(settings: JWTSettings, cacheLimit: Int = 10_000) {
    self.init(
      algorithm: settings.algorithm, keys: settings.keys, audience: settings.audience, leeway: settings.leeway,
      cacheLimit: cacheLimit)
  }

  /// Checks `token` at `now` (seconds since the Unix epoch).
  public func verify(_ token: String, now: Double) -> Result<TokenClaims, TokenRejection> {
    let outcome: Result<TokenClaims, TokenRejection>
    var hasher = Hasher()
    hasher.combine(seed)
    hasher.combine(token)
    let key = hasher.finalize()
    if let hit = cache[key], hit.token == token {
      cacheHits += 1
      outcome = hit.outcome
    } else {
      verifications += 1
      outcome = verifySignature(token)
      if cache.count >= cacheLimit { cache.removeAll(keepingCapacity: true) }
      // Long tokens are not worth keeping (and bound the table's memory): 10,000 × 2 KiB at most.
      if token.utf8.count <= 2048 { cache[key] = Verified(token: token, outcome: outcome) }
    }
    guard case .success(let claims) = outcome else { return outcome }
    if now > claims.expiresAt + leeway { return .failure(.expired) }
    if let notBefore = claims.notBefore, now + leeway < notBefore { return .failure(.notYetValid) }
    return .success(claims)
  }

  /// Everything that does not depend on the time: shape, header, key, signature, claims.
  private func verifySignature(_ token: String) -> Result<TokenClaims, TokenRejection> {
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
      let header = (try? JSONSerialization.jsonObject(with: headerBytes)) as? [String: Any]
    else { return .failure(.malformed("the header is not a JSON object")) }
    guard let alg = header["alg"] as? String else { return .failure(.malformed("the header has no alg")) }
    guard alg == algorithm.rawValue else { return .failure(.wrongAlgorithm(String(alg.prefix(16)))) }
    guard !segments[2].isEmpty else { return .failure(.badSignature) }
    let kid = header["kid"] as? String
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
    guard
      let claims = (try? JSONSerialization.jsonObject(with: Data(String(cString: grantsText).utf8))) as? [String: Any]
    else { return .failure(.malformed("the claims are not a JSON object")) }
    return JWTVerifier.claims(from: claims, audience: audience)
  }

  static func claims(from claims: [String: Any], audience: String?) -> Result<TokenClaims, TokenRejection> {
    guard let expValue = claims["exp"] else { return .failure(.missingExpiry) }
    guard let exp = (expValue as? NSNumber)?.doubleValue, exp.isFinite else {
      return .failure(.malformed("exp is not a number"))
    }
    var notBefore: Double?
    if let nbfValue = claims["nbf"] {
      guard let nbf = (nbfValue as? NSNumber)?.doubleValue, nbf.isFinite else {
        return .failure(.malformed("nbf is not a number"))
      }
      notBefore = nbf
    }
    if let audience {
      let audiences = (claims["aud"] as? String).map { [$0] } ?? (claims["aud"] as? [Any])?.compactMap { $0 as? String }
      guard let audiences, audiences.contains(audience) else { return .failure(.wrongAudience) }
    }
    guard let streamsValue = claims["streams"] else { return .failure(.badStreams("missing")) }
    guard let list = streamsValue as? [Any] else { return .failure(.badStreams("not an array")) }
    var streams = Set<String>()
    for item in list {
      guard let name = item as? String, !name.isEmpty, name.utf8.count <= 256 else {
        return .failure(.badStreams("every entry must be a non-empty string"))
      }
      streams.insert(name)
    }
    let subject = (claims["sub"] as? String).map { String($0.prefix(256)) }
    return .success(
      TokenClaims(
        subject: subject, expiresAt: exp, notBefore: notBefore, streams: streams.contains("*") ? nil : streams))
  }

  static func base64URLDecode(_ text: Substring) -> Data? {
    var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while base64.utf8.count % 4 != 0 { base64 += "=" }
    return Data(base64Encoded: base64)
  }
}
