import Foundation
import PollcastCore
import Testing

/// A JWT key is parsed for what it is (OpenSSL's PEM reader) and must fit `auth.jwt.algorithm`: an RSA or EC
/// public key configured as an HS256 secret, a key of the other asymmetric kind, a curve other than P-256, a
/// private key or a short RSA key each stop the relay with exit 78 naming the file and what it holds.
@Suite(.serialized, .timeLimit(.minutes(3))) struct JWTKeyTests {
  func load(_ algorithm: JWTVerifier.Algorithm, _ path: String) -> String? {
    do {
      _ = try JWTSettings.load(algorithm: algorithm, keyFile: path, keysDirectory: "", audience: nil, leeway: 0)
      return nil
    } catch {
      return "\(error)"
    }
  }

  @Test func aKeyOfTheWrongKindIsRefusedAtLoad() throws {
    let minter = try TokenMinter()
    let rsa = try minter.keyPair("rsa")
    let ec = try minter.keyPair("ec")
    let secret = try minter.secret()
    let small = minter.directory.appendingPathComponent("small").path
    _ = try minter.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", small + ".key"])
    _ = try minter.openssl(["pkey", "-in", small + ".key", "-pubout", "-out", small + ".pem"])
    let p384 = minter.directory.appendingPathComponent("p384").path
    _ = try minter.openssl([
      "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", p384 + ".key",
    ])
    _ = try minter.openssl(["pkey", "-in", p384 + ".key", "-pubout", "-out", p384 + ".pem"])
    // A secret that carries a PEM block inside other bytes is refused too.
    let wrapped = minter.directory.appendingPathComponent("wrapped").path
    let pem = try String(contentsOfFile: rsa.publicKey, encoding: .utf8)
    FileManager.default.createFile(atPath: wrapped, contents: Data(("padding-bytes-0123456789\n" + pem).utf8))

    // Fitting keys load.
    #expect(load(.hs256, secret.path) == nil)
    #expect(load(.rs256, rsa.publicKey) == nil)
    #expect(load(.es256, ec.publicKey) == nil)
    let cases: [(JWTVerifier.Algorithm, String, String)] = [
      (.hs256, rsa.publicKey, "an RSA public key of 2048 bits, not an HS256 secret"),
      (.hs256, ec.publicKey, "an EC public key on prime256v1"),
      (.hs256, wrapped, "not an HS256 secret"),
      (.rs256, ec.publicKey, "but RS256 needs an RSA public key"),
      (.es256, rsa.publicKey, "but ES256 needs an EC public key on P-256"),
      (.es256, p384 + ".pem", "secp384r1"),
      (.rs256, small + ".pem", "at least 2048 bits"),
      (.rs256, rsa.privateKey, "holds a private key"),
      (.es256, secret.path, "is not a PEM public key"),
    ]
    for (algorithm, path, expected) in cases {
      let problem = load(algorithm, path)
      #expect(problem?.contains(expected) == true, "\(algorithm) \(path): \(problem ?? "accepted")")
      #expect(problem?.contains(path) == true, "the file is named: \(problem ?? "")")
    }
  }

  /// The README's promise, as users meet it: the relay exits 78 naming the file and what it found.
  @Test func theRelayExits78ForAnRSAKeyConfiguredAsHS256() throws {
    let minter = try TokenMinter()
    let rsa = try minter.keyPair("rsa")
    for (algorithm, path) in [("HS256", rsa.publicKey), ("ES256", rsa.publicKey)] {
      let result = try run(
        builtProduct("pollcast"),
        [
          "--demo", "--listen", "127.0.0.1:0", "--auth-mode", "jwt", "--auth-jwt-algorithm", algorithm,
          "--auth-jwt-key-file", path,
        ])
      #expect(result.code == 78, "\(algorithm): \(result.stderr)")
      #expect(result.stderr.contains(path))
      #expect(result.stderr.contains("RSA public key"))
    }
  }

  /// An exp that can only be milliseconds is refused, and tokens without `sub` are each a subject of their own:
  /// one leaked sub-less token cannot open more than the per-subject cap, while another such token still can.
  @Test func millisecondExpiriesAreRefusedAndSubjectlessTokensAreCappedPerToken() async throws {
    let minter = try TokenMinter()
    let secret = try minter.secret()
    let settings = JWTSettings(algorithm: .hs256, keys: ["": secret.bytes], audience: nil, leeway: 30)
    let limits = Admission.Limits(maxConnections: 50, maxPerAddress: 50, maxPerSubject: 2, maxFailuresPerMinute: 0)
    try await RelayHarness.start(server: AuthTests.jwtServer(settings, admission: limits)).run { harness in
      let now = Date().timeIntervalSince1970
      let milliseconds = try minter.mint(
        alg: "HS256", claims: ["exp": Int(now * 1000), "streams": ["*"]], signer: .hmac(secret: secret.bytes))
      let refused = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(milliseconds)")])
      #expect(refused.status == 401)
      #expect(refused.body.contains("100 years"), "\(refused.body)")
      func subjectless(_ nonce: Int) throws -> String {
        try minter.mint(
          alg: "HS256", claims: ["exp": Int(now + 600), "streams": ["*"], "n": nonce],
          signer: .hmac(secret: secret.bytes))
      }
      let shared = try subjectless(1)
      var open: [TestSSEClient] = []
      for _ in 0..<2 {
        let client = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(shared)")])
        try client.waitForHead()
        #expect(client.status == 200)
        open.append(client)
      }
      let third = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(shared)")])
      #expect(third.status == 429, "\(third.body)")
      let other = try TestSSEClient(port: harness.port, headers: [("Authorization", "Bearer \(try subjectless(2))")])
      try other.waitForHead()
      #expect(other.status == 200)
      open.append(other)
      for client in open { client.reset() }
    }
  }
}
