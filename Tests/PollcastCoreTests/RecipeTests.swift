import Foundation
import Testing

@testable import PollcastCore

/// Recipes without sockets: what validation names, how templates place values, and what each answer means.
@Suite struct RecipeTests {
  let context = Recipe.Context(
    environment: ["TG_TOKEN": "123:abc-secret", "BASE": "http://127.0.0.1:9"], hasCredential: false)

  func parse(_ text: String, context: Recipe.Context? = nil) -> Result<Recipe, ConfigurationError> {
    Recipe.parse(text, context: context ?? self.context)
  }

  func recipe(_ text: String) throws -> Recipe {
    switch parse(text) {
    case .success(let recipe): return recipe
    case .failure(let error): throw error
    }
  }

  func problems(_ text: String, context: Recipe.Context? = nil) -> [String] {
    if case .failure(let error) = parse(text, context: context) { return error.problems }
    return []
  }

  static let etcd = """
    {"recipe":1,"name":"etcd","stream":"config","vars":{"base":"http://127.0.0.1:2379","key":"/config"},
     "session":[{"url":"{base}/v2/keys{key}","extract":{"index":{"header":"X-Etcd-Index"}}}],
     "poll":{"url":"{base}/v2/keys{key}","query":{"wait":"true","waitIndex":"{next}"},
       "events":{"pointer":"","id":{"event":"/node/modifiedIndex"}}},
     "cursor":{"type":"integer","initial":{"from":"session","name":"index"}},
     "rules":[{"step":"session","status":404,"do":"continue"},
       {"status":400,"when":{"pointer":"/errorCode","equals":401},"do":"reset","to":{"header":"X-Etcd-Index"},"gap":true},
       {"status":400,"when":{"pointer":"/errorCode","equals":400},"do":"retry"}]}
    """

  static let telegram = """
    {"recipe":1,"vars":{"base":"{env:BASE}"},
     "poll":{"url":"{base}/bot{env:TG_TOKEN}/getUpdates","query":{"offset":"{next}","timeout":"25"},
       "events":{"pointer":"/result","id":{"event":"/update_id"},"skip":[{"pointer":"/kind","equals":"heartbeat"}]}},
     "rules":[{"status":429,"do":"retry","after":{"body":"/parameters/retry_after"}}]}
    """

  // MARK: Validation

