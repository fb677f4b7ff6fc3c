import Foundation
import Testing

@testable import PollcastCore

/// A transport that answers from a script and records what was sent: adapters driven through the
/// `UpstreamTransport` seam, without sockets or a loop.
final class ScriptedTransport: UpstreamTransport, @unchecked Sendable {
  var answers: [UpstreamResponse]
  private(set) var sent: [UpstreamRequest] = []
  let maxBodyBytes = 1 << 20

  init(_ answers: [UpstreamResponse]) { self.answers = answers }

  func send(held: HeldRequest, isolation: isolated (any Actor)?) async {
    sent.append(held.request)
    held.outcome =
      answers.isEmpty
      ? .failure(UpstreamError(.transport, "the script has no answer left")) : .success(answers.removeFirst())
  }

  static func answer(_ status: Int = 200, _ body: String = "", headers: [(name: String, value: String)] = [])
    -> UpstreamResponse
  {
    UpstreamResponse(status: status, body: Array(body.utf8), duration: 0, headers: headers)
  }
}

/// What a recipe's adapter sends after a hostile value: the last clean cursor or a new session, never the value.
@Suite struct RecipeAdapterTransportTests {
  private func adapter(_ text: String) throws -> RecipeAdapter {
    let recipe = try Recipe.parse(text, context: Recipe.Context(environment: [:], hasCredential: false)).get()
    return RecipeAdapter(recipe: recipe, environment: [:], credential: nil)
  }

  private static func header(_ request: UpstreamRequest, _ name: String) -> String? {
    request.headers.last { $0.0.caseInsensitiveCompare(name) == .orderedSame }?.1
  }

  @Test func aHostileCursorIsNeverSentAndTheNextPollGoesOnFromTheLastCleanOne() async throws {
    let adapter = try adapter(
      """
      {"recipe":1,"poll":{"url":"http://127.0.0.1:9/sub","headers":{"If-None-Match":"{cursor}"},
         "events":{"pointer":"","format":"raw"}},
       "cursor":{"type":"opaque","value":{"header":"Etag"}}}
      """)
    let transport = ScriptedTransport([
      ScriptedTransport.answer(200, "one", headers: [("Etag", "e1")]),
      ScriptedTransport.answer(200, "two", headers: [("Etag", "e2\u{7F}")]),
      ScriptedTransport.answer(200, "three", headers: [("Etag", "e3")]),
    ])
    _ = try await adapter.prepare(transport)
    let first = try await adapter.poll(transport, cursors: [:])
    let clean = try #require(first.tokens.values.first)
    await #expect(throws: UpstreamError.self) {
      try await adapter.poll(transport, cursors: [:], tokens: [adapter.recipe.stream: clean])
    }
    // The worker keeps the tokens it had: the refused answer gave none.
    let third = try await adapter.poll(transport, cursors: [:], tokens: [adapter.recipe.stream: clean])
    #expect(third.tokens.values.first == "e3")
    #expect(transport.sent.map { Self.header($0, "If-None-Match") } == [nil, "e1", "e1"])
  }

  @Test func aSessionTokenWithCRLFIsRefusedAndTheSessionIsAskedAgain() async throws {
    let adapter = try adapter(
      """
      {"recipe":1,"session":[{"method":"POST","url":"http://127.0.0.1:9/login","extract":{"token":{"body":"/token"}}}],
       "poll":{"url":"http://127.0.0.1:9/poll","query":{"after":"{cursor}"},
         "headers":{"Authorization":"Bearer {token}"},"events":{"pointer":"/events","id":{"event":"/id"}}}}
      """)
    let transport = ScriptedTransport([
      ScriptedTransport.answer(200, #"{"token":"abc\r\nX-Evil: 1"}"#),
      ScriptedTransport.answer(200, #"{"token":"clean"}"#),
      ScriptedTransport.answer(200, #"{"events":[{"id":1}]}"#),
    ])
    await #expect(throws: UpstreamError.self) { try await adapter.prepare(transport) }
    #expect(!adapter.hasSession)
    _ = try await adapter.prepare(transport)
    let answer = try await adapter.poll(transport, cursors: [adapter.recipe.stream: 0])
    #expect(answer.batches.first?.messages.map(\.id) == [1])
    #expect(transport.sent.map(\.label) == ["session", "session", "poll"])
    #expect(Self.header(transport.sent[2], "Authorization") == "Bearer clean")
    #expect(!transport.sent.contains { request in request.headers.contains { $0.1.contains("\r") } })
  }
}
