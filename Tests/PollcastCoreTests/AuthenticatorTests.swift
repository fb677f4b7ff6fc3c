import Foundation
import PollcastCore
import Testing

/// The Authenticator seam without sockets: a credential in, a grant or one refusal out, whatever the mode.
@Suite(.serialized) struct AuthenticatorTests {
  let access = AccessSettings(cookieName: "pc", allowQueryToken: true)

  func ask(bearer: String? = nil, cookie: String? = nil, query: [(String, String)] = []) -> CredentialAsk {
    CredentialAsk(
      authorization: bearer.map { "Bearer \($0)" }, cookie: cookie, query: query, address: "192.0.2.7")
  }

  func decided(_ authentication: Authentication) -> Result<Grant, StreamRefusal>? {
    if case .decided(let outcome) = authentication { return outcome }
    return nil
  }

  @Test func openAccessGrantsTheSharedFeedToAnyone() {
    let open = OpenAccess()
    #expect(open.mode == "none")
    #expect(decided(open.authenticate(ask())) == .success(Grant()))
    #expect(decided(open.authenticate(ask(bearer: "anything\r\n"))) == .success(Grant()))
  }

  @Test func aMissingTokenIs401WithAChallengeAndNoThrottle() throws {
    let tokens = TokenAuthenticator(hs256(secret: "k"), access: access)
    let refusal = try #require(decided(tokens.authenticate(ask()))?.refusal)
    #expect(refusal.status == 401)
    #expect(refusal.error == "missing_token")
    #expect(refusal.failure == "missing")
    #expect(!refusal.throttles, "asking without a credential is not guessing")
    #expect(refusal.challenge == "Bearer realm=\"pollcast\"")
    #expect(refusal.message.contains("Bearer <token>") && refusal.message.contains("?access_token=<token>"))
  }

  @Test func aMalformedCredentialIsRefusedBeforeAnyCheckAndThrottles() throws {
    let tokens = TokenAuthenticator(hs256(secret: "k"), access: access)
    for hostile in [ask(cookie: "pc=a%0D%0AX: y"), ask(query: [("access_token", "a b")])] {
      let refusal = try #require(decided(tokens.authenticate(hostile))?.refusal)
      #expect(refusal.error == "malformed_credential")
      #expect(refusal.throttles && refusal.failure == "malformed_credential")
    }
    #expect(tokens.verificationCounters?.checks == 0, "no signature was checked for a malformed credential")
  }

  @Test func aBadSignatureIsInvalidTokenNamingWhy() throws {
    let tokens = TokenAuthenticator(hs256(secret: "k"), access: access)
    let forged = try hmacToken(claims: #"{"exp":4102444800}"#, secret: "other")
    let refusal = try #require(decided(tokens.authenticate(ask(bearer: forged)))?.refusal)
    #expect(refusal.error == "invalid_token")
    #expect(refusal.details == [.init(name: "reason", value: "bad_signature")])
    #expect(refusal.challenge?.contains("error_description=\"bad_signature\"") == true)
    #expect(refusal.throttles)
  }

  @Test func aGoodTokenGrantsItsStreamsSubjectAndEnd() throws {
    let tokens = TokenAuthenticator(hs256(secret: "k"), access: access)
    let exp = Date().timeIntervalSince1970.rounded(.down) + 120
    let token = try hmacToken(claims: #"{"exp":\#(Int(exp)),"sub":"ada","streams":["a","b"]}"#, secret: "k")
    let grant = try #require(try decided(tokens.authenticate(ask(bearer: token)))?.get())
    #expect(grant.feed == .shared)
    #expect(grant.streams == ["a", "b"])
    #expect(grant.subject == "ada")
    let end = try #require(grant.end)
    #expect(end.type == "token-expired")
    #expect(end.data == #"{"reason":"token_expired","expired_at":"\#(Int(exp))"}"#)
    #expect(abs(end.at - (MonotonicClock.seconds() + 120)) < 2)
    // The second time, from the cache.
    _ = decided(tokens.authenticate(ask(bearer: token)))
    #expect(tokens.verificationCounters?.checks == 1)
    #expect(tokens.verificationCounters?.cacheHits == 1)
  }

  @Test func refusalsRenderOneBodyShape() {
    let denied = StreamRefusal.forbiddenStream(String(repeating: "s", count: 300), message: "no")
    #expect(denied.status == 403 && denied.reasonPhrase == "Forbidden")
    #expect(
      denied.body(retry: nil)
        == #"{"error":"forbidden_stream","stream":"\#(String(repeating: "s", count: 256))","message":"no"}"# + "\n")
    let busy = StreamRefusal.busy("token checks", retryBase: 2)
    #expect(busy.status == 503 && busy.admission == .busy && busy.retryBase == 2)
    #expect(
      busy.body(retry: 3) == #"{"error":"busy","message":"too many token checks waiting: retry later","retry_after":3}"#
        + "\n")
    let capped = StreamRefusal.admitted(.perSubject, subjectNoun: "account", retryBase: 10)
    #expect(capped.status == 429 && capped.message == "too many streams for this account")
    #expect(capped.admission == nil, "admission control counted it already")
  }

  @Test func theSharedKeyOpensTheSharedFeedAndAnAccountKeyWithoutAccountsIsRefused() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let feed = Feed(loop: loop, settings: FeedSettings())
    let hub = FeedHub(shared: feed)
    #expect(try hub.open(Grant(), asking: ["a"]).get() === feed)
    let refusal = try #require(hub.open(Grant(feed: .account("user:1")), asking: nil).refusal)
    #expect(refusal.status == 503 && refusal.error == "max_accounts")
  }

  // MARK: Tokens

  func hs256(secret: String) -> JWTSettings {
    JWTSettings(algorithm: .hs256, keys: ["": Array(secret.utf8)], audience: nil, leeway: 0)
  }

  /// An HS256 token signed by the `openssl` command line (no crypto is written here). The input goes in a file:
  /// a pipe's write end is inherited by any child another test starts meanwhile, and its reader then never ends.
  func hmacToken(claims: String, secret: String) throws -> String {
    let input = TokenMinterless.segment(#"{"alg":"HS256","typ":"JWT"}"#) + "." + TokenMinterless.segment(claims)
    let file = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-hmac-\(UUID().uuidString)")
    try Data(input.utf8).write(to: file)
    defer { try? FileManager.default.removeItem(at: file) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
    process.arguments = ["dgst", "-sha256", "-mac", "HMAC", "-macopt", "key:\(secret)", "-binary", file.path]
    let stdout = Pipe()
    process.standardOutput = stdout
    try process.run()
    let signature = stdout.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return input + "." + TokenMinterless.segment(data: signature)
  }
}

extension Result {
  var refusal: Failure? {
    if case .failure(let failure) = self { return failure }
    return nil
  }
}

extension TokenMinterless {
  static func segment(data: Data) -> String {
    data.base64EncodedString().replacingOccurrences(of: "+", with: "-")
      .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
  }
}
