import Foundation

extension Recipe {
  /// What a recipe is checked against at load: the environment (`{env:…}` must be set), and whether a credential
  /// fills `{credential}` (the API key in shared mode, the subscriber's key per user).
  public struct Context: Sendable {
    public var environment: [String: String]
    public var hasCredential: Bool
    public init(environment: [String: String], hasCredential: Bool) {
      self.environment = environment
      self.hasCredential = hasCredential
    }
  }

  /// Parses and validates `text`; every problem is named by its path (`recipe.poll.url: …`).
  public static func parse(_ text: String, context: Context) -> Result<Recipe, ConfigurationError> {
    let value: JSONValue
    do {
      value = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
    } catch {
      return .failure(ConfigurationError("recipe: not valid JSON (\(error))"))
    }
    var reader = RecipeReader(context: context)
    let recipe = reader.recipe(value)
    if let recipe, reader.problems.isEmpty { return .success(recipe) }
    return .failure(ConfigurationError(problems: reader.problems.isEmpty ? ["recipe: not usable"] : reader.problems))
  }
}

/// Walks a recipe's JSON, building the model and collecting every problem (not only the first).
struct RecipeReader {
  let context: Recipe.Context
  var problems: [String] = []

  init(context: Recipe.Context) { self.context = context }

  mutating func problem(_ path: String, _ text: String) { problems.append("\(path): \(text)") }

  /// The members of an object, with unknown keys named; nil (with a problem) when it is not an object.
  mutating func object(_ value: JSONValue, _ path: String, keys: Set<String>) -> [String: JSONValue]? {
    guard case .object(let members) = value else {
      problem(path, "expected an object, got \(value.kind)")
      return nil
    }
    for key in members.keys.sorted() where !keys.contains(key) {
      problem("\(path).\(key)", "unknown key (known: \(keys.sorted().joined(separator: ", ")))")
    }
    return members
  }

  mutating func string(_ value: JSONValue?, _ path: String) -> String? {
    guard let value else { return nil }
    guard case .string(let text) = value else {
      problem(path, "expected a string, got \(value.kind)")
      return nil
    }
    return text
  }

  mutating func template(_ value: JSONValue?, _ path: String) -> RecipeTemplate? {
    string(value, path).map { RecipeTemplate($0) }
  }

  mutating func pointer(_ value: JSONValue?, _ path: String, wildcard: Bool) -> String? {
    guard let text = string(value, path) else { return nil }
    if let issue = RecipeReader.pointerProblem(text, wildcard: wildcard) { problem(path, issue) }
    return text
  }

  /// Why `text` is not an RFC 6901 pointer (with at most one `*` segment when `wildcard`), or nil.
  static func pointerProblem(_ text: String, wildcard: Bool) -> String? {
    if text.isEmpty { return nil }
    guard text.hasPrefix("/") else {
      return "\(Setting.shown(text)) is not a JSON pointer (it must be empty or start with /)"
    }
    let segments = text.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
    for segment in segments {
      var index = segment.startIndex
      while let tilde = segment[index...].firstIndex(of: "~") {
        let next = segment.index(after: tilde)
        guard next < segment.endIndex, segment[next] == "0" || segment[next] == "1" else {
          return "\(Setting.shown(text)): ~ must be followed by 0 or 1"
        }
        index = segment.index(after: next)
      }
    }
    let stars = segments.filter { $0 == "*" }.count
    if stars > (wildcard ? 1 : 0) {
      return wildcard
        ? "\(Setting.shown(text)) has more than one * segment" : "\(Setting.shown(text)): * is not allowed here"
    }
    return nil
  }

  // MARK: The recipe

  static let topKeys: Set<String> = [
    "recipe", "name", "stream", "streams", "vars", "session", "sync", "poll", "fetch", "cursor", "rules", "user",
  ]

