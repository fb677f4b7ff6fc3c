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

/// Per-user recipes bind the account to the key: `user` comes from a session answer to a request that sent it.
@Suite struct RecipeUserBindingTests {
  private func recipe(session: String, user: String) throws -> Recipe {
    let text = """
      {"recipe":1,"session":[\(session)],
       "poll":{"url":"http://127.0.0.1:9/poll","headers":{"Authorization":"Bearer {credential}"},
         "query":{"since":"{cursor}"},"events":{"pointer":"/items","id":{"event":"/id"}}},
       "user":"\(user)"}
      """
    return try Recipe.parse(text, context: Recipe.Context(environment: [:], hasCredential: true)).get()
  }

  @Test func aUserFromAStepThatSentTheKeyOrFromItsTokenIsBound() throws {
    let direct = try recipe(
      session: #"{"url":"http://127.0.0.1:9/me","headers":{"X-Key":"{credential}"},"extract":{"id":{"body":"/id"}}}"#,
      user: "{id}")
    #expect(direct.userBindingProblem == nil)
    let chained = try recipe(
      session: #"{"url":"http://127.0.0.1:9/login?key={credential}","extract":{"token":{"body":"/t"}}},"#
        + #"{"url":"http://127.0.0.1:9/me","headers":{"X-Token":"{token}"},"extract":{"id":{"body":"/id"}}}"#,
      user: "tenant-{id}")
    #expect(chained.userBindingProblem == nil)
    let builtIn = try Recipe.parse(Recipe.chatText, context: Recipe.Context(environment: [:], hasCredential: true))
      .get()
    #expect(builtIn.userBindingProblem == nil)
  }

  @Test func aUserFromAStepThatNeverSawTheKeyIsRefused() throws {
    let tenant = try recipe(
      session: #"{"url":"http://127.0.0.1:9/tenant","extract":{"tenant":{"body":"/id"}}}"#, user: "{tenant}")
    #expect(tenant.userBindingProblem?.contains("session step that sends {credential}") == true)
    let fixed = try recipe(
      session: #"{"url":"http://127.0.0.1:9/me","headers":{"X-Key":"{credential}"},"extract":{"id":{"body":"/id"}}}"#,
      user: "alice")
    #expect(fixed.userBindingProblem != nil)
  }

  @Test func theKeyItselfNeverNamesAnAccount() throws {
    let named = try recipe(
      session: #"{"url":"http://127.0.0.1:9/me","headers":{"X-Key":"{credential}"},"extract":{"id":{"body":"/id"}}}"#,
      user: "{credential}")
    #expect(named.userBindingProblem?.contains("must not hold {credential}") == true)
  }
}

/// What identifies an API in a store, in errors and in `/readyz` holds no secret from the environment.
@Suite struct RecipeIdentityTests {
  @Test func aSecretVarFromTheEnvironmentStaysAPlaceholderInTheIdentity() throws {
    let text = """
      {"recipe":1,"vars":{"base":"{env:BASE}","token":"{env:TG_TOKEN}","tag":"{env:TAG:-orders}"},
       "poll":{"url":"{base}/bot{token}/getUpdates/{tag}","query":{"offset":"{next}"},
         "events":{"pointer":"/result","id":{"event":"/update_id"}}}}
      """
    let context = Recipe.Context(
      environment: ["BASE": "http://127.0.0.1:9", "TG_TOKEN": "123456:S3CRET-token"], hasCredential: false)
    let recipe = try Recipe.parse(text, context: context).get()
    #expect(recipe.identityURL == "http://127.0.0.1:9/bot{token}/getUpdates/orders")
    #expect(!recipe.identityURL.contains("S3CRET"))
  }
}

/// Secrets are hidden whole, in every spelling, wherever a text is shown.
@Suite struct RedactionTests {
  @Test func overlappingSecretsAreHiddenLongestFirst() {
    let shown = UpstreamResponse.scrub("key=4711.S3CRETPART user=4711", ["4711", "4711.S3CRETPART"])
    #expect(shown == "key=[redacted] user=[redacted]")
  }

  @Test func jsonEscapedAndPercentEncodedSecretsAreHiddenToo() {
    let secret = "abcd/SLASH\"q"
    let shown = UpstreamResponse.scrub(
      #"{"echo":"abcd\/SLASH\"q","raw":"abcd/SLASH\"q"} abcd%2FSLASH%22q"#, [secret])
    #expect(shown == #"{"echo":"[redacted]","raw":"[redacted]"} [redacted]"#)
  }

  @Test func aSessionAnswerWithoutAnExtractedValueIsNamedByItsMembersNotItsValues() {
    let body = #"{"fresh_token":"T0KEN-never-shown","ok":true}"#
    let shape = RecipeAnswer.shape(try? RawJSON.parse(body))
    #expect(shape.contains("fresh_token"))
    #expect(!shape.contains("T0KEN"))
  }
}

/// A value the API gives for the relay to send back (a cursor part, a session token) with a control byte is a
/// hostile answer: refused where it is read, never kept or stored, so the next poll or session starts clean.
@Suite struct HostileAnswerValueTests {
  static let nchan = """
    {"recipe":1,"poll":{"url":"http://127.0.0.1:9/sub","headers":{"If-Modified-Since":"{cursor.modified}",
       "If-None-Match":"{cursor.etag}"},"events":{"pointer":"","format":"raw"}},
     "cursor":{"type":"opaque","value":{"modified":{"header":"Last-Modified"},"etag":{"header":"Etag"}}}}
    """

