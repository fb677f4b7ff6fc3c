import Foundation

/// A legacy long-poll API described by configuration: optional session steps, the poll, where events and their
/// ids are, where the cursor starts, and rules from answers to actions. `RecipeAdapter` runs it; `Recipe.parse`
/// validates it at load and names every problem by its path (`recipe.poll.query.since: …`).
///
/// One stream with an integer cursor (the last relayed event's id) or an opaque one (the API's own text), or
/// several streams (events in a map keyed by stream, or a stream field per event) each with its own integer cursor,
/// sent together as `{cursors}`; an optional cursor sync reads the API's newest id per stream. The reference chat
/// API is such a recipe (`Recipe.chat`).
public struct Recipe: Sendable {
  /// Shown in status events (`adapter`) and the store's source record.
  public var name: String
  public var stream: String
  public var vars: [String: RecipeValue] { didSet { varNames = Set(vars.keys) } }
  /// The vars' names (placed as they are in a URL), kept with them: a poll does not rebuild the set.
  private(set) var varNames: Set<String> = []
  public var session: [Step]
  /// Several streams: the streams the poll asks for, rendered once the session ran (one with no value, or empty,
  /// is left out: the chat API's `linked_user_id` is null for an account with no link). Empty: one stream, `stream`.
  public var streams: [RecipeTemplate] = []
  /// The cursor sync (the chat API's `GET /api/messages/last`): at (re)start and every `upstream.resync_interval`,
  /// the API's newest id per stream, at `ids` (a map keyed by stream) in its answer.
  public var sync: Sync?
  public var poll: Step
  /// Fetch-after-notify (Dropbox `longpoll` + `continue`): a poll that only says "there is news" is followed by
  /// this step, repeated while `fetchWhile` holds on its answer; the events then come from it.
  public var fetch: Step?
  public var fetchWhile: Condition?
  /// The events' spec: the fetch step's when there is one, else the poll's.
  public var events: Events
  public var cursor: Cursor
  public var rules: [Rule]
  /// Per-user relaying: the account's user as the session's answer names it (nil: keyed by credential).
  public var user: RecipeTemplate?
  /// Text written in the recipe that is a secret anyway (the `generic` adapter's configured header values).
  public var literalSecrets: [String] = []
  public init(
    name: String, stream: String, vars: [String: RecipeValue], session: [Step], poll: Step, events: Events,
    cursor: Cursor, rules: [Rule], user: RecipeTemplate?
  ) {
    self.name = name
    self.stream = stream
    self.vars = vars
    self.varNames = Set(vars.keys)
    self.session = session
    self.poll = poll
    self.events = events
    self.cursor = cursor
    self.rules = rules
    self.user = user
  }

  /// Vars the environment fills (secrets unless they are URLs; a fallback written in the recipe is not a secret).
  public var environmentVars: Set<String> = []
  /// `upstream.allowed_hosts`: hosts beyond those the recipe writes that an answer may send its polls to.
  public var configuredHosts: [String] = []
  /// Every environment variable the recipe reads.
  public var environmentNames: Set<String> = []

  public struct Step: Sendable {
    public enum Body: Sendable {
      case json(JSONValue)
      case form([(String, RecipeTemplate)])
    }
    public var label: String
    public var method: String
    public var url: RecipeTemplate
    public var query: [(String, RecipeTemplate)]
    public var headers: [(String, RecipeTemplate)]
    public var body: Body?
    public var timeout: Double?
    public var extract: [(String, Source)]
  }

  public struct Sync: Sendable {
    public var step: Step
    /// A pointer to a map from stream name to the newest id.
    public var ids: String
  }

  /// Whether the events fall into several streams, each with its own integer cursor.
  public var isMultiStream: Bool { events.stream != nil }

  public struct Source: Sendable, Equatable {
    public enum Origin: Sendable, Equatable {
      case body(String)
      case header(String)
      case event(String)
      case constant(RecipeValue)
      case session(String)
      case template(RecipeTemplate)
    }
    public var origin: Origin
    /// Added to an integer value (etcd's `X-Etcd-Index + 1`).
    public var add: Int64 = 0
    /// For delays: the value is in milliseconds.
    public var milliseconds = false
    /// A session step's extract that may be absent or null (the chat API's `linked_user_id`): the name then has no
    /// value, and a template that uses it is left out where that is allowed (a `streams` entry, a query member
    /// that is only it).
    public var optional = false
    /// A session step's extract is a secret (redacted wherever it appears) unless marked `"secret": false`: a sync
    /// token or a user id that logs, status events and `recipe check` may show.
    public var secret = true
  }