  mutating func recipe(_ value: JSONValue) -> Recipe? {
    guard let top = object(value, "recipe", keys: RecipeReader.topKeys) else { return nil }
    if let version = top["recipe"], version != .number(1) {
      problem("recipe.recipe", "only version 1 is known")
    }
    let name = string(top["name"], "recipe.name") ?? "recipe"
    let stream = string(top["stream"], "recipe.stream") ?? "default"
    if stream.isEmpty { problem("recipe.stream", "must not be empty") }
    var vars: [String: RecipeValue] = [:]
    var environmentVars: Set<String> = []
    var environmentNames: Set<String> = []
    if let varsValue = top["vars"] {
      if case .object(let members) = varsValue {
        for (key, member) in members {
          switch member {
          case .string(let text):
            // Vars may use {env:NAME} (resolved here) and nothing else.
            let template = RecipeTemplate(text)
            var scope = RecipeScope()
            scope.environment = context.environment
            for placeholder in template.placeholders {
              if case .env(let env, nil) = placeholder, context.environment[env] == nil {
                problem("recipe.vars.\(key)", "{env:\(env)} but the environment has no \(env)")
              } else if case .env(let env, _) = placeholder {
                // A secret only when the environment gives it: a fallback is written in the recipe for all to read
                // (`recipe check` printed CouchDB's database name, `{env:COUCH_DB:-orders}`, as [redacted]).
                if context.environment[env] != nil { environmentVars.insert(key) }
                environmentNames.insert(env)
              } else {
                problem("recipe.vars.\(key)", "\(placeholder.spelled): a var may use only {env:NAME}")
              }
            }
            let rendered = (try? template.render(scope, .text)) ?? text
            vars[key] = RecipeValue(text: rendered)
          case .number(let number) where number.rounded() == number && abs(number) < 9e15:
            vars[key] = RecipeValue(text: String(Int64(number)), json: String(Int64(number)))
          case .bool(let flag):
            vars[key] = RecipeValue(text: String(flag), json: String(flag))
          default:
            problem("recipe.vars.\(key)", "expected a string, an integer or a boolean, got \(member.kind)")
          }
        }
      } else {
        problem("recipe.vars", "expected an object, got \(varsValue.kind)")
      }
    }
    var session: [Recipe.Step] = []
    if let sessionValue = top["session"] {
      if case .array(let steps) = sessionValue {
        for (index, step) in steps.enumerated() {
          if let parsed = self.step(step, "recipe.session[\(index)]", label: "session", events: false) {
            session.append(parsed.step)
          }
        }
      } else {
        problem("recipe.session", "expected an array of steps, got \(sessionValue.kind)")
      }
    }
    var streams: [RecipeTemplate] = []
    if let streamsValue = top["streams"] {
      if case .array(let items) = streamsValue, !items.isEmpty {
        for (index, item) in items.enumerated() {
          if let template = template(item, "recipe.streams[\(index)]") { streams.append(template) }
        }
      } else {
        problem("recipe.streams", "expected a non-empty array of stream names (templates), got \(streamsValue.kind)")
      }
    }
    var sync: Recipe.Sync?
    if let syncValue = top["sync"] {
      if case .object(var members) = syncValue {
        let ids = members.removeValue(forKey: "ids")
        if ids == nil { problem("recipe.sync.ids", "required: a pointer to the map of newest ids by stream") }
        let pointer = self.pointer(ids, "recipe.sync.ids", wildcard: false)
        if let parsed = step(.object(members), "recipe.sync", label: "sync", events: false), let pointer {
          sync = Recipe.Sync(step: parsed.step, ids: pointer)
        }
      } else {
        problem("recipe.sync", "expected an object (a step with ids), got \(syncValue.kind)")
      }
    }
    guard let pollValue = top["poll"] else {
      problem("recipe.poll", "required: the long-poll request")
      return nil
    }
    var fetchParsed: (step: Recipe.Step, events: Recipe.Events?)?
    var fetchWhile: Recipe.Condition?
    if let fetchValue = top["fetch"] {
      if case .object(var members) = fetchValue {
        if let condition = members.removeValue(forKey: "repeat_while") {
          fetchWhile = self.condition(condition, "recipe.fetch.repeat_while")
        }
        fetchParsed = step(.object(members), "recipe.fetch", label: "fetch", events: true)
      } else {
        problem("recipe.fetch", "expected an object (a step with events), got \(fetchValue.kind)")
      }
    }
    let hasFetch = top["fetch"] != nil
    if hasFetch, case .object(let members) = pollValue, members["events"] != nil {
      problem("recipe.poll.events", "with a fetch step, the events come from recipe.fetch.events")
    }
    let pollParsed = step(pollValue, "recipe.poll", label: "poll", events: !hasFetch)
    let cursor = self.cursor(top["cursor"], events: top["poll"])
    var rules: [Recipe.Rule] = []
    if let rulesValue = top["rules"] {
      if case .array(let items) = rulesValue {
        if items.count > RecipeReader.maxRules {
          problem(
            "recipe.rules", "\(items.count) rules: at most \(RecipeReader.maxRules) (every answer is read against them)"
          )
        }
        for (index, item) in items.enumerated() {
          if let rule = self.rule(
            item, "recipe.rules[\(index)]", hasSession: !session.isEmpty, hasFetch: hasFetch, hasSync: sync != nil)
          {
            if let name = rule.name, let earlier = rules.first(where: { $0.name == name }) {
              problem("\(rule.path).name", "\(Setting.shown(name)) is \(earlier.path)'s name too: names are unique")
            }
            rules.append(rule)
          }
        }
      } else {
        problem("recipe.rules", "expected an array of rules, got \(rulesValue.kind)")
      }
    }
    let user = template(top["user"], "recipe.user")
    guard let pollParsed, let events = hasFetch ? fetchParsed?.events : pollParsed.events, let cursor else {
      return nil
    }
    if events.id == nil && !cursor.opaque {
      problem(
        "recipe.poll.events.id",
        "required: an integer cursor is the last event's id (for example {\"event\": \"/id\"}); or use an opaque cursor"
      )
    }
    var recipe = Recipe(
      name: name, stream: stream, vars: vars, session: session, poll: pollParsed.step, events: events, cursor: cursor,
      rules: rules, user: user)
    recipe.fetch = fetchParsed?.step
    recipe.fetchWhile = fetchWhile
    recipe.streams = streams
    recipe.sync = sync
    checkStreams(recipe)
    recipe.environmentVars = environmentVars
    var names = environmentNames
    for (_, step) in recipe.stepsWithPaths {
      for (_, template) in step.templates("") {
        for case .env(let env, _) in template.placeholders { names.insert(env) }
      }
    }
    recipe.environmentNames = names
    checkPlaceholders(recipe)
    checkURLStarts(recipe)
    return recipe
  }

