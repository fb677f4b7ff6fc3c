import Foundation
import Testing

@testable import PollcastCore

/// What a recipe can say: negated conditions, named rules, query values given as JSON; and how `recipe check` shows
/// what an API sent.
@Suite struct RecipeWritingTests {
  private let context = Recipe.Context(environment: [:], hasCredential: false)

  private func parse(_ text: String) -> Result<Recipe, ConfigurationError> { Recipe.parse(text, context: context) }

  private func problems(_ text: String) -> [String] {
    if case .failure(let error) = parse(text) { return error.problems }
    return []
  }

  private func poll(_ recipe: Recipe, status: Int = 200, _ body: String) throws -> RecipeAnswer.PollVerdict {
    RecipeAnswer.interpretPoll(
      status: status, headers: [], text: RepairedText(Array(body.utf8)), json: try RawJSON.parse(body),
      recipe: recipe, scope: RecipeScope(cursor: 0))
  }

  @Test func aNegatedSkipKeepsOnlyWhatItNames() throws {
    let recipe = try parse(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/sync","events":{"pointer":"/events","id":{"event":"/id"},
        "skip":[{"not":{"pointer":"/type","equals":"m.room.message"}}]}}}
      """
    ).get()
    let verdict = try poll(
      recipe, #"{"events":[{"id":1,"type":"m.room.message"},{"id":2,"type":"m.typing"},{"id":3}]}"#)
    guard case .answer(let answer) = verdict.action else {
      Issue.record("\(verdict.action)")
      return
    }
    #expect(answer.batches.first?.messages.map(\.id) == [1])
    #expect(answer.rejected.map(\.id) == [2, 3])
  }

  @Test func aNegatedWhenAndExistsFalseMatchWhatIsMissing() throws {
    let recipe = try parse(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","events":{"pointer":"/e","id":{"event":"/id"}}},
       "rules":[{"status":200,"when":{"not":{"pointer":"/ok","equals":true}},"do":"retry"},
                {"status":200,"when":{"pointer":"/e","exists":false},"do":"empty"}]}
      """
    ).get()
    guard case .error(let error) = try poll(recipe, #"{"ok":false,"e":[{"id":1}]}"#).action else {
      Issue.record("a not-ok answer was taken")
      return
    }
    #expect(error.message.contains("says retry"))
    guard case .answer(let answer) = try poll(recipe, #"{"ok":true}"#).action else {
      Issue.record("an answer with no events was not empty")
      return
    }
    #expect(answer.isEmpty)
    guard case .answer(let taken) = try poll(recipe, #"{"ok":true,"e":[{"id":4}]}"#).action else {
      Issue.record("an ok answer was refused")
      return
    }
    #expect(taken.batches.first?.messages.map(\.id) == [4])
  }

  @Test func aNotHoldsOneConditionAndNothingElse() {
    let base = #"{"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","events":{"pointer":"/e","id":{"event":"/id"}}},"#
    let nested = problems(base + #""rules":[{"when":{"not":{"not":{"pointer":"/a","equals":1}}},"do":"retry"}]}"#)
    #expect(nested.contains { $0.hasPrefix("recipe.rules[0].when.not.not: a not inside a not") }, "\(nested)")
    let beside = problems(
      base + #""rules":[{"when":{"not":{"pointer":"/a","equals":1},"pointer":"/b"},"do":"retry"}]}"#)
    #expect(beside.contains { $0.hasPrefix("recipe.rules[0].when") && $0.contains("pointer") }, "\(beside)")
  }

  @Test func aNamedRuleGivesItsNameToResetsAndLogsAndNamesAreChecked() throws {
    let recipe = try parse(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","events":{"pointer":"/e","id":{"event":"/id"}}},
       "rules":[{"status":200,"when":{"pointer":"/x","exists":true},"do":"continue"},
                {"name":"index_went_back","status":409,"do":"reset","to":{"body":"/index"},"gap":true}]}
      """
    ).get()
    let verdict = try poll(recipe, status: 409, #"{"index":7}"#)
    #expect(verdict.rule == "index_went_back")
    guard case .answer(let answer) = verdict.action else {
      Issue.record("\(verdict.action)")
      return
    }
    #expect(answer.resets.map(\.reason) == ["recipe_index_went_back"])
    #expect(answer.resets.map(\.to) == [7])
    // An unnamed rule keeps its place as its reason.
    #expect(recipe.rules[0].reason == "recipe_rules[0]")
    let base = #"{"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","events":{"pointer":"/e","id":{"event":"/id"}}},"#
    let bad = problems(
      base + #""rules":[{"name":"a b\"","do":"retry"},{"name":"dup","do":"retry"},{"name":"dup","do":"fail"}]}"#)
    #expect(bad.contains { $0.hasPrefix("recipe.rules[0].name:") }, "\(bad)")
    #expect(bad.contains { $0.hasPrefix("recipe.rules[2].name:") && $0.contains("unique") }, "\(bad)")
    #expect(!bad.contains { $0.hasPrefix("recipe.rules[1].name") }, "\(bad)")
  }

  @Test func checkTextEscapesControlBytesAndCutsLongBodies() {
    #expect(CheckText.printable("a\u{1B}[2Jb\r\nc\u{7F}") == #"a\u{1b}[2Jb\r\nc\u{7f}"#)
    let shown = CheckText.shown(
      Array(("token=S3CRETVALUE " + String(repeating: "x", count: 900)).utf8), redact: ["S3CRETVALUE"])
    #expect(!shown.contains("S3CRET"))
    #expect(shown.hasSuffix("… (918 bytes)"))
    #expect(shown.hasPrefix("token=[redacted] x"))
  }

  @Test func aQueryValueGivenAsJSONIsSentAsCompactJSONPercentEncoded() throws {
    let recipe = try parse(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/sync","query":{"filter":{"room":{"timeline":{"limit":50}}},
        "full_state":false,"timeout":30000,"since":"{cursor}"},"events":{"pointer":"/e","format":"raw"}},
       "cursor":{"type":"opaque","value":{"body":"/next_batch"}}}
      """
    ).get()
    var scope = RecipeScope()
    scope.opaque = true
    scope.token = "s72_4"
    let request = try RecipeRequest.build(
      recipe.poll, scope, recipe: recipe, timeout: 30, connectTimeout: 5, label: "poll")
    #expect(
      request.url
        == "http://127.0.0.1:9/sync?filter=%7B%22room%22%3A%7B%22timeline%22%3A%7B%22limit%22%3A50%7D%7D%7D"
        + "&full_state=false&since=s72_4&timeout=30000")
    let refused = problems(
      #"{"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","query":{"f":{"a":"{cursor}"}},"#
        + #""events":{"pointer":"/e","id":{"event":"/id"}}}}"#)
    #expect(refused.contains { $0.hasPrefix("recipe.poll.query.f: a value given as JSON is sent as written") })
  }

  @Test func anExtractMarkedNotSecretIsShownAndTheOthersStayRedacted() throws {
    let recipe = try parse(
      """
      {"recipe":1,"session":[{"url":"http://127.0.0.1:9/login","extract":{"token":{"body":"/t"},
         "since":{"body":"/next_batch","secret":false}}}],
       "poll":{"url":"http://127.0.0.1:9/p","headers":{"Authorization":"Bearer {token}"},"query":{"s":"{since}"},
         "events":{"pointer":"/e","id":{"event":"/id"}}}}
      """
    ).get()
    #expect(recipe.secretSessionNames == ["token"])
    #expect(RecipeStorage(recipe).secretNames == ["token"])
    let misplaced = problems(
      #"{"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","events":{"pointer":"/e","id":{"event":"/id","secret":false}}}}"#
    )
    #expect(misplaced.contains { $0.hasPrefix("recipe.poll.events.id.secret: a boolean, and only on a session") })
  }

  @Test func nowAndNonceAreNewForEveryRequest() throws {
    let recipe = try parse(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/p","query":{"t":"{now}","n":"{nonce}","fixed":"1"},
        "events":{"pointer":"/e","id":{"event":"/id"}}}}
      """
    ).get()
    func query(_ name: String, _ url: String) -> String? {
      URLComponents(string: url)?.queryItems?.first { $0.name == name }?.value
    }
    let before = UInt64(Date().timeIntervalSince1970 * 1000)
    let prefix = RecipeRequest.prefix(recipe.poll, RecipeScope(), recipe: recipe)
    #expect(prefix?.dynamic.map(\.0).sorted() == ["n", "t"], "neither is fixed once a session")
    let first = try RecipeRequest.build(
      recipe.poll, RecipeScope(), recipe: recipe, timeout: 30, connectTimeout: 5, label: "poll", prefix: prefix)
    let second = try RecipeRequest.build(
      recipe.poll, RecipeScope(), recipe: recipe, timeout: 30, connectTimeout: 5, label: "poll", prefix: prefix)
    let now = try #require(query("t", first.url).flatMap { UInt64($0) })
    #expect(now >= before && now <= before + 60_000)
    let nonces = [query("n", first.url), query("n", second.url)]
    #expect(nonces.allSatisfy { $0?.count == 16 } && nonces[0] != nonces[1], "\(nonces)")
    #expect(query("fixed", second.url) == "1")
  }
}