  public struct Events: Sendable {
    public enum Format: String, Sendable { case json, raw }
    /// Where an event's stream is: the key of the map the pointer names (each member an array of events), or a
    /// field of the event.
    public enum StreamSource: Sendable, Equatable {
      case key
      case event(String)
    }
    public var pointer: String
    public var stream: StreamSource?
    /// The event's id: the cursor for an integer recipe; shown as `upstream_id` for an opaque one (optional there).
    public var id: Source?
    /// The `generic` adapter's events rule: `""` with an array body is its elements (else the whole body), a
    /// pointer must name an array (or null), and an event must be an object.
    var genericShape = false
    public var skip: [Condition]
    public var format: Format
  }

  public struct Cursor: Sendable {
    /// Opaque: the API's own cursor text (`value`), sent back as `{cursor}` (or `{cursor.PART}`), never compared
    /// by order; events are numbered by the relay and deduplicated by `dedupe`.
    public var opaque = false
    /// Opaque: where the next cursor is in an answer — one source, or named parts (nchan's Last-Modified + Etag).
    public var value: [(part: String?, source: Source)] = []
    /// Opaque: what identifies an event (pointers into it, joined), and how many recent keys are remembered.
    public var dedupe: (keys: [String], window: Int)?
    public var initial: Source?
    /// The answer's own index (Consul's `X-Consul-Index`): one below the cursor means the API's numbering went
    /// backwards (a restored server), and the cursor follows it with a gap.
    public var index: Source?
    /// Opaque: the session values the cursor belongs to (Zulip's `queue_id`: its event ids mean something only in
    /// that queue). They are stored with the cursor, so a restarted relay polls on in the same session instead of
    /// starting one (which would lose what came meanwhile), and a new session's cursor starts from `initial`, with
    /// a gap, when no rule reset it.
    public var session: [String] = []
    /// Several streams: how `{cursors}` writes them — each as `each` (`{stream}` and `{cursor}` in it), joined by
    /// `join`.
    public var listEach = RecipeTemplate("{stream}:{cursor}")
    public var listJoin = ","
    /// As written (`global`, `stream`); nil: what the events imply.
    var scope: String?

    public init() {}
  }

  public struct Condition: Sendable {
    public enum Test: Sendable {
      case equals(JSONValue)
      case oneOf([JSONValue])
      case exists(Bool)
      case prefix(String)
    }
    public var pointer: String
    public var test: Test
    /// `{"not": {…}}`: the condition holds when its test does not.
    public var negated = false
  }

  public enum Action: String, Sendable, CaseIterable {
    case `continue`, empty, session, reset, retry, fail, fetch
    /// The answer says the key (the API key, or a subscriber's) is refused: a subscriber gets 401 and its account
    /// stops, as for a 401 (an API that answers a bad key with 404, as Telegram does for a malformed bot token).
    case refuseKey = "refuse_key"
  }

  public struct Rule: Sendable {
    /// Which step's answers it reads: `poll`, `session`, `fetch`, `sync`, or `*`.
    public var step: String
    /// Status codes it matches (nil: any).
    public var statuses: ClosedRangeSet?
    public var when: [Condition]
    public var actions: [Action]
    public var after: Source?
    public var to: Source?
    public var gap: Bool
    /// `recipe.rules[2]`: where the rule is written, for load problems.
    public var path: String
    /// The rule's own name (`"name"`), if given: the reason of its gaps and status events, and how logs and
    /// `recipe check` name it, stable when rules are inserted before it.
    public var name: String?

    /// How logs and `recipe check` name the rule: its name, else its place.
    public var label: String { name ?? path }
    /// The reason its resets and gaps carry: `recipe_` and its name, else its place (`recipe_rules[2]`).
    public var reason: String { "recipe_" + (name ?? path.replacingEvery("recipe.", with: "")) }