  /// A URL that starts with a var (known at load, `{base}`) must start with `http://` or `https://` once the var is
  /// in place: an empty or schemeless base would otherwise load and fail on every request.
  mutating func checkURLStarts(_ recipe: Recipe) {
    var scope = RecipeScope()
    scope.vars = recipe.vars
    for (path, step) in recipe.stepsWithPaths {
      guard case .placeholder(.name(let name))? = step.url.parts.first, let value = recipe.vars[name] else { continue }
      let start = ((try? step.url.renderKnown(scope)) ?? "").lowercased()
      if !(start.hasPrefix("http://") || start.hasPrefix("https://")) {
        let shown = recipe.environmentVars.contains(name) ? "from the environment" : Setting.shown(value.text)
        problem("\(path).url", "{\(name)} (\(shown)) does not make an http:// or https:// URL")
      }
    }
  }

  /// Every placeholder must be filled by something defined before it is used.
  mutating func checkPlaceholders(_ recipe: Recipe) {
    var known = Set(recipe.vars.keys)
    let context = self.context
    var found: [String] = []
    defer { problems += found }
    func check(_ path: String, _ template: RecipeTemplate, cursor: Bool, reader: inout [String]) {
      for placeholder in template.placeholders {
        switch placeholder {
        case .name(let name) where name.hasPrefix("cursor."):
          let part = String(name.dropFirst(7))
          if !cursor {
            reader.append("\(path): {\(name)} is only known in the poll")
          } else if !recipe.cursor.value.contains(where: { $0.part == part }) {
            reader.append("\(path): {\(name)} but recipe.cursor.value has no part \(Setting.shown(part))")
          }
        case .name(let name) where !known.contains(name):
          reader.append("\(path): {\(name)} but no var or earlier session step's extract defines \(name)")
        case .cursors:
          if !cursor {
            reader.append("\(path): {cursors} is only known in the poll")
          } else if !recipe.isMultiStream {
            reader.append("\(path): {cursors} needs several streams (poll.events.stream); one stream's is {cursor}")
          }
        case .cursor, .next:
          if cursor && recipe.isMultiStream {
            reader.append("\(path): \(placeholder.spelled) but the recipe has several streams: send {cursors}")
          } else if !cursor {
            reader.append(
              "\(path): \(placeholder.spelled) is only known in the poll (a session runs before any cursor)")
          } else if placeholder == .next && recipe.cursor.opaque {
            reader.append("\(path): {next} needs an integer cursor (an opaque one has no successor)")
          } else if placeholder == .cursor && recipe.cursor.value.contains(where: { $0.part != nil }) {
            reader.append("\(path): {cursor} of a cursor in parts: name a part ({cursor.PART})")
          }
        case .env(let name, nil) where context.environment[name] == nil:
          reader.append("\(path): {env:\(name)} but the environment has no \(name)")
        case .credential where !context.hasCredential:
          reader.append(
            "\(path): {credential} but there is no credential (set upstream.api_key, or use auth.mode upstream)")
        default: break
        }
      }
    }
    for (index, step) in recipe.session.enumerated() {
      for (path, template) in step.templates("recipe.session[\(index)]") {
        check(path, template, cursor: false, reader: &found)
      }
      for (name, source) in step.extract {
        if case .event = source.origin {
          found.append("recipe.session[\(index)].extract.\(name): an event source is only known in the poll's events")
        }
        known.insert(name)
      }
    }
    for (index, template) in recipe.streams.enumerated() {
      check("recipe.streams[\(index)]", template, cursor: false, reader: &found)
    }
    if let sync = recipe.sync {
      for (path, template) in sync.step.templates("recipe.sync") {
        check(path, template, cursor: false, reader: &found)
      }
    }
    var polling = recipe.poll.templates("recipe.poll")
    if let fetch = recipe.fetch { polling += fetch.templates("recipe.fetch") }
    for (path, template) in polling { check(path, template, cursor: true, reader: &found) }
    for (index, name) in recipe.cursor.session.enumerated() where !recipe.sessionNames.contains(name) {
      found.append(
        "recipe.cursor.session[\(index)]: session value \(Setting.shown(name)) is not extracted by any session step")
    }
    if !recipe.cursor.session.isEmpty {
      // A relay restarted with a stored cursor polls with the session values kept with it, and no others.
      for (path, template) in polling {
        for case .name(let name) in template.placeholders
        where recipe.sessionNames.contains(name) && !recipe.cursor.session.contains(name) {
          found.append(
            "\(path): {\(name)} is a session value the cursor does not keep (add it to recipe.cursor.session)")
        }
      }
    }
    if case .session(let name) = recipe.cursor.initial?.origin, !recipe.sessionNames.contains(name) {
      found.append(
        "recipe.cursor.initial.name: session value \(Setting.shown(name)) is not extracted by any session step")
    }
    if case .template(let template)? = recipe.events.id?.origin {
      check("recipe.poll.events.id.template", template, cursor: true, reader: &found)
    }
    if let user = recipe.user { check("recipe.user", user, cursor: false, reader: &found) }
  }

