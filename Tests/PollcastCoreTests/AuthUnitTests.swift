import Foundation
import Testing

@testable import PollcastCore

@Suite struct AuthUnitTests {
  // MARK: Claims

  private func claims(_ json: String, audience: String? = nil) -> Result<TokenClaims, TokenRejection> {
    JWTVerifier.claims(from: try! RawJSON.parse(json), audience: audience)
  }

  @Test func claimsNeedExpAndAStreamsArray() {
    let exp = 2_000_000_000.0
    #expect(claims(#"{"streams":["*"]}"#) == .failure(.missingExpiry))
    #expect(claims(#"{"exp":"soon","streams":["*"]}"#) == .failure(.malformed("exp is not a number")))
    #expect(claims(#"{"exp":2e9,"nbf":true,"streams":["*"]}"#) == .failure(.malformed("nbf is not a number")))
    #expect(claims(#"{"exp":2e9}"#) == .failure(.badStreams("missing")))
    #expect(claims(#"{"exp":2e9,"streams":"101"}"#) == .failure(.badStreams("not an array")))
    #expect(
      claims(#"{"exp":2e9,"streams":["101",7]}"#) == .failure(.badStreams("every entry must be a non-empty string")))
    #expect(claims(#"{"exp":2e9,"streams":[""]}"#) == .failure(.badStreams("every entry must be a non-empty string")))
    #expect(
      claims(#"{"exp":2000000000,"streams":["101","*"],"sub":"u"}"#)
        == .success(TokenClaims(subject: "u", expiresAt: exp, notBefore: nil, streams: nil)))
    #expect(
      claims(#"{"exp":2000000000.0,"nbf":5,"streams":["101","202"]}"#)
        == .success(TokenClaims(subject: nil, expiresAt: exp, notBefore: 5, streams: ["101", "202"])))
  }

  @Test func audienceMayBeAStringOrAnArray() {
    func with(_ aud: String) -> Result<TokenClaims, TokenRejection> {
      claims(#"{"exp":2e9,"streams":["*"]"# + (aud.isEmpty ? "" : #","aud":"# + aud) + "}", audience: "relay")
    }
    #expect((try? with(#""relay""#).get()) != nil)
    #expect((try? with(#"["other","relay"]"#).get()) != nil)
    #expect(with(#""other""#) == .failure(.wrongAudience))
    #expect(with("") == .failure(.wrongAudience))
    #expect(with(#"["other"]"#) == .failure(.wrongAudience))
    #expect(with("7") == .failure(.wrongAudience))
  }

  @Test func shapesAreRefusedBeforeAnyCryptography() {
    let verifier = JWTVerifier(
      algorithm: .hs256, keys: ["": Array("0123456789abcdef0123456789abcdef".utf8)], audience: nil, leeway: 0)
    let now = Date().timeIntervalSince1970
    for token in ["", "a", "a.b", "a.b.c.d", "a b.c.d", "ü.b.c", String(repeating: "a", count: 9000)] {
      guard case .failure(.malformed) = verifier.verify(token, now: now) else {
        Issue.record("\(token.prefix(20)) was not refused as malformed")
        continue
      }
    }
    let header = TokenMinterless.segment(#"{"alg":"none"}"#)
    #expect(
      verifier.verify(header + "." + TokenMinterless.segment("{}") + ".", now: now) == .failure(.wrongAlgorithm("none"))
    )
    let hs = TokenMinterless.segment(#"{"alg":"HS256"}"#)
    #expect(verifier.verify(hs + "." + TokenMinterless.segment("{}") + ".", now: now) == .failure(.badSignature))
    #expect(verifier.verifications == 9)
    // The same garbage again is answered from the cache.
    _ = verifier.verify("a.b", now: now)
    #expect(verifier.cacheHits == 1)
  }

  // MARK: Credentials

  @Test func credentialsAreTakenInDesignOrder() {
    let query = [("access_token", "q")]
    func pick(_ authorization: String?, _ cookie: String?, allowQuery: Bool = true) -> String? {
      CredentialExtractor.extract(
        authorization: authorization, cookie: cookie, query: query, cookieName: "pc", allowQuery: allowQuery)?
        .credential
    }
    #expect(pick("Bearer h", "pc=c") == "h")
    #expect(pick("bearer   h ", nil) == "h")
    #expect(pick("Basic abc", "x=1; pc=\"c\"") == "c")
    #expect(pick("Bearer ", "pcx=1") == "q")
    #expect(pick(nil, nil, allowQuery: false) == nil)
    #expect(CredentialExtractor.cookieValue("a=1;b=2; pc=3", name: "pc") == "3")
    #expect(CredentialExtractor.cookieValue("pcx=3", name: "pc") == nil)
    // What a page's encodeURIComponent stored comes back as the key; a stray % that decodes to nothing stays.
    #expect(CredentialExtractor.cookieValue("pc=ab%2Bc%2Fd%3D%3B", name: "pc") == "ab+c/d=;")
    #expect(CredentialExtractor.cookieValue("pc=100%", name: "pc") == "100%")
  }

  @Test func credentialsAreTokensOfTheirCharset() {
    for good in ["key-1000", "abc.DEF_ghi~jkl+mno/pqr==", "eyJhbGciOi.eyJzdWIiOi.c2ln", "a"] {
      #expect(CredentialCharset.b64token.accepts(good), "\(good)")
      #expect(CredentialCharset.visible.accepts(good), "\(good)")
    }
    for wider in ["k\"e;y", "a=b", "x%0D", "{json}", "a:b", "=abc"] {
      #expect(!CredentialCharset.b64token.accepts(wider), "\(wider)")
      #expect(CredentialCharset.visible.accepts(wider), "\(wider)")
    }
    for bad in ["", "a b", "a\tb", "a\r\nb", "a\nb", "a\u{0}b", "a\u{7F}", "ключ", String(repeating: "a", count: 8193)]
    {
      #expect(!CredentialCharset.b64token.accepts(bad), "\(bad.debugDescription)")
      #expect(!CredentialCharset.visible.accepts(bad), "\(bad.debugDescription)")
    }
    func look(_ cookie: String, _ charset: CredentialCharset = .b64token) -> CredentialLookup {
      CredentialExtractor.lookup(
        authorization: nil, cookie: cookie, query: [], cookieName: "pc", allowQuery: false, charset: charset)
    }
    #expect(look("pc=key-1") == .found("key-1", .cookie))
    // The decoded value is what is checked: an encoded CR LF is a CR LF.
    #expect(look("pc=k%0D%0AX-Evil%3A%201") == .malformed(.cookie))
    #expect(look("pc=k%0D%0AX-Evil%3A%201", .visible) == .malformed(.cookie))
    #expect(look("pc=k%00") == .malformed(.cookie))
    #expect(look("other=1") == .missing)
    #expect(
      CredentialExtractor.lookup(
        authorization: "Bearer a b", cookie: "pc=fine", query: [], cookieName: "pc", allowQuery: false,
        charset: .visible) == .malformed(.header))
  }

  // MARK: Addresses

  @Test func addressBlocksMatchByPrefix() throws {
    let v4 = try #require(AddressBlock("10.0.0.0/8"))
    #expect(v4.contains("10.200.1.1"))
    #expect(!v4.contains("11.0.0.1"))
    #expect(v4.contains("::ffff:10.1.2.3"))
    let v6 = try #require(AddressBlock("fd00::/8"))
    #expect(v6.contains("fd12::1"))
    #expect(!v6.contains("fe80::1"))
    #expect(try #require(AddressBlock("127.0.0.1")).contains("127.0.0.1"))
    #expect(!(try #require(AddressBlock("127.0.0.1")).contains("127.0.0.2")))
    #expect(try #require(AddressBlock("172.16.0.0/12")).contains("172.31.255.255"))
    for bad in ["", "10.0.0.0/33", "::/129", "host.example", "10.0.0.0/x", "1.2.3"] {
      #expect(AddressBlock(bad) == nil, "\(bad)")
    }
  }

  @Test func forwardedForIsBelievedOnlyFromTrustedProxies() {
    let resolver = ClientAddressResolver(trusted: ["127.0.0.1", "10.0.0.0/8"].compactMap(AddressBlock.init))
    #expect(resolver.resolve(peer: "203.0.113.5", forwardedFor: "1.2.3.4") == "203.0.113.5")
    #expect(resolver.resolve(peer: "127.0.0.1", forwardedFor: "1.2.3.4") == "1.2.3.4")
    #expect(resolver.resolve(peer: "127.0.0.1", forwardedFor: "6.6.6.6, 1.2.3.4, 10.1.1.1") == "1.2.3.4")
    #expect(resolver.resolve(peer: "127.0.0.1", forwardedFor: "10.2.2.2, 10.1.1.1") == "10.2.2.2")
    #expect(resolver.resolve(peer: "127.0.0.1", forwardedFor: "1.2.3.4, garbage") == "127.0.0.1")
    #expect(resolver.resolve(peer: "127.0.0.1", forwardedFor: nil) == "127.0.0.1")
    #expect(ClientAddressResolver(trusted: []).resolve(peer: "127.0.0.1", forwardedFor: "1.2.3.4") == "127.0.0.1")
  }

  // MARK: Admission

  @Test func admissionCountsAndReleases() {
    var admission = Admission(limits: .init(maxConnections: 3, maxPerAddress: 2, maxPerSubject: 1))
    #expect(admission.admit(address: "a", subject: "s") == nil)
    #expect(admission.admit(address: "a", subject: "s") == .perSubject)
    #expect(admission.admit(address: "a", subject: nil) == nil)
    #expect(admission.admit(address: "a", subject: nil) == .perAddress)
    #expect(admission.admit(address: "b", subject: "t") == nil)
    #expect(admission.admit(address: "c", subject: nil) == .maxConnections)
    admission.release(address: "a", subject: "s")
    #expect(admission.open == 2)
    #expect(admission.admit(address: "a", subject: "s") == nil)
    #expect(Admission.Refusal.maxConnections.status == 503)
    #expect(Admission.Refusal.perAddress.status == 429)
    #expect(admission.refusals[.perSubject] == 1 && admission.refusals[.maxConnections] == 1)
  }

  @Test func failedChecksThrottleAnAddressForTheMinuteInABoundedTable() {
    var admission = Admission(limits: .init(maxFailuresPerMinute: 2, failureTableSize: 100))
    admission.recordFailure("x", now: 0)
    #expect(admission.throttled("x", now: 1) == nil)
    admission.recordFailure("x", now: 2)
    #expect(admission.throttled("x", now: 3) == .authThrottled)
    #expect(admission.throttleRemaining("x", now: 3) == 57)
    #expect(admission.throttled("x", now: 61) == nil)
    for index in 0..<10_000 { admission.recordFailure("addr-\(index)", now: 100 + Double(index) / 1000) }
    #expect(admission.failureTableCount <= 100)
    var random = SeededRandom(seed: 1)
    for _ in 0..<100 {
      let retry = Admission.retryAfter(base: 5, random: &random)
      #expect((5...10).contains(retry))
    }
  }

  // MARK: Configuration

  @Test func authConfigurationProblemsAreReported() throws {
    var config = Configuration()
    config.auth.mode = "jwt"
    #expect(config.problems().contains { $0.hasPrefix("auth.jwt.key_file:") })
    config.auth.jwt.algorithm = "HS512"
    config.auth.jwt.keyFile = "/nonexistent"
    #expect(config.problems().contains { $0.hasPrefix("auth.jwt.algorithm:") })
    config.auth.mode = "oauth"
    #expect(config.problems().contains { $0.hasPrefix("auth.mode:") })
    config.auth.mode = "jwt"
    config.auth.jwt.algorithm = "HS256"
    #expect(config.problems().isEmpty)
    #expect(throws: ConfigurationError.self) { try config.jwtSettings() }
    config.server.trustedProxies = ["10.0.0.0/8", "proxy.local"]
    config.auth.cookieName = "a;b"
    let problems = config.problems()
    #expect(problems.contains { $0.contains("proxy.local") })
    #expect(problems.contains { $0.hasPrefix("auth.cookie_name:") })
  }

  @Test func keyFilesAreCheckedWhenRead() throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-keys-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let short = directory.appendingPathComponent("short").path
    FileManager.default.createFile(atPath: short, contents: Data("too short\n".utf8))
    #expect(throws: ConfigurationError.self) {
      try JWTSettings.load(algorithm: .hs256, keyFile: short, keysDirectory: "", audience: nil, leeway: 0)
    }
    #expect(throws: ConfigurationError.self) {
      try JWTSettings.load(algorithm: .rs256, keyFile: short, keysDirectory: "", audience: nil, leeway: 0)
    }
    let good = directory.appendingPathComponent("good").path
    FileManager.default.createFile(atPath: good, contents: Data("0123456789abcdef0123456789abcdef\r\n".utf8))
    let settings = try JWTSettings.load(algorithm: .hs256, keyFile: good, keysDirectory: "", audience: nil, leeway: 0)
    #expect(settings.keys[""]?.count == 32)
  }
}

/// Base64url segments for shape tests that need no signature.
enum TokenMinterless {
  static func segment(_ json: String) -> String {
    Data(json.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
      .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
  }
}