    /// A rule's name: 1 to 64 ASCII letters, digits, `_`, `.` and `-` (it goes into status events and logs as is).
    static func isName(_ text: String) -> Bool {
      (1...64).contains(text.utf8.count)
        && text.utf8.allSatisfy { byte in
          (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
            || byte == 0x5F || byte == 0x2E || byte == 0x2D
        }
    }
  }

  /// Status codes as ranges (`"4xx"` is 400…499).
  public struct ClosedRangeSet: Sendable, Equatable {
    public var ranges: [ClosedRange<Int>]
    public func contains(_ status: Int) -> Bool { ranges.contains { $0.contains(status) } }
  }

  /// Every step with its path in the recipe: the session's in order, the poll, then fetch and sync when present.
  var stepsWithPaths: [(path: String, step: Step)] {
    var steps = session.enumerated().map { ("recipe.session[\($0.offset)]", $0.element) }
    steps.append(("recipe.poll", poll))
    if let fetch { steps.append(("recipe.fetch", fetch)) }
    if let sync { steps.append(("recipe.sync", sync.step)) }
    return steps
  }

  /// Every session step's extracted names, in order.
  var sessionNames: Set<String> { Set(session.flatMap { $0.extract.map(\.0) }) }

  /// The session's extracted names whose values are secrets (all but those marked `"secret": false`).
  var secretSessionNames: Set<String> { Set(session.flatMap { $0.extract.filter { $0.1.secret }.map(\.0) }) }

  /// Whether a request carries the credential (per-user relaying needs it).
  public var usesCredential: Bool {
    (session + [poll] + (sync.map { [$0.step] } ?? [])).contains { step in
      step.templates("").contains { $0.1.placeholders.contains(.credential) }
    }
  }

  /// The poll URL with the vars in place and other placeholders as written: what identifies the API in a store. A
  /// var read from the environment that is a secret (`RecipeScope.isSecretValue`: not a URL) stays as written
  /// (`{token}`): the identity is written to the store, printed in errors and served by `/readyz`.
  public var identityURL: String {
    var scope = RecipeScope()
    scope.vars = vars.filter { name, value in
      !environmentVars.contains(name) || !RecipeScope.isSecretValue(value.text)
    }
    return poll.url.parts.map { part in
      switch part {
      case .literal(let text): text
      case .placeholder(let placeholder): scope.value(of: placeholder)?.text ?? placeholder.spelled
      }
    }.joined()
  }

  /// The response headers any source reads, and those the defaults and raw events read (`Retry-After`,
  /// `Content-Type`): only these are taken from an answer.
  var headerNames: [String] {
    var names: [String] = ["Retry-After"]
    func add(_ source: Source?) {
      if case .header(let name)? = source?.origin,
        !names.contains(where: { $0.caseInsensitiveCompare(name) == .orderedSame })
      {
        names.append(name)
      }
    }
    add(events.id)
    add(cursor.initial)
    add(cursor.index)
    for part in cursor.value { add(part.source) }
    for step in session { for (_, source) in step.extract { add(source) } }
    for rule in rules {
      add(rule.after)
      add(rule.to)
    }
    if events.format == .raw { names.append("Content-Type") }
    return names
  }

}

extension Recipe.Step {
  /// Every template of the step, with its path, for validation.
  func templates(_ path: String) -> [(String, RecipeTemplate)] {
    var all = [("\(path).url", url)]
    all += query.map { ("\(path).query.\($0.0)", $0.1) }
    all += headers.map { ("\(path).headers.\($0.0)", $0.1) }
    switch body {
    case .form(let fields): all += fields.map { ("\(path).form.\($0.0)", $0.1) }
    case .json(let value): all += Recipe.Step.strings(in: value, "\(path).json").map { ($0.0, RecipeTemplate($0.1)) }
    case nil: break
    }
    return all
  }

  static func strings(in value: JSONValue, _ path: String) -> [(String, String)] {
    switch value {
    case .string(let text): [(path, text)]
    case .array(let items): items.enumerated().flatMap { strings(in: $0.element, "\(path)[\($0.offset)]") }
    case .object(let members): members.keys.sorted().flatMap { strings(in: members[$0]!, "\(path).\($0)") }
    default: []
    }
  }
}