  @Test(arguments: ["0\u{7F}", "0\r\nX-Evil: 1", "a\u{0}b"])
  func aCursorPartWithAControlByteRefusesTheAnswer(etag: String) throws {
    let recipe = try Recipe.parse(Self.nchan, context: Recipe.Context(environment: [:], hasCredential: false)).get()
    let verdict = RecipeAnswer.interpretPoll(
      status: 200, headers: [("Last-Modified", "Mon, 07 Dec 2026 10:00:00 GMT"), ("Etag", etag)],
      text: RepairedText(Array("hello".utf8)), json: nil, recipe: recipe, scope: RecipeScope())
    guard case .error(let error) = verdict.action else {
      Issue.record("the answer was taken: \(verdict.action)")
      return
    }
    #expect(error.message.contains("control byte"))
    #expect(!error.description.contains(etag))
    // A clean Etag is taken as the next cursor.
    let clean = RecipeAnswer.interpretPoll(
      status: 200, headers: [("Last-Modified", "Mon, 07 Dec 2026 10:00:00 GMT"), ("Etag", "0\t1")],
      text: RepairedText(Array("hello".utf8)), json: nil, recipe: recipe, scope: RecipeScope())
    guard case .answer(let answer) = clean.action else {
      Issue.record("a clean answer was refused: \(clean.action)")
      return
    }
    #expect(answer.tokens.values.first?.contains("0\\t1") == true)
  }

  @Test func aResetToACursorWithAControlByteIsRefused() throws {
    let text = """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/sub","headers":{"If-None-Match":"{cursor}"},
         "events":{"pointer":"","format":"raw"}},
       "cursor":{"type":"opaque","value":{"header":"Etag"}},
       "rules":[{"status":409,"do":"reset","to":{"header":"X-Cursor"},"gap":true}]}
      """
    let recipe = try Recipe.parse(text, context: Recipe.Context(environment: [:], hasCredential: false)).get()
    let verdict = RecipeAnswer.interpretPoll(
      status: 409, headers: [("X-Cursor", "c\u{7F}1")], text: RepairedText([]), json: nil, recipe: recipe,
      scope: RecipeScope())
    guard case .error(let error) = verdict.action else {
      Issue.record("the reset was taken: \(verdict.action)")
      return
    }
    #expect(error.message.contains("control byte"))
  }

  @Test func aSessionTokenWithCRLFFailsTheSessionInsteadOfEveryPollAfter() throws {
    let step = Recipe.Step(
      label: "session", method: "POST", url: RecipeTemplate("http://127.0.0.1:9/s"), query: [], headers: [], body: nil,
      timeout: nil, extract: [("token", Recipe.Source(origin: .body("/token")))])
    let body = #"{"token":"abc\r\nX-Evil: 1","blob":{"a":1}}"#
    let outcome = RecipeAnswer.interpretSession(
      status: 200, headers: [], text: RepairedText(Array(body.utf8)), json: try RawJSON.parse(body), step: step,
      rules: [], scope: RecipeScope(), path: "recipe.session[0]")
    guard case .failure(let error) = outcome.values else {
      Issue.record("the token was kept")
      return
    }
    #expect(error.message.contains("control byte"))
  }
}

/// Reading an answer never holds the loop for long, whatever the recipe: the more `*` conditions, the smaller an
/// answer read on the loop; more than `maxRules` rules do not load; empty URLs and empty action lists do not load.
@Suite struct RecipeWorkBoundTests {
  private func recipe(rules: String, url: String = "http://127.0.0.1:9/poll") -> Result<Recipe, ConfigurationError> {
    Recipe.parse(
      """
      {"recipe":1,"vars":{"empty":""},"poll":{"url":"\(url)","query":{"since":"{cursor}"},
        "events":{"pointer":"/items","id":{"event":"/id"}}},"rules":[\(rules)]}
      """, context: Recipe.Context(environment: [:], hasCredential: false))
  }

  @Test func wildcardConditionsMoveLargeAnswersOffTheLoop() throws {
    let star = #"{"status":200,"when":{"pointer":"/items/*/kind","equals":"x"},"do":"continue"}"#
    let heavy = RecipeStorage(try recipe(rules: Array(repeating: star, count: 100).joined(separator: ",")).get())
    let light = RecipeStorage(try recipe(rules: "").get())
    let answer = UpstreamResponse(status: 200, body: Array(repeating: 0x20, count: 8 << 10), duration: 0)
    #expect(light.readingWeight == 1)
    #expect(heavy.readingWeight == 101)
    #expect(RecipeAnswer.decodesHere(answer, weight: light.readingWeight))
    #expect(!RecipeAnswer.decodesHere(answer, weight: heavy.readingWeight))
  }

