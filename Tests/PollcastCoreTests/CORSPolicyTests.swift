import Testing

@testable import PollcastCore

@Suite struct CORSPolicyTests {
  @Test func listedOriginIsEchoedWithVary() {
    let policy = CORSPolicy(allowedOrigins: ["https://app.example.com"])
    let headers = Dictionary(uniqueKeysWithValues: policy.responseHeaders(origin: "https://APP.example.com"))
    #expect(headers["Access-Control-Allow-Origin"] == "https://APP.example.com")
    #expect(headers["Vary"] == "Origin")
    #expect(headers["Access-Control-Allow-Credentials"] == nil)
    #expect(headers["Access-Control-Expose-Headers"] == "X-Pollcast-Head-Id")
  }

  @Test func unlistedOrMissingOriginGetsNoCORSHeaders() {
    let policy = CORSPolicy(allowedOrigins: ["https://app.example.com"])
    #expect(policy.responseHeaders(origin: "https://evil.example.com").isEmpty)
    #expect(policy.responseHeaders(origin: "https://app.example.com.evil.net").isEmpty)
    #expect(policy.responseHeaders(origin: nil).isEmpty)
    #expect(CORSPolicy().responseHeaders(origin: "https://app.example.com").isEmpty)
  }

  @Test func wildcardWithoutCredentialsSendsStar() {
    let headers = Dictionary(
      uniqueKeysWithValues: CORSPolicy(allowedOrigins: ["*"]).responseHeaders(origin: "https://x.y"))
    #expect(headers["Access-Control-Allow-Origin"] == "*")
  }

  @Test func credentialsNeverGoWithStar() {
    let policy = CORSPolicy(allowedOrigins: ["https://a.example"], allowCredentials: true)
    let headers = Dictionary(uniqueKeysWithValues: policy.responseHeaders(origin: "https://a.example"))
    #expect(headers["Access-Control-Allow-Origin"] == "https://a.example")
    #expect(headers["Access-Control-Allow-Credentials"] == "true")
    var config = Configuration()
    config.cors.allowedOrigins = ["*"]
    config.cors.allowCredentials = true
    #expect(config.problems().contains { $0.hasPrefix("cors.allow_credentials") })
  }

  @Test func preflightAllowsLastEventIDAndCacheControl() throws {
    let policy = CORSPolicy(allowedOrigins: ["https://a.example"], maxAge: 120)
    let answer = policy.preflight(
      origin: "https://a.example", requestMethod: "GET", requestHeaders: "last-event-id, Cache-Control")
    guard case .allowed(let headers) = answer else {
      Issue.record("expected allowed, got \(answer)")
      return
    }
    let byName = Dictionary(uniqueKeysWithValues: headers.map { ($0.name, $0.value) })
    #expect(byName["Access-Control-Allow-Origin"] == "https://a.example")
    #expect(byName["Access-Control-Allow-Headers"] == "Last-Event-ID, Cache-Control, Authorization")
    #expect(byName["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS")
    #expect(byName["Access-Control-Max-Age"] == "120")
    #expect(byName["Vary"] == "Origin")
  }

  @Test func preflightRefusesOtherOriginsMethodsAndHeaders() {
    let policy = CORSPolicy(allowedOrigins: ["https://a.example"])
    #expect(isRefused(policy.preflight(origin: "https://b.example", requestMethod: "GET", requestHeaders: nil)))
    #expect(isRefused(policy.preflight(origin: "https://a.example", requestMethod: "POST", requestHeaders: nil)))
    #expect(
      isRefused(policy.preflight(origin: "https://a.example", requestMethod: "GET", requestHeaders: "X-Evil")))
  }

  private func isRefused(_ answer: CORSPolicy.Preflight) -> Bool {
    if case .refused = answer { return true }
    return false
  }
}
