import Foundation
import Testing

@testable import PollcastCore

/// The recipe surface against hostile values: a placed value never leaves its URL path segment, a server-given
/// delay never shortens the wait, and no number from a user traps when converted.
@Suite struct RecipeSurfaceTests {
  private func url(_ template: String, credential: String) throws(UpstreamError) -> String {
    var scope = RecipeScope()
    scope.credential = credential
    return try RecipeTemplate(template).render(scope, .url)
  }

  @Test(arguments: [".", "..", "", "%2e%2E"])
  func aKeyThatWouldBeADotOrEmptySegmentIsRefusedAsAKey(key: String) throws {
    // `%2e%2E` is encoded (`%252e%252E`) and stays one plain segment; the others would leave it.
    if key.hasPrefix("%") {
      #expect(try url("http://api/users/{credential}/events", credential: key) == "http://api/users/%252e%252E/events")
      return
    }
    #expect(throws: UpstreamError.self) { try url("http://api/users/{credential}/events", credential: key) }
    do {
      _ = try url("http://api/users/{credential}", credential: key)
      Issue.record("a key of \(key) was placed at the path's end")
    } catch {
      #expect(error.kind == .invalidCredential)
      #expect(!error.message.contains(key.isEmpty ? "\u{0}" : "users/\(key)"))
    }
  }

  @Test func aDotSegmentMadeWithTheTemplatesOwnTextIsRefusedToo() {
    var scope = RecipeScope()
    scope.values["part"] = RecipeValue(text: ".")
    #expect(throws: UpstreamError.self) { try RecipeTemplate("http://api/x/.{part}/y").render(scope, .url) }
    #expect(throws: UpstreamError.self) { try RecipeTemplate("http://api/x/%2E{part}/y").render(scope, .url) }
    #expect((try? RecipeTemplate("http://api/x/v{part}/y").render(scope, .url)) == "http://api/x/v./y")
  }

  @Test func valuesInTheQueryOrInsideASegmentStayAsTheyWere() throws {
    #expect(try url("http://api/events?key={credential}", credential: "..") == "http://api/events?key=..")
    #expect(try url("http://api/u-{credential}/events", credential: "..") == "http://api/u-../events")
    #expect(
      try url("http://api/users/{credential}/events", credential: "a/../b") == "http://api/users/a%2F..%2Fb/events")
    #expect(try url("http://api/users/{credential}/events", credential: "...") == "http://api/users/.../events")
  }

  @Test(arguments: [0.0, -5, .nan, -.infinity, 0.0001])
  func aServerGivenDelayNeverShortensTheWait(asked: Double) {
    #expect(Backoff.wait(drawn: 0.7, serverAsked: asked, floor: 1) == 1)
    #expect(Backoff.wait(drawn: 3, serverAsked: asked, floor: 1) == 3)
  }

  @Test func aServerGivenDelayLengthensTheWaitWithinItsBound() {
    #expect(Backoff.wait(drawn: 0.5, serverAsked: 20, floor: 1) == 20)
    #expect(Backoff.wait(drawn: 0.5, serverAsked: .infinity, floor: 1) == UpstreamError.maxRetryAfter)
    #expect(Backoff.wait(drawn: 0.5, serverAsked: nil, floor: 1) == 0.5)
  }

  @Test(arguments: [9.3e15, 1e300, .infinity, .nan, -1, 0])
  func timeoutsOfAnySizeBecomeWholeMilliseconds(seconds: Double) {
    let millis = CurlTransport.milliseconds(seconds)
    #expect(millis >= 1 && millis <= 1_000_000_000_000)
  }

  @Test func numberSettingsPastABillionAreRefusedWithTheirKey() {
    var configuration = Configuration()
    let setting = Configuration.settings.first { $0.key == "upstream.connect_timeout_seconds" }!
    #expect(setting.applyText(&configuration, "9.3e15")?.contains("at most") == true)
    #expect(setting.applyJSON(&configuration, .number(1e300))?.contains("at most") == true)
    #expect(setting.applyText(&configuration, "30") == nil)
    #expect(configuration.upstream.connectTimeoutSeconds == 30)
  }
}
