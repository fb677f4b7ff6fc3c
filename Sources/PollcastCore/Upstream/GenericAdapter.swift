import Foundation

/// Any single-stream long-poll API: a URL template with `{cursor}` (last id seen) and `{next}` (last id + 1),
/// an RFC 6901 pointer to the events array (or `""` with a non-array body: the whole body is one event), a
/// pointer to each event's id, and static headers. No session step.
///
/// A built-in recipe: `generic.*` settings become a `Recipe` (`Recipe.generic`), run by `RecipeAdapter` — one code
/// path for every API the relay fronts without Swift. Only the events rule is its own (`Recipe.Events.genericShape`:
/// `""` with an array body means its elements, and a pointer must name an array), as `generic` always had it.
public final class GenericAdapter: RecipeAdapter, @unchecked Sendable {  // loop-confined
  public struct Settings: Sendable, Hashable {
    public var urlTemplate: String
    public var eventsPointer: String
    public var idPointer: String
    public var headers: [String]
    public var stream: String
    /// Client-side deadline of one poll.
    public var timeout: Double
    public var connectTimeout: Double
    /// The cursor of the first poll (events after it are relayed).
    public var initialCursor: UInt64

    public init(
      urlTemplate: String, eventsPointer: String = "", idPointer: String = "/id", headers: [String] = [],
      stream: String = "default", timeout: Double = 60, connectTimeout: Double = 5, initialCursor: UInt64 = 0
    ) {
      self.initialCursor = initialCursor
      self.urlTemplate = urlTemplate
      self.eventsPointer = eventsPointer
      self.idPointer = idPointer
      self.headers = headers
      self.stream = stream
      self.timeout = timeout
      self.connectTimeout = connectTimeout
    }
  }

  let settings: Settings

  /// - Parameter credential: per-user relaying's subscriber key, put in place of `{credential}` in the headers (as
  ///   is) and the URL template (percent-encoded).
  public init(settings: Settings, credential: String? = nil) {
    self.settings = settings
    super.init(
      storage: GenericAdapter.storage(for: settings), environment: [:], credential: credential,
      pollTimeout: settings.timeout, connectTimeout: settings.connectTimeout)
  }

  /// One recipe per settings, shared by every account's adapter (per-user relaying makes thousands): a recipe's
  /// templates and arrays are then held once, not per account.
  private static let recipes = Locked<[Settings: RecipeStorage]>([:])

  static func storage(for settings: Settings) -> RecipeStorage {
    recipes.withLock { cache in
      if let storage = cache[settings] { return storage }
      let storage = RecipeStorage(Recipe.generic(settings))
      if cache.count >= 16 { cache.removeAll() }  // tests make many; a relay has one
      cache[settings] = storage
      return storage
    }
  }

  /// Whether the settings carry the subscriber's credential somewhere (per-user mode needs it).
  public static func usesCredential(_ settings: Settings) -> Bool {
    settings.urlTemplate.contains("{credential}") || settings.headers.contains { $0.contains("{credential}") }
  }

  /// The poll URL: `{cursor}` is the last id seen, `{next}` the one after it (2^64-1 has none: `{next}` stays at
  /// 2^64-1 rather than wrapping to 0, which would ask for everything again).
  static func url(template: String, cursor: UInt64) -> String {
    var scope = RecipeScope()
    scope.cursor = cursor
    return (try? RecipeTemplate(template).renderKnown(scope)) ?? template
  }

  /// One answer's events as the generic adapter reads them (tests and the fuzzers call it without sockets).
  static func parse(_ json: RawJSON, settings: Settings, text: RepairedText? = nil) throws(UpstreamError)
    -> UpstreamPollAnswer
  {
    let recipe = Recipe.generic(settings)
    let verdict = RecipeAnswer.events(
      recipe, text: text ?? RepairedText(Array(json.rawText.utf8)),
      context: RecipeAnswer.Context(json: json, scope: RecipeScope()), rule: nil)
    switch verdict.action {
    case .answer(let answer): return answer
    case .error(let error): throw error
    case .session, .fetch: throw UpstreamError(.decoding, "unexpected session or fetch action")
    }
  }
}

extension Recipe {
  /// The `generic` adapter's settings as a recipe: the URL template as the poll URL, the header lines as headers,
  /// the events and id pointers, the initial cursor as a constant.
  public static func generic(_ settings: GenericAdapter.Settings) -> Recipe {
    var headers: [(String, RecipeTemplate)] = []
    for line in settings.headers {
      if case .success(let (name, value)) = OutgoingRequest.header(line: line) {
        headers.append((name, RecipeTemplate(value)))
      }
    }
    let poll = Step(
      label: "poll", method: "GET", url: RecipeTemplate(settings.urlTemplate), query: [], headers: headers, body: nil,
      timeout: settings.timeout, extract: [])
    var cursor = Cursor()
    cursor.initial = Source(origin: .constant(RecipeValue(settings.initialCursor)))
    var events = Events(
      pointer: settings.eventsPointer, id: Source(origin: .event(settings.idPointer)), skip: [], format: .json)
    events.genericShape = true
    var recipe = Recipe(
      name: "generic", stream: settings.stream, vars: [:], session: [], poll: poll, events: events, cursor: cursor,
      rules: [], user: nil)
    // Configured header values may be keys (`Authorization: Bearer …`): none of them is ever shown.
    recipe.literalSecrets = headers.map { $0.1.source }.filter { $0.count >= 6 && !$0.contains("{") }
    return recipe
  }
}
