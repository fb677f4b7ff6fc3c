import CJWT
import Foundation

/// Subscriber tokens for benchmarking `auth.mode = jwt`: one distinct token per subscriber (`sub` = bench-N), so
/// the relay verifies every connect instead of answering from its verification cache. Signed with libjwt, the same
/// library the relay verifies with, from `ALG:KEYFILE` (HS256: the secret file; RS256/ES256: a PEM private key).
enum BenchTokens {
  static func mint(spec: String, count: Int, lifetime: Double = 3600) throws -> [String] {
    let parts = spec.split(separator: ":", maxSplits: 1).map(String.init)
    guard parts.count == 2,
      let alg = ["HS256": JWT_ALG_HS256, "RS256": JWT_ALG_RS256, "ES256": JWT_ALG_ES256][parts[0]]
    else { throw BenchError("--mint-tokens: expected HS256:FILE, RS256:FILE or ES256:FILE, got \(spec)") }
    guard var key = FileManager.default.contents(atPath: parts[1]).map({ [UInt8]($0) }) else {
      throw BenchError("--mint-tokens: cannot read \(parts[1])")
    }
    if parts[0] == "HS256" { while let last = key.last, last == 0x0A || last == 0x0D { key.removeLast() } }
    let exp = Int(Date().timeIntervalSince1970 + lifetime)
    var tokens: [String] = []
    tokens.reserveCapacity(count)
    for index in 0..<count {
      var jwt: OpaquePointer?
      guard jwt_new(&jwt) == 0, let jwt else { throw BenchError("jwt_new failed") }
      defer { jwt_free(jwt) }
      let set =
        jwt_add_grant(jwt, "sub", "bench-\(index)") == 0 && jwt_add_grant_int(jwt, "exp", exp) == 0
        && jwt_add_grants_json(jwt, #"{"streams":["*"]}"#) == 0
        && key.withUnsafeBufferPointer { jwt_set_alg(jwt, alg, $0.baseAddress, Int32($0.count)) } == 0
      guard set, let encoded = jwt_encode_str(jwt) else { throw BenchError("cannot sign a token with \(parts[1])") }
      tokens.append(String(cString: encoded))
      free(encoded)
    }
    return tokens
  }
}