  @Test func theExamplesValidate() throws {
    let etcd = try recipe(RecipeTests.etcd)
    #expect(etcd.session.count == 1 && etcd.rules.count == 3 && etcd.stream == "config")
    #expect(etcd.identityURL == "http://127.0.0.1:2379/v2/keys/config")
    let telegram = try recipe(RecipeTests.telegram)
    #expect(telegram.vars["base"]?.text == "http://127.0.0.1:9", "vars read the environment at load")
    #expect(telegram.name == "recipe" && telegram.stream == "default")
    for file in [
      "etcd-v2.json", "telegram.json", "consul.json", "couchdb.json", "nchan.json", "vk.json", "zulip.json",
      "dropbox.json",
    ] {
      let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
        "../../Config/recipes/\(file)"
      ).path
      guard let data = FileManager.default.contents(atPath: path) else {
        Issue.record("\(file) is missing")
        continue
      }
      let environment = [
        "ETCD_URL": "http://127.0.0.1:2379", "TELEGRAM_API": "http://127.0.0.1:1", "TELEGRAM_TOKEN": "123:abc",
        "CONSUL_URL": "http://127.0.0.1:8500", "CONSUL_TOKEN": "t0ken-1", "ZULIP_URL": "http://127.0.0.1:1",
        "VK_GROUP": "1", "VK_TOKEN": "vk-token", "ZULIP_BASIC": "Ym90OmtleQ==", "DROPBOX_TOKEN": "sl.token",
      ]
      let parsed = Recipe.parse(
        String(decoding: data, as: UTF8.self), context: Recipe.Context(environment: environment, hasCredential: false))
      if case .failure(let error) = parsed { Issue.record("\(file): \(error)") }
    }
  }

  @Test func everyProblemIsNamedByItsPath() {
    let found = problems(
      """
      {"recipe":1,"colour":"red",
       "poll":{"url":"http://h/p","query":{"since":"{since}"},"verb":"GET",
         "events":{"pointer":"results","id":{"event":"/id"}}},
       "cursor":{"type":"opaque"},
       "rules":[{"status":700,"do":"retry"},{"step":"fetch","do":"empty"},{"do":"explode"},
                {"when":{"pointer":"/a","in":[]},"do":"empty"}]}
      """)
    let expected = [
      "recipe.colour: unknown key",
      "recipe.poll.verb: unknown key",
      "recipe.poll.events.pointer: \"results\" is not a JSON pointer",
      "recipe.cursor.value: required for an opaque cursor",
      "recipe.rules[0].status: a number is not a status code",
      "recipe.rules[1].step: the recipe has no fetch step to match",
      "recipe.rules[2].do: \"explode\" is not one of",
      "recipe.rules[3].when.in: expected a non-empty array",
      "recipe.poll.query.since: {since} but no var or earlier session step's extract defines since",
    ]
    for text in expected {
      #expect(found.contains { $0.hasPrefix(text) }, "missing: \(text)\nin: \(found.joined(separator: "\n"))")
    }
  }

  @Test func aCursorBoundToItsSessionKeepsEverySessionValueThePollUses() {
    let found = problems(
      """
      {"session":[{"url":"http://h/register","extract":{"queue":{"body":"/q"},"key":{"body":"/k"},"last":{"body":"/l"}}}],
       "poll":{"url":"http://h/events","query":{"queue_id":"{queue}","key":"{key}","last":"{cursor}"},
         "events":{"pointer":"/events","id":{"event":"/id"}}},
       "cursor":{"type":"opaque","value":{"event":"/id"},"initial":{"from":"session","name":"last"},
         "session":["queue","nope"]}}
      """)
    #expect(found.contains { $0.hasPrefix("recipe.poll.query.key: {key} is a session value the cursor does not keep") })
    #expect(found.contains { $0.hasPrefix("recipe.cursor.session[1]: session value \"nope\" is not extracted") })
    #expect(!found.contains { $0.contains("{queue}") }, "\(found)")
    let integer = problems(
      """
      {"poll":{"url":"http://h/p","events":{"pointer":"/e","id":{"event":"/id"}}},"cursor":{"session":["q"]}}
      """)
    #expect(integer.contains { $0.hasPrefix("recipe.cursor.session: only for an opaque cursor") })
  }

  @Test func anAccountsScopeReadsTheSessionBeforeTheRecipesVars() throws {
    // The scope keeps the vars and the session's values side by side (not merged): a session value wins over a var
    // of the same name, every other var is still read, and the session's values are secrets.
    let recipe = try recipe(
      """
      {"vars":{"base":"http://h","queue":"fallback"},
       "session":[{"url":"{base}/register","extract":{"queue":{"body":"/q"}}}],
       "poll":{"url":"{base}/events","query":{"queue_id":"{queue}","last":"{cursor}"},
         "events":{"pointer":"/events","id":{"event":"/id"}}},
       "cursor":{"type":"opaque","value":{"event":"/id"},"session":["queue"]}}
      """)
    let adapter = RecipeAdapter(recipe: recipe, environment: [:], credential: nil)
    #expect(adapter.scope()["queue"]?.text == "fallback")
    adapter.restore(tokens: [recipe.stream: RecipeAdapter.bind("c-1", session: ["queue": "q-live-7"])])
    let scope = adapter.scope()
    #expect(scope["queue"]?.text == "q-live-7")
    #expect(scope["base"]?.text == "http://h")
    #expect(scope["nope"] == nil)
    #expect(scope.redactions == ["q-live-7"])
    let request = try RecipeRequest.build(
      recipe.poll, adapter.scope(cursor: 3), recipe: recipe, timeout: 5, connectTimeout: 1, label: "poll")
    #expect(request.url == "http://h/events?last=3&queue_id=q-live-7")
  }

  @Test func aFetchStepTakesTheEventsAndOnlyItsRulesMayFetch() throws {
    let found = problems(
      """
      {"poll":{"url":"http://h/longpoll","events":{"pointer":"/e","id":{"event":"/id"}}},
       "fetch":{"url":"http://h/continue","json":{"cursor":"{cursor}"},"events":{"pointer":"/entries"},
         "repeat_while":{"pointer":"/has_more","equal":true}},
       "cursor":{"type":"opaque","value":{"body":"/cursor"}},
       "rules":[{"step":"fetch","do":"fetch"},{"do":"session"}]}
      """)
    #expect(found.contains { $0.hasPrefix("recipe.poll.events: with a fetch step, the events come from recipe.fetch") })
    #expect(found.contains { $0.hasPrefix("recipe.fetch.repeat_while.equal: unknown key") })
    #expect(found.contains { $0.hasPrefix("recipe.rules[0].do: fetch follows a poll's answer") })
    let noFetch = problems(
      """
      {"poll":{"url":"http://h/p","events":{"pointer":"/e","id":{"event":"/id"}}},
       "rules":[{"step":"fetch","do":"empty"},{"do":"fetch"},{"do":"fail","after":{"const":1}}]}
      """)
    #expect(noFetch.contains { $0.hasPrefix("recipe.rules[0].step: the recipe has no fetch step") })
    #expect(noFetch.contains { $0.hasPrefix("recipe.rules[1].do: fetch but the recipe has no fetch step") })
    #expect(noFetch.contains { $0.hasPrefix("recipe.rules[2].after: only with do: retry") })
    let dropbox = try recipe(
      """
      {"poll":{"method":"POST","url":"http://h/longpoll","json":{"cursor":"{cursor}"}},
       "fetch":{"method":"POST","url":"http://h/continue","json":{"cursor":"{cursor}"},
         "events":{"pointer":"/entries","id":{"event":"/id"}},"repeat_while":{"pointer":"/has_more","equals":true}},
       "cursor":{"type":"opaque","value":{"body":"/cursor"},"initial":{"const":"c0"}},
       "rules":[{"when":{"pointer":"/changes","equals":true},"do":"fetch","after":{"body":"/backoff"}},
                {"when":{"pointer":"/changes","equals":false},"do":"empty","after":{"body":"/backoff"}}]}
      """)
    func verdict(_ body: String, step: String) -> RecipeAnswer.PollVerdict {
      let text = RepairedText(Array(body.utf8))
      return RecipeAnswer.interpretPoll(
        status: 200, headers: [], text: text, json: try? RawJSON.parse(body), recipe: dropbox, scope: RecipeScope(),
        step: step)
    }
    let news = verdict(#"{"changes":true,"backoff":5}"#, step: "poll")
    guard case .fetch = news.action else {
      Issue.record("a change is fetched: \(news.action)")
      return
    }
    #expect(news.after == 5)
    guard case .answer(let quiet) = verdict(#"{"changes":false,"backoff":2}"#, step: "poll").action else {
      Issue.record("no change is no news")
      return
    }
    #expect(quiet.isEmpty && quiet.nextPollAfter == 2)
    let page = verdict(#"{"entries":[{"id":"a"},{"id":"b"}],"cursor":"c2","has_more":true}"#, step: "fetch")
    guard case .answer(let answer) = page.action else {
      Issue.record("a page relays its entries")
      return
    }
    #expect(answer.batches.first?.messages.count == 2 && answer.tokens == ["default": "c2"] && page.more)
    #expect(!verdict(#"{"entries":[],"cursor":"c3","has_more":false}"#, step: "fetch").more)
  }

  @Test func anIntegerOpaqueCursorIsANumberInAJSONBody() {
    for (token, json) in [
      ("-1", "-1"), ("42", "42"), ("0", "0"), ("007", "\"007\""), ("-0", "\"-0\""), ("--1", "\"--1\""),
      ("4-2", "\"4-2\""),
      ("AAH1", "\"AAH1\""), ("", "\"\""), ("99999999999999999999", "\"99999999999999999999\""),
    ] {
      #expect(RecipeScope.opaqueValue(token).json == json, "\(token)")
      #expect(RecipeScope.opaqueValue(token).text == token)
    }
  }

  @Test func aStoredEventsDedupeKeyIsReadFromItsMessage() {
    func stored(_ text: String, type: String? = nil) -> StoredEvent {
      StoredEvent(id: 5, stream: "c", upstreamID: 5, unixTime: 0, bytes: ByteSlice(Array(text.utf8)), type: type)
    }
    // The envelope as the SSE encoder frames it, split over two data lines where the API's text had a newline.
    let frame = stored(
      "id: 5\ndata: {\"stream\":\"c\",\"upstream_id\":\"7-g1\",\"backlog\":false,\"message\":{\"id\":\"doc\",\n"
        + "data: \"changes\":[{\"rev\":\"1-ab\"}]}}\n\n")
    #expect(RecipeAnswer.dedupeKey(stored: frame, ["/id", "/changes/0/rev"]) == "doc\u{1F}1-ab")
    #expect(RecipeAnswer.dedupeKey(stored: frame, ["/id", "/missing"]) == nil)
    #expect(
      RecipeAnswer.dedupeKey(stored: stored("id: 5\ndata: {\"state\":\"live\"}\n\n", type: "upstream"), ["/id"]) == nil)
    #expect(RecipeAnswer.dedupeKey(stored: stored("id: 5\ndata: not json\n\n"), ["/id"]) == nil)
    let position = FeedPosition(
      stored: FeedPosition(streams: ["c"], cursors: ["c": 5]), events: [frame],
      keys: { RecipeAnswer.dedupeKey(stored: $0, ["/id"]) }, window: 16)
    #expect(position.recentKeys["c"]?.contains("doc") == true)
  }

  @Test func aBoundCursorCarriesItsSessionAndAnyOtherTextIsNot() {
    let bound = RecipeAdapter.bind("2003", session: ["queue_id": "1517975029:1"])
    #expect(RecipeAdapter.unbind(bound)?.cursor == "2003")
    #expect(RecipeAdapter.unbind(bound)?.session == ["queue_id": "1517975029:1"])
    for other in ["2003", "-1", #"{"etag":"1","lm":"x"}"#, #"{"cursor":"1","session":{"q":2}}"#, "{", ""] {
      #expect(RecipeAdapter.unbind(other) == nil, "\(other)")
    }
  }

  /// What `/metrics` and a resync event show of an opaque cursor: the API's own cursor, never its session's values
  /// or a secret the requests carry, never a control byte, never longer than the limit.
  @Test func anOpaqueCursorIsShownWithoutSessionSecretsOrControlBytes() throws {
    let adapter = RecipeAdapter(
      recipe: try recipe(RecipeTests.telegram), environment: context.environment, credential: nil)
    let bound = RecipeAdapter.bind("2003", session: ["queue_id": "1517975029:1"])
    #expect(adapter.shownCursor(bound) == "2003")
    #expect(adapter.shownCursor("seq-123:abc-secret-9") == "seq-[redacted]-9")
    #expect(adapter.shownCursor("a\nb\u{2028}c\u{7F}") == "a?b?c?")
    let long = adapter.shownCursor(String(repeating: "x", count: 500))
    #expect(long.count == UpstreamCursorDisplay.limit && long.hasSuffix("…"))
  }

  /// A var the environment fills is a secret (redacted wherever it appears); one left at the fallback written in the
  /// recipe is not, so `recipe check` shows a database name that was never configured as it is.
  @Test func onlyWhatTheEnvironmentGivesIsSecret() throws {
    let text = """
      {"recipe":1,"vars":{"db":"{env:DB:-orders}","base":"{env:BASE}","key":"{env:TG_TOKEN:-unused}"},
       "poll":{"url":"{base}/{db}/{key}","events":{"pointer":"/result","id":{"event":"/id"}}}}
      """
    let parsed = try recipe(text)
    #expect(parsed.environmentVars == ["key", "base"])
    let adapter = RecipeAdapter(recipe: parsed, environment: context.environment, credential: nil)
    #expect(adapter.shownCursor("orders/123:abc-secret") == "orders/[redacted]")
  }

  @Test func placeholdersMustBeFilledBeforeUse() {
    let found = problems(
      """
      {"session":[{"url":"http://h/login?c={cursor}","headers":{"X-T":"{token}"},"extract":{"token":{"body":"/t"}}}],
       "poll":{"url":"http://h/poll/{env:NOPE}","headers":{"Authorization":"Bearer {credential}"},
         "events":{"pointer":"/e","id":{"event":"/id"}}},
       "cursor":{"initial":{"from":"session","name":"start"}}}
      """)
    #expect(found.contains { $0.hasPrefix("recipe.session[0].url: {cursor} is only known in the poll") })
    #expect(found.contains { $0.hasPrefix("recipe.session[0].headers.X-T: {token} but no var or earlier") })
    #expect(found.contains { $0.hasPrefix("recipe.poll.url: {env:NOPE} but the environment has no NOPE") })
    #expect(found.contains { $0.hasPrefix("recipe.poll.headers.Authorization: {credential} but there is no") })
    #expect(found.contains { $0.hasPrefix("recipe.cursor.initial.name: session value \"start\"") })
  }

  @Test func brokenInputNamesTheProblemAndNeverCrashes() {
    #expect(problems("[1,2]") == ["recipe: expected an object, got an array"])
    #expect(problems("{").first?.hasPrefix("recipe: not valid JSON") == true)
    #expect(problems("{}") == ["recipe.poll: required: the long-poll request"])
    #expect(
      problems(#"{"poll":{"url":"ftp://h","events":{"id":{"event":"/id","header":"X"}}}}"#).contains {
        $0.hasPrefix("recipe.poll.url: must start with http")
      })
    #expect(
      problems(
        #"{"poll":{"url":"http://h","headers":{"Bad Name":"x","X":"a\r\nInjected: 1"},"events":{"id":{"event":"/id"}}}}"#
      )
      .count == 2)
  }

  // MARK: Templates and requests

  @Test func bracesThatAreNotPlaceholdersStayLiteral() {
    let template = RecipeTemplate(#"{"filter":{"a":1}} {cursor} {env:X} {9} {}"#)
    #expect(template.placeholders == [.cursor, .env("X")])
  }

  @Test func requestsPlaceValuesByPosition() throws {
    let recipe = try recipe(
      """
      {"vars":{"base":"http://127.0.0.1:1/api"},
       "session":[{"url":"{base}/s","extract":{"token":{"body":"/token"},"server":{"body":"/server"}}}],
       "poll":{"method":"POST","url":"{server}/poll/{token}","query":{"since":"{cursor}","q":"a b&c"},
         "headers":{"X-Token":"{token}"},"json":{"cursor":"{cursor}","text":"at {token}","n":[1,true,null]},
         "events":{"pointer":"/e","id":{"event":"/id"}}}}
      """)
    var scope = RecipeScope()
    scope.values = recipe.vars
    scope.values["token"] = RecipeValue(text: "t/k n")
    scope.values["server"] = RecipeValue(text: "http://10.0.0.1:2")
    scope.secretNames = ["token"]
    scope.cursor = 41
    let request = try RecipeRequest.build(
      recipe.poll, scope, recipe: recipe, timeout: 5, connectTimeout: 1, label: "poll")
    #expect(request.url == "http://10.0.0.1:2/poll/t%2Fk%20n?q=a%20b%26c&since=41")
    #expect(request.headers.contains { $0 == ("X-Token", "t/k n") })
    #expect(
      String(decoding: request.body ?? [], as: UTF8.self) == #"{"cursor":41,"n":[1,true,null],"text":"at t/k n"}"#)
    #expect(request.redact == ["t/k n"])
    // A session value with CR/LF never reaches a header.
    scope.values["token"] = RecipeValue(text: "x\r\nInjected: 1")
    #expect(throws: UpstreamError.self) {
      try RecipeRequest.build(recipe.poll, scope, recipe: recipe, timeout: 5, connectTimeout: 1, label: "poll")
    }
    // A query member whose one placeholder has no value is left out.
    scope.values["token"] = RecipeValue(text: "t")
    scope.cursor = nil
    let first = try RecipeRequest.build(
      Recipe.Step(
        label: "poll", method: "GET", url: RecipeTemplate("http://h/p"), query: [("since", RecipeTemplate("{cursor}"))],
        headers: [], body: nil, timeout: nil, extract: []), scope, recipe: recipe, timeout: 5, connectTimeout: 1,
      label: "poll")
    #expect(first.url == "http://h/p")
  }

  // MARK: Answers

  func poll(
    _ recipe: Recipe, status: Int, body: String, headers: [(name: String, value: String)] = [], cursor: UInt64 = 5
  ) -> RecipeAnswer.PollVerdict {
    var scope = RecipeScope()
    scope.values = recipe.vars
    scope.cursor = cursor
    let text = RepairedText(Array(body.utf8))
    return RecipeAnswer.interpretPoll(
      status: status, headers: headers, text: text, json: try? RawJSON.parse(text.text), recipe: recipe, scope: scope)
  }

  func answer(_ verdict: RecipeAnswer.PollVerdict) -> UpstreamPollAnswer? {
    if case .answer(let answer) = verdict.action { answer } else { nil }
  }

  func error(_ verdict: RecipeAnswer.PollVerdict) -> UpstreamError? {
    if case .error(let error) = verdict.action { error } else { nil }
  }

  @Test func etcdsClearedIndexResetsTheCursorWithAGap() throws {
    let recipe = try recipe(RecipeTests.etcd)
    let cleared = poll(
      recipe, status: 400,
      body: #"{"errorCode":401,"message":"The event in requested index is outdated and cleared","index":2007}"#,
      headers: [("X-Etcd-Index", "2007")])
    #expect(cleared.rule == "recipe.rules[1]")
    #expect(
      answer(cleared)?.resets == [UpstreamCursorReset(stream: "config", to: 2007, gap: true, reason: "recipe_rules[1]")]
    )
    let recovering = poll(recipe, status: 400, body: #"{"errorCode":400,"message":"watcher is cleared"}"#)
    #expect(recovering.rule == "recipe.rules[2]" && error(recovering)?.kind == .status(400))
    let event = poll(
      recipe, status: 200, body: #"{"action":"set","node":{"key":"/config/a","value":"1","modifiedIndex":9}}"#)
    #expect(answer(event)?.batches.first?.messages.map(\.id) == [9] && event.rule == nil)
    // The server may close a watch with headers sent and no body: an empty answer, not a decoding error.
    #expect(answer(poll(recipe, status: 200, body: "\r\n"))?.isEmpty == true)
    // Any other 400 backs off with the body (not a secret) as its cause.
    #expect(error(poll(recipe, status: 400, body: #"{"errorCode":100}"#))?.cause == #"{"errorCode":100}"#)
  }

  @Test func eventsAreSortedSkippedAndRejectedOneByOne() throws {
    let recipe = try recipe(RecipeTests.telegram)
    let verdict = poll(
      recipe, status: 200,
      body: #"{"ok":true,"result":[{"update_id":8,"m":"b"},{"update_id":7,"m":"a"},"#
        + #"{"update_id":9,"kind":"heartbeat"},{"m":"no id"},{"update_id":10,"m":"c"}]}"#)
    let parsed = try #require(answer(verdict))
    #expect(parsed.batches.first?.messages.map(\.id) == [7, 8, 10])
    #expect(parsed.rejected.filter(\.expected).map(\.id) == [9], "a skipped heartbeat still moves the cursor")
    #expect(parsed.rejected.filter { !$0.expected }.count == 1)
  }

  @Test func serverGivenDelaysAreHonoured() throws {
    let recipe = try recipe(RecipeTests.telegram)
    let limited = poll(recipe, status: 429, body: #"{"ok":false,"parameters":{"retry_after":17}}"#)
    #expect(error(limited)?.retryAfter == 17)
    // Without a rule, 503 with Retry-After as seconds or as an HTTP date.
    #expect(error(poll(recipe, status: 503, body: "", headers: [("Retry-After", "3")]))?.retryAfter == 3)
    let later = Date().addingTimeInterval(120)
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "GMT")
    formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
    let dated = error(poll(recipe, status: 503, body: "", headers: [("Retry-After", formatter.string(from: later))]))
    #expect((dated?.retryAfter ?? 0) > 100 && (dated?.retryAfter ?? 0) <= 121)
    #expect(error(poll(recipe, status: 500, body: "oops"))?.retryAfter == nil)
  }

  @Test func sessionRulesAndResets() throws {
    let recipe = try recipe(
      """
      {"session":[{"method":"POST","url":"http://h/register","form":{"types":"[\\"message\\"]"},
         "extract":{"queue":{"body":"/queue_id"},"last":{"body":"/last_event_id"}}}],
       "poll":{"url":"http://h/events","query":{"queue_id":"{queue}","last_event_id":"{cursor}"},
         "events":{"pointer":"/events","id":{"event":"/id"}}},
       "cursor":{"initial":{"from":"session","name":"last"}},
       "rules":[{"status":400,"when":{"pointer":"/code","equals":"BAD_EVENT_QUEUE_ID"},"do":["session","reset"],"gap":true},
                {"when":{"pointer":"/failed","in":[2]},"do":"session"}]}
      """)
    let gone = poll(recipe, status: 400, body: #"{"result":"error","code":"BAD_EVENT_QUEUE_ID"}"#)
    guard case .session(let reset?) = gone.action else {
      Issue.record("expected a new session with a reset, got \(gone.action)")
      return
    }
    #expect(reset.to == nil && reset.gap, "the cursor goes to the new session's initial cursor")
    guard case .session(nil) = poll(recipe, status: 200, body: #"{"failed":2}"#).action else {
      Issue.record("failed:2 is a new session that keeps the cursor")
      return
    }
    guard case .session(nil) = poll(recipe, status: 401, body: "").action else {
      Issue.record("401 starts a new session by default when the recipe has one")
      return
    }
  }

  @Test func rawBodiesBecomeOneEventWithTheirContentType() throws {
    let recipe = try recipe(
      #"{"poll":{"url":"http://h/sub","events":{"format":"raw","id":{"header":"X-Seq"}}}}"#)
    let verdict = poll(
      recipe, status: 200, body: "plain text, not JSON",
      headers: [("Content-Type", "text/plain"), ("X-Seq", "12")])
    let message = try #require(answer(verdict)?.batches.first?.messages.first)
    #expect(message.id == 12)
    #expect(message.raw == #"{"body":"plain text, not JSON","content_type":"text/plain"}"#)
  }
}