  /// What a recipe of several streams needs, and what it cannot have in this build: per-stream integer cursors
  /// (an opaque cursor is the API's one text), no fetch step, no `cursor.index`, no reset rules (which stream's?).
  mutating func checkStreams(_ recipe: Recipe) {
    let scope = recipe.cursor.scope
    guard recipe.isMultiStream else {
      if !recipe.streams.isEmpty {
        problem("recipe.streams", "several streams need poll.events.stream (the map's key, or an event field)")
      }
      if scope == "stream" { problem("recipe.cursor.scope", "stream needs several streams (poll.events.stream)") }
      return
    }
    if recipe.streams.isEmpty {
      problem("recipe.streams", "required with poll.events.stream: the streams the poll asks for")
    }
    if scope == "global" { problem("recipe.cursor.scope", "global, but the events fall into several streams") }
    if recipe.cursor.opaque {
      problem("recipe.cursor.type", "several streams need integer cursors (an opaque cursor is one for all)")
    }
    if recipe.fetch != nil { problem("recipe.fetch", "not supported with several streams") }
    if recipe.cursor.index != nil { problem("recipe.cursor.index", "not supported with several streams") }
    if recipe.cursor.initial != nil {
      problem("recipe.cursor.initial", "several streams start from the sync step's ids (recipe.sync), or at 0")
    }
    if recipe.events.format == .raw { problem("recipe.poll.events.format", "raw events have no stream") }
    for rule in recipe.rules where rule.actions.contains(.reset) {
      problem("\(rule.path).do", "reset is not supported with several streams (which stream's cursor?)")
    }
  }

  // MARK: Steps

  /// Rules a recipe may have: each is tried on every answer, and one with a `*` condition walks the answer again.
  static let maxRules = 100

  static let stepKeys: Set<String> = ["method", "url", "query", "headers", "json", "form", "timeout", "extract"]