  @Test func tooManyRulesEmptyURLsAndEmptyActionListsAreRefusedAtLoad() {
    let rule = #"{"status":500,"do":"retry"}"#
    guard case .failure(let many) = recipe(rules: Array(repeating: rule, count: 101).joined(separator: ",")) else {
      Issue.record("101 rules loaded")
      return
    }
    #expect(many.problems.contains { $0.hasPrefix("recipe.rules: 101 rules") })
    guard case .failure(let empty) = recipe(rules: "", url: "") else {
      Issue.record("an empty URL loaded")
      return
    }
    #expect(empty.problems.contains { $0.hasPrefix("recipe.poll.url: empty") })
    guard case .failure(let blank) = recipe(rules: "", url: "{empty}/poll") else {
      Issue.record("a URL from an empty var loaded")
      return
    }
    #expect(blank.problems.contains { $0.contains("does not make an http:// or https:// URL") })
    guard case .failure(let nothing) = recipe(rules: #"{"status":500,"do":[]}"#) else {
      Issue.record("an empty action list loaded")
      return
    }
    #expect(nothing.problems.contains { $0.hasPrefix("recipe.rules[0].do: an empty list") })
  }
}

/// A URL an answer chooses moves polls only among the hosts the recipe writes and `upstream.allowed_hosts` lists.
@Suite struct AllowedHostsTests {
  static let vk = """
    {"recipe":1,"vars":{"base":"http://127.0.0.1:9"},
     "session":[{"url":"{base}/getServer","headers":{"X-Api-Key":"k"},"extract":{"server":{"body":"/server"}}}],
     "poll":{"url":"{server}","query":{"ts":"{cursor}"},"events":{"pointer":"/updates","id":{"event":"/id"}}}}
    """

  private func request(to server: String, configured: [String] = []) throws -> Result<UpstreamRequest, UpstreamError> {
    var recipe = try Recipe.parse(Self.vk, context: Recipe.Context(environment: [:], hasCredential: false)).get()
    recipe.configuredHosts = configured
    let storage = RecipeStorage(recipe)
    var scope = RecipeScope()
    scope.values["server"] = RecipeValue(text: server)
    scope.cursor = 5
    return Result { () throws(UpstreamError) in
      try RecipeRequest.build(
        recipe.poll, scope, vars: storage.varNames, headerNames: [], timeout: 5, connectTimeout: 1, label: "poll",
        hosts: storage.allowedHosts)
    }
  }

  @Test func anAnswerMayNameOnlyAHostTheRecipeWritesOrTheOperatorListed() throws {
    #expect((try? request(to: "http://127.0.0.1:9/lp").get())?.url == "http://127.0.0.1:9/lp?ts=5")
    #expect(throws: UpstreamError.self) { try request(to: "http://collector.example/lp").get() }
    #expect(throws: UpstreamError.self) { try request(to: "http://127.0.0.1:6379/").get() }
    #expect(throws: UpstreamError.self) { try request(to: "file:///etc/passwd").get() }
    #expect(throws: UpstreamError.self) { try request(to: "http://127.0.0.1:9@evil.example/").get() }
    let listed = try request(to: "https://lp.example:8443/x", configured: ["lp.example"]).get()
    #expect(listed.url.hasPrefix("https://lp.example:8443/x"))
  }

  @Test func configuredEntriesAreHostsNotURLs() {
    #expect(AllowedHosts.problem(inEntry: "lp.example") == nil)
    #expect(AllowedHosts.problem(inEntry: "lp.example:8443") == nil)
    #expect(AllowedHosts.problem(inEntry: "[::1]:80") == nil)
    #expect(AllowedHosts.problem(inEntry: "http://lp.example") != nil)
    #expect(AllowedHosts.problem(inEntry: "lp.example/path") != nil)
  }
}

/// A recipe says which answers refuse a key (`refuse_key`): the error is the one a 401 gives a key.
@Suite struct RefuseKeyRuleTests {
  @Test func aRuleCanSayThatA404RefusesTheKey() throws {
    let text = """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/bot{credential}/getUpdates","query":{"offset":"{next}"},
        "events":{"pointer":"/result","id":{"event":"/update_id"}}},
       "rules":[{"status":404,"do":"refuse_key"}]}
      """
    let recipe = try Recipe.parse(text, context: Recipe.Context(environment: [:], hasCredential: true)).get()
    let body = #"{"ok":false,"error_code":404}"#
    let verdict = RecipeAnswer.interpretPoll(
      status: 404, headers: [], text: RepairedText(Array(body.utf8)), json: try RawJSON.parse(body), recipe: recipe,
      scope: RecipeScope())
    guard case .error(let error) = verdict.action else {
      Issue.record("\(verdict.action)")
      return
    }
    #expect(error.kind == .invalidCredential)
    #expect(error.refusesKey(stopWhenRefused: false))
    #expect(verdict.rule == "recipe.rules[0]")
  }
}
