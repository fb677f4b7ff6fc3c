/// The reference legacy chat API: `POST /api/session` → `GET /api/messages/last` → `GET /api/messages/poll`,
/// a primary and an optional linked account, each a stream with its own cursor.
///
/// A built-in recipe (`Recipe.chat`), run by `RecipeAdapter`: the same code path as every API the relay fronts
/// without Swift.
public final class ChatAdapter: RecipeAdapter, @unchecked Sendable {  // loop-confined
  /// One recipe per base URL and timing, shared by every account's adapter (per-user relaying makes thousands).
  private static let recipes = Locked<[String: RecipeStorage]>([:])

  /// - Parameter credential: the API key the session step sends as a bearer token (the shared `upstream.api_key`,
  ///   or per-user relaying's subscriber key); nil sends none.
  public init(
    baseURL: String, holdSeconds: Double = 25, marginSeconds: Double = 10, requestTimeout: Double = 10,
    connectTimeout: Double = 5, credential: String? = nil
  ) {
    let key = "\(baseURL) \(holdSeconds) \(marginSeconds)"
    let storage = ChatAdapter.recipes.withLock { cache in
      if let storage = cache[key] { return storage }
      let storage = RecipeStorage(
        Recipe.chat(baseURL: baseURL, holdSeconds: holdSeconds, marginSeconds: marginSeconds))
      if cache.count >= 16 { cache.removeAll() }  // tests make many; a relay has one
      cache[key] = storage
      return storage
    }
    super.init(
      storage: storage, environment: [:], credential: credential, pollTimeout: holdSeconds + marginSeconds,
      requestTimeout: requestTimeout, connectTimeout: connectTimeout)
  }

  /// `{"101":[{…},…],"202":[]}` → batches; `{}` is an empty answer. One bad message (no id, too deep) is
  /// rejected alone; messages whose invalid UTF-8 was repaired are relayed and marked. The recipe's events rule,
  /// for tests and the fuzzers without sockets.
  static func parsePoll(_ json: RawJSON, text: RepairedText? = nil) throws(UpstreamError) -> UpstreamPollAnswer {
    let verdict = RecipeAnswer.events(
      Recipe.chat(baseURL: "http://127.0.0.1", holdSeconds: 25, marginSeconds: 10),
      text: text ?? RepairedText(Array(json.rawText.utf8)),
      context: RecipeAnswer.Context(json: json, scope: RecipeScope()), rule: nil)
    switch verdict.action {
    case .answer(let answer): return answer
    case .error(let error): throw error
    case .session, .fetch: throw UpstreamError(.decoding, "unexpected session or fetch action")
    }
  }
}