  mutating func step(_ value: JSONValue, _ path: String, label: String, events: Bool) -> (
    step: Recipe.Step, events: Recipe.Events?
  )? {
    guard
      let members = object(value, path, keys: events ? RecipeReader.stepKeys.union(["events"]) : RecipeReader.stepKeys)
    else { return nil }
    let method = string(members["method"], "\(path).method") ?? "GET"
    if let issue = OutgoingRequest.problem(inHeaderName: method) { problem("\(path).method", issue) }
    guard let url = template(members["url"], "\(path).url") else {
      if members["url"] == nil { problem("\(path).url", "required") }
      return nil
    }
    if url.parts.isEmpty { problem("\(path).url", "empty: a step needs the URL it asks") }
    let literalStart = url.parts.first.flatMap { if case .literal(let text) = $0 { text } else { nil } } ?? ""
    if url.parts.first.map({ if case .literal = $0 { true } else { false } }) == true
      && !(literalStart.hasPrefix("http://") || literalStart.hasPrefix("https://"))
    {
      problem("\(path).url", "must start with http:// or https:// (or with a placeholder holding the base)")
    }
    if let issue = OutgoingRequest.problem(
      inURL: url.parts.compactMap { if case .literal(let t) = $0 { t } else { nil } }.joined())
    {
      problem("\(path).url", issue)
    }
    let query = pairs(members["query"], "\(path).query", json: true)
    let headers = pairs(members["headers"], "\(path).headers")
    for (name, template) in headers {
      if let issue = OutgoingRequest.problem(inHeaderName: name) { problem("\(path).headers", issue) }
      let literal = template.parts.compactMap { if case .literal(let t) = $0 { t } else { nil } }.joined()
      if let issue = OutgoingRequest.problem(inHeaderValue: literal, "the value of header \(name)") {
        problem("\(path).headers.\(name)", issue)
      }
    }
    var body: Recipe.Step.Body?
    if let json = members["json"] { body = .json(json) }
    if members["form"] != nil {
      if body != nil { problem("\(path).form", "a step has json or form, not both") }
      body = .form(pairs(members["form"], "\(path).form", json: true))
    }
    var timeout: Double?
    if let value = members["timeout"] {
      if case .number(let seconds) = value, seconds > 0, seconds <= Setting.largestNumber {
        timeout = seconds
      } else {
        problem(
          "\(path).timeout",
          "expected a number of seconds greater than 0 and at most 1e9, got \(value.kind == "a number" ? "\(value.text)" : value.kind)"
        )
      }
    }
    var extract: [(String, Recipe.Source)] = []
    if let extractValue = members["extract"] {
      if case .object(let sources) = extractValue {
        for key in sources.keys.sorted() {
          if RecipeTemplate("{\(key)}").single != .name(key) {
            problem("\(path).extract.\(key)", "not a usable name (letters, digits, _ - .; not cursor, next)")
          }
          if let source = source(sources[key]!, "\(path).extract.\(key)") { extract.append((key, source)) }
        }
      } else {
        problem("\(path).extract", "expected an object, got \(extractValue.kind)")
      }
    }
    var parsedEvents: Recipe.Events?
    if events {
      if let eventsValue = members["events"] {
        parsedEvents = self.events(eventsValue, "\(path).events")
      } else {
        problem("\(path).events", "required: where the answer's events are (\"pointer\") and their ids (\"id\")")
      }
    }
    return (
      Recipe.Step(
        label: label, method: method, url: url, query: query, headers: headers, body: body, timeout: timeout,
        extract: extract), parsedEvents
    )
  }

  /// Named templates. With `json` (query and form members), a value that is a number, a boolean, an array or an
  /// object is sent as its compact JSON text (Matrix's `filter`), then percent-encoded like any value; it is sent as
  /// written, so a placeholder inside it is refused rather than left unfilled.
  mutating func pairs(_ value: JSONValue?, _ path: String, json: Bool = false) -> [(String, RecipeTemplate)] {
    guard let value else { return [] }
    guard case .object(let members) = value else {
      problem(path, "expected an object of strings, got \(value.kind)")
      return []
    }
    return members.keys.sorted().compactMap { key in
      let member = members[key]!
      if json, member.kind != "a string", member.kind != "null" {
        let text = member.text
        if !RecipeTemplate(text).placeholders.isEmpty {
          problem(
            "\(path).\(key)",
            "a value given as JSON is sent as written: a placeholder inside it is not filled (write it as a string)")
        }
        return (key, RecipeTemplate(literal: text))
      }
      return template(member, "\(path).\(key)").map { (key, $0) }
    }
  }

}
