import Foundation
import Testing

@testable import PollcastCore

/// Recipes of several streams (the chat API's shape): events in a map keyed by stream or with a stream field, a
/// cursor per stream sent together as `{cursors}`, and the cursor sync. Without sockets.
@Suite struct RecipeStreamsTests {
  func problems(_ text: String) -> [String] {
    if case .failure(let error) = Recipe.parse(text, context: .init(environment: [:], hasCredential: true)) {
      return error.problems
    }
    return []
  }

  func events(_ recipe: Recipe, _ body: String) -> RecipeAnswer.PollVerdict {
    let text = RepairedText(Array(body.utf8))
    return RecipeAnswer.events(
      recipe, text: text, context: RecipeAnswer.Context(json: try? RawJSON.parse(text.text), scope: RecipeScope()),
      rule: nil)
  }

  /// `Config/recipes/chat.json` is what `upstream.adapter = chat` runs: a user who copies it gets the same relay.
  @Test func theChatExampleIsTheBuiltInRecipe() throws {
    let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
      "../../Config/recipes/chat.json"
    ).path
    let file = try #require(FileManager.default.contents(atPath: path))
    let example = try JSONDecoder().decode(JSONValue.self, from: file)
    let builtIn = try JSONDecoder().decode(JSONValue.self, from: Data(Recipe.chatText.utf8))
    #expect(example == builtIn)
    let recipe = Recipe.chat(baseURL: "http://127.0.0.1:9/", holdSeconds: 25, marginSeconds: 10)
    #expect(recipe.isMultiStream && recipe.sync != nil && recipe.usesCredential)
    #expect(recipe.identityURL == "http://127.0.0.1:9/api/messages/poll")
    #expect(recipe.poll.timeout == 35)
  }

  @Test func severalStreamsNameWhatTheyNeedAndWhatTheyCannotHave() {
    let found = problems(
      """
      {"session":[{"url":"http://h/s","extract":{"u":{"body":"/u"}}}],
       "sync":{"url":"http://h/last"},
       "poll":{"url":"http://h/p","query":{"c":"{cursor}","all":"{cursors}"},
         "events":{"pointer":"/e","stream":"key","id":{"event":"/id"}}},
       "cursor":{"type":"opaque","value":{"body":"/next"},"scope":"global","list":{"each":"{stream}-{u}"}},
       "rules":[{"status":400,"do":"reset","to":{"body":"/i"}}]}
      """)
    let expected = [
      "recipe.sync.ids: required",
      "recipe.streams: required with poll.events.stream",
      "recipe.cursor.scope: global, but the events fall into several streams",
      "recipe.cursor.type: several streams need integer cursors",
      "recipe.cursor.list.each: must hold {cursor}",
      "recipe.cursor.list.each: {u}: only {stream} and {cursor} are known here",
      "recipe.rules[0].do: reset is not supported with several streams",
      "recipe.poll.query.c: {cursor} but the recipe has several streams: send {cursors}",
    ]
    for text in expected {
      #expect(found.contains { $0.hasPrefix(text) }, "missing: \(text)\nin: \(found.joined(separator: "\n"))")
    }
    let single = problems(
      """
      {"streams":["a"],"poll":{"url":"http://h/p","query":{"all":"{cursors}"},
         "events":{"pointer":"/e","id":{"event":"/id"},"stream":{"event":""}}},"cursor":{"scope":"stream"}}
      """)
    #expect(single.contains { $0.hasPrefix("recipe.poll.events.stream.event: names the whole event") }, "\(single)")
    let unstreamed = problems(
      """
      {"streams":["a"],"poll":{"url":"http://h/p","query":{"all":"{cursors}"},
         "events":{"pointer":"/e","id":{"event":"/id"}}},"cursor":{"scope":"stream"}}
      """)
    for text in [
      "recipe.streams: several streams need poll.events.stream", "recipe.cursor.scope: stream needs several streams",
      "recipe.poll.query.all: {cursors} needs several streams",
    ] {
      #expect(unstreamed.contains { $0.hasPrefix(text) }, "missing: \(text)\nin: \(unstreamed)")
    }
  }

  @Test func eventsFallIntoStreamsByTheMapsKeyOrAField() throws {
    let chat = Recipe.chat(baseURL: "http://h", holdSeconds: 25, marginSeconds: 10)
    let keyed = try #require(
      {
        if case .answer(let answer) = events(chat, #"{"101":[{"id":9},{"id":"8"}],"202":[],"303":7,"404":null}"#)
          .action
        {
          return answer
        }
        return nil
      }())
    #expect(keyed.batches.map(\.stream) == ["101", "202"])
    #expect(keyed.batches[0].messages.map(\.id) == [8, 9], "each stream's events in id order")
    #expect(keyed.rejected == [UpstreamRejection(stream: "303", id: nil, reason: "not an array of events")])
    if case .error(let error) = events(chat, "[1]").action {
      #expect(error.message.contains("not an object keyed by stream"))
    } else {
      Issue.record("an array is not a map of streams")
    }
    // A stream field per event (one array of events for every channel).
    let text = """
      {"streams":["{env:A:-a}","b"],"poll":{"url":"http://h/p","query":{"c":"{cursors}"},
         "events":{"pointer":"/events","stream":{"event":"/channel"},"id":{"event":"/seq"}}}}
      """
    guard case .success(let fielded) = Recipe.parse(text, context: .init(environment: [:], hasCredential: false)) else {
      Issue.record("the fielded recipe does not parse")
      return
    }
    guard
      case .answer(let answer) = events(
        fielded, #"{"events":[{"channel":"b","seq":4},{"channel":"a","seq":2},{"seq":3},{"channel":"b","seq":1}]}"#
      ).action
    else {
      Issue.record("no answer")
      return
    }
    #expect(answer.batches.map(\.stream) == ["b", "a"])
    #expect(answer.batches[0].messages.map(\.id) == [1, 4])
    #expect(answer.rejected.count == 1 && answer.rejected[0].reason.contains("without a stream"))
  }

  /// Batches are found by a scan while an answer names few streams and by a map past eight: the same batches either
  /// way, in the order streams first appear, each in id order, a key listed twice one batch.
  @Test func manyStreamsGroupTheSameAsFew() throws {
    let text = """
      {"streams":["a"],"poll":{"url":"http://h/p","query":{"c":"{cursors}"},
         "events":{"pointer":"/events","stream":{"event":"/channel"},"id":{"event":"/seq"}}}}
      """
    guard case .success(let fielded) = Recipe.parse(text, context: .init(environment: [:], hasCredential: false)) else {
      Issue.record("the fielded recipe does not parse")
      return
    }
    for streams in [3, 8, 9, 10, 40] {
      // Three rounds over the streams, ids falling within each stream: 3k+2, then 3k+1, then 3k.
      var items: [String] = []
      for round in 0..<3 {
        for stream in 0..<streams { items.append(#"{"channel":"s\#(stream)","seq":\#(stream * 3 + 2 - round)}"#) }
      }
      guard case .answer(let answer) = events(fielded, #"{"events":[\#(items.joined(separator: ","))]}"#).action else {
        Issue.record("no answer for \(streams) streams")
        continue
      }
      #expect(answer.batches.map(\.stream) == (0..<streams).map { "s\($0)" }, "\(streams) streams")
      #expect(
        answer.batches.map { $0.messages.map(\.id) }
          == (0..<streams).map { stream in (0..<3).map { UInt64(stream * 3 + $0) } }, "\(streams) streams")
    }
    let chat = Recipe.chat(baseURL: "http://h", holdSeconds: 25, marginSeconds: 10)
    let keys = (0..<12).map { #""k\#($0)":[{"id":\#($0)}]"# } + [#""k3":[{"id":100}]"#]
    guard case .answer(let keyed) = events(chat, "{\(keys.joined(separator: ","))}").action else {
      Issue.record("no answer for a map of twelve streams")
      return
    }
    #expect(keyed.batches.map(\.stream) == (0..<12).map { "k\($0)" })
    #expect(keyed.batches[3].messages.map(\.id) == [3, 100])
  }

  @Test func theSyncReadsEveryStreamsNewestID() {
    let chat = Recipe.chat(baseURL: "http://h", holdSeconds: 25, marginSeconds: 10)
    func sync(_ status: Int, _ body: String, streams: [String] = ["101", "202"]) -> Result<
      [String: UInt64], UpstreamError
    > {
      var scope = RecipeScope()
      scope.values = ["token": RecipeValue(text: "tok-secret")]
      scope.secretNames = ["token"]
      let text = RepairedText(Array(body.utf8))
      return RecipeAnswer.interpretSync(
        status: status, headers: [], text: text, json: try? RawJSON.parse(text.text), recipe: chat, scope: scope,
        streams: streams)
    }
    #expect((try? sync(200, #"{"last_ids":{"101":5,"202":"7","999":1}}"#).get()) == ["101": 5, "202": 7, "999": 1])
    func message(_ result: Result<[String: UInt64], UpstreamError>) -> String {
      if case .failure(let error) = result { return error.description }
      return "no error"
    }
    #expect(message(sync(200, #"{"last_ids":{"101":5}}"#)).contains("no id for stream 202"))
    #expect(message(sync(200, #"{"last_ids":{"101":-5,"202":1}}"#)).contains("stream 101 is not an unsigned"))
    #expect(message(sync(200, #"{"ids":{}}"#)).contains("does not name an object"))
    if case .failure(let error) = sync(401, "{}") { #expect(error.kind == .sessionExpired) }
    if case .failure(let error) = sync(500, "token tok-secret failed") {
      #expect(error.kind == .status(500))
      #expect(!error.description.contains("tok-secret"), "\(error.description)")
    }
  }

  /// Rules read the sync's answers too (`step: sync`, or `*`): an API that answers its "latest ids" call with a
  /// status of its own for "re-register" or "busy" is followed as a poll's would be.
  @Test func rulesReadTheSyncsAnswers() throws {
    func recipe(_ rules: String) -> String {
      """
      {"session":[{"url":"http://h/s","extract":{"token":{"body":"/token"}}}],
       "streams":["a","b"],
       "sync":{"url":"http://h/last","query":{"token":"{token}"},"ids":"/ids"},
       "poll":{"url":"http://h/p","query":{"c":"{cursors}","token":"{token}"},
         "events":{"pointer":"","stream":"key","id":{"event":"/id"}}},
       "rules":\(rules)}
      """
    }
    let refused = problems(recipe(#"[{"step":"sync","do":"reset","to":{"body":"/n"}},{"step":"sync","do":"fetch"}]"#))
    #expect(refused.contains { $0.hasPrefix("recipe.rules[0].do: reset acts on a poll's answer") }, "\(refused)")
    #expect(refused.contains { $0.hasPrefix("recipe.rules[1].do: fetch") }, "\(refused)")
    let noSync = problems(
      #"{"poll":{"url":"http://h/p?a={cursor}","events":{"pointer":"/e","id":{"event":"/id"}}},"#
        + #""rules":[{"step":"sync","do":"fail"}]}"#)
    #expect(noSync.contains { $0.hasPrefix("recipe.rules[0].step: the recipe has no sync step") }, "\(noSync)")

    let rules = """
      [{"step":"sync","status":409,"do":"session"},
       {"step":"sync","status":503,"do":"retry","after":{"body":"/wait"}},
       {"step":"sync","status":200,"when":{"pointer":"/error","exists":true},"do":"fail"},
       {"step":"sync","status":202,"do":"continue"},
       {"step":"*","status":418,"do":"empty"}]
      """
    guard
      case .success(let parsed) = Recipe.parse(recipe(rules), context: .init(environment: [:], hasCredential: false))
    else {
      Issue.record("the recipe with sync rules does not parse: \(problems(recipe(rules)))")
      return
    }
    func sync(_ status: Int, _ body: String) -> Result<[String: UInt64], UpstreamError> {
      let text = RepairedText(Array(body.utf8))
      return RecipeAnswer.interpretSync(
        status: status, headers: [], text: text, json: try? RawJSON.parse(text.text), recipe: parsed,
        scope: RecipeScope(), streams: ["a", "b"])
    }
    func error(_ result: Result<[String: UInt64], UpstreamError>) -> UpstreamError? {
      if case .failure(let error) = result { return error }
      return nil
    }
    #expect(error(sync(409, "{}"))?.kind == .sessionExpired)
    let retry = try #require(error(sync(503, #"{"wait":7}"#)))
    #expect(retry.kind == .status(503) && retry.retryAfter == 7 && retry.description.contains("rules[1] says retry"))
    let failed = try #require(error(sync(200, #"{"error":"stale","ids":{"a":1,"b":2}}"#)))
    #expect(failed.kind == .status(200) && failed.description.contains("rules[2] says fail"))
    // `continue` reads the ids from an answer the defaults would have backed off from.
    #expect((try? sync(202, #"{"ids":{"a":3,"b":4}}"#).get()) == ["a": 3, "b": 4])
    #expect(error(sync(418, "{}"))?.description.contains("cannot act on a sync step") == true)
    // No rule: the defaults, as before.
    #expect((try? sync(200, #"{"ids":{"a":1,"b":2}}"#).get()) == ["a": 1, "b": 2])
    #expect(error(sync(401, "{}"))?.kind == .sessionExpired)
    #expect(error(sync(500, "{}"))?.kind == .status(500))
  }

  @Test func cursorsListEveryStreamPrimaryFirst() throws {
    let adapter = ChatAdapter(baseURL: "http://127.0.0.1:9", credential: "key")
    adapter.preparedStreams = ["202", "101"]
    #expect(adapter.cursorList(["101": 5, "202": 7, "099": 1]) == "202:7,101:5,099:1")
    var scope = adapter.scope()
    scope.values["token"] = RecipeValue(text: "t")
    scope.cursorList = adapter.cursorList(["101": 5, "202": 7])
    let request = try RecipeRequest.build(
      adapter.recipe.poll, scope, recipe: adapter.recipe, timeout: 35, connectTimeout: 1, label: "poll")
    #expect(request.url == "http://127.0.0.1:9/api/messages/poll?cursor=202%3A7%2C101%3A5&timeout=25&token=t")
    // A session renders the members that do not move with the cursor once; a poll renders only its cursors.
    let prefix = try #require(RecipeRequest.prefix(adapter.recipe.poll, scope, recipe: adapter.recipe))
    #expect(prefix.url == "http://127.0.0.1:9/api/messages/poll?timeout=25&token=t")
    #expect(prefix.dynamic.map(\.0) == ["cursor"])
    let fast = try RecipeRequest.build(
      adapter.recipe.poll, scope, recipe: adapter.recipe, timeout: 35, connectTimeout: 1, label: "poll",
      prefix: prefix)
    #expect(fast.url == "http://127.0.0.1:9/api/messages/poll?timeout=25&token=t&cursor=202%3A7%2C101%3A5")
  }

  @Test func queryMembersFollowTheURLsOwnQuery() {
    var url = "http://h/p"
    RecipeRequest.appendQuery([], to: &url)
    #expect(url == "http://h/p")
    RecipeRequest.appendQuery(["a=1", "b=%C3%A9"], to: &url)
    #expect(url == "http://h/p?a=1&b=%C3%A9")
    RecipeRequest.appendQuery(["c="], to: &url)
    #expect(url == "http://h/p?a=1&b=%C3%A9&c=")
    var unicode = "http://h/é?x=1"
    RecipeRequest.appendQuery(["y=2"], to: &unicode)
    #expect(unicode == "http://h/é?x=1&y=2")
  }
}
