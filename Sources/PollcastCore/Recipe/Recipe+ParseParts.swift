import Foundation

/// The recipe reader's parts below a step: events, sources, the cursor, conditions and rules.
extension RecipeReader {
  // MARK: Events, sources, cursor

  mutating func events(_ value: JSONValue, _ path: String) -> Recipe.Events? {
    guard let members = object(value, path, keys: ["pointer", "id", "skip", "format", "stream"]) else { return nil }
    var stream: Recipe.Events.StreamSource?
    switch members["stream"] {
    case nil: break
    case .string("key")?: stream = .key
    case .object(let fields)? where fields.keys.contains("event"):
      if object(members["stream"]!, "\(path).stream", keys: ["event"]) != nil,
        let field = pointer(fields["event"], "\(path).stream.event", wildcard: false)
      {
        if field.isEmpty { problem("\(path).stream.event", "names the whole event, not a field of it") }
        stream = .event(field)
      }
    case let other?:
      problem("\(path).stream", "expected \"key\" (the map's keys) or {\"event\": POINTER}, got \(other.kind)")
    }
    let pointer = self.pointer(members["pointer"], "\(path).pointer", wildcard: true) ?? ""
    var format = Recipe.Events.Format.json
    if let text = string(members["format"], "\(path).format") {
      if let parsed = Recipe.Events.Format(rawValue: text) {
        format = parsed
      } else {
        problem("\(path).format", "\(Setting.shown(text)) is not json or raw")
      }
    }
    var id: Recipe.Source?
    if let idValue = members["id"] {
      if case .object(let idMembers) = idValue, let text = idMembers["template"] {
        _ = object(idValue, "\(path).id", keys: ["template"])
        id = template(text, "\(path).id.template").map { Recipe.Source(origin: .template($0)) }
      } else {
        id = source(idValue, "\(path).id")
      }
      if case .session = id?.origin {
        problem("\(path).id", "an event id comes from the event, a header or a template")
      }
    }
    var skip: [Recipe.Condition] = []
    if let skipValue = members["skip"] {
      if case .array(let items) = skipValue {
        for (index, item) in items.enumerated() {
          if let condition = condition(item, "\(path).skip[\(index)]") { skip.append(condition) }
        }
      } else {
        problem("\(path).skip", "expected an array of conditions, got \(skipValue.kind)")
      }
    }
    if members["id"] != nil && id == nil { return nil }
    return Recipe.Events(pointer: pointer, stream: stream, id: id, skip: skip, format: format)
  }

  mutating func source(_ value: JSONValue, _ path: String) -> Recipe.Source? {
    guard
      let members = object(
        value, path,
        keys: ["body", "header", "event", "const", "from", "name", "add", "unit", "optional", "secret"])
    else { return nil }
    var origins: [Recipe.Source.Origin] = []
    // A body pointer may hold one `*`: the first element or member that has the rest (CometD's `/*/ext/ack`, in
    // whichever message of the answer's array is the connect reply).
    if let body = pointer(members["body"], "\(path).body", wildcard: true) { origins.append(.body(body)) }
    if let header = string(members["header"], "\(path).header") {
      if let issue = OutgoingRequest.problem(inHeaderName: header) { problem("\(path).header", issue) }
      origins.append(.header(header))
    }
    if let event = pointer(members["event"], "\(path).event", wildcard: false) { origins.append(.event(event)) }
    if let constant = members["const"] {
      switch constant {
      case .string(let text): origins.append(.constant(RecipeValue(text: text)))
      case .number(let number) where number.rounded() == number && abs(number) < 9e15:
        origins.append(.constant(RecipeValue(text: String(Int64(number)), json: String(Int64(number)))))
      default: problem("\(path).const", "expected a string or an integer, got \(constant.kind)")
      }
    }
    if let from = string(members["from"], "\(path).from") {
      if from != "session" {
        problem("\(path).from", "\(Setting.shown(from)) is not session (a sync step is not supported yet)")
      } else if let name = string(members["name"], "\(path).name") {
        origins.append(.session(name))
      } else {
        problem("\(path).name", "required with from: the extracted value's name")
      }
    } else if members["name"] != nil {
      problem("\(path).name", "only with from")
    }
    guard origins.count == 1 else {
      problem(path, origins.isEmpty ? "needs one of body, header, event, const, from" : "names more than one origin")
      return nil
    }
    var source = Recipe.Source(origin: origins[0])
    if let add = members["add"] {
      if case .number(let number) = add, number.rounded() == number, abs(number) < 1e15 {
        source.add = Int64(number)
      } else {
        problem("\(path).add", "expected an integer, got \(add.kind)")
      }
    }
    if let optional = members["optional"] {
      if case .bool(let flag) = optional, path.contains(".extract.") {
        source.optional = flag
      } else {
        problem("\(path).optional", "a boolean, and only on a session step's extract")
      }
    }
    if let secret = members["secret"] {
      if case .bool(let flag) = secret, path.contains(".extract.") {
        source.secret = flag
      } else {
        problem("\(path).secret", "a boolean, and only on a session step's extract")
      }
    }
    if let unit = string(members["unit"], "\(path).unit") {
      switch unit {
      case "s": source.milliseconds = false
      case "ms": source.milliseconds = true
      default: problem("\(path).unit", "\(Setting.shown(unit)) is not s or ms")
      }
    }
    return source
  }

  mutating func cursor(_ value: JSONValue?, events: JSONValue?) -> Recipe.Cursor? {
    guard let value else { return Recipe.Cursor() }
    guard
      let members = object(
        value, "recipe.cursor",
        keys: ["type", "scope", "initial", "index", "backwards", "value", "dedupe", "session", "list"])
    else { return nil }
    var cursor = Recipe.Cursor()
    if let type = string(members["type"], "recipe.cursor.type") {
      switch type {
      case "integer": cursor.opaque = false
      case "opaque": cursor.opaque = true
      default: problem("recipe.cursor.type", "\(Setting.shown(type)) is not integer or opaque")
      }
    }
    if let scope = string(members["scope"], "recipe.cursor.scope") {
      if scope != "global" && scope != "stream" {
        problem("recipe.cursor.scope", "\(Setting.shown(scope)) is not global (one cursor) or stream (one per stream)")
      }
      cursor.scope = scope
    }
    if let list = members["list"], let fields = object(list, "recipe.cursor.list", keys: ["each", "join"]) {
      if let each = string(fields["each"], "recipe.cursor.list.each") {
        let placeholders = RecipeTemplate(each).placeholders
        if !placeholders.contains(.cursor) { problem("recipe.cursor.list.each", "must hold {cursor}") }
        for placeholder in placeholders where placeholder != .cursor && placeholder != .name("stream") {
          problem("recipe.cursor.list.each", "\(placeholder.spelled): only {stream} and {cursor} are known here")
        }
        cursor.listEach = RecipeTemplate(each)
      }
      if let join = string(fields["join"], "recipe.cursor.list.join") { cursor.listJoin = join }
    }
    if let backwards = string(members["backwards"], "recipe.cursor.backwards"), backwards != "follow" {
      problem("recipe.cursor.backwards", "\(Setting.shown(backwards)): only follow is supported yet (see cursor.index)")
    }
    let sourceKeys: Set<String> = ["body", "header", "event", "const", "from", "name", "add", "unit", "optional"]
    if let valueMember = members["value"] {
      if !cursor.opaque {
        problem(
          "recipe.cursor.value", "only for an opaque cursor: an integer cursor is the last event's id (poll.events.id)")
      } else if case .object(let parts) = valueMember, !parts.keys.contains(where: { sourceKeys.contains($0) }) {
        for name in parts.keys.sorted() {
          if RecipeTemplate("{cursor.\(name)}").single != .name("cursor.\(name)") {
            problem("recipe.cursor.value.\(name)", "not a usable part name (letters, digits, _ -)")
          }
          if let source = source(parts[name]!, "recipe.cursor.value.\(name)") { cursor.value.append((name, source)) }
        }
        if parts.isEmpty { problem("recipe.cursor.value", "an empty object names no part") }
      } else if let source = source(valueMember, "recipe.cursor.value") {
        cursor.value = [(nil, source)]
      }
      for (part, source) in cursor.value {
        switch source.origin {
        case .body, .header, .event: break
        default:
          problem(
            "recipe.cursor.value" + (part.map { ".\($0)" } ?? ""),
            "the next cursor comes from the answer's body, a header, or its last event (event)")
        }
      }
    } else if cursor.opaque {
      problem("recipe.cursor.value", "required for an opaque cursor: where the next cursor is in an answer")
    }
    if let dedupe = members["dedupe"] {
      if !cursor.opaque { problem("recipe.cursor.dedupe", "only for an opaque cursor (integer ids dedupe by order)") }
      if let fields = object(dedupe, "recipe.cursor.dedupe", keys: ["key", "window"]) {
        var keys: [String] = []
        if case .array(let items)? = fields["key"], !items.isEmpty {
          for (index, item) in items.enumerated() {
            if let pointer = pointer(item, "recipe.cursor.dedupe.key[\(index)]", wildcard: false) {
              keys.append(pointer)
            }
          }
        } else {
          problem("recipe.cursor.dedupe.key", "required: a non-empty array of pointers into an event")
        }
        var window = 4096
        if let windowValue = fields["window"] {
          if case .number(let number) = windowValue, number.rounded() == number, (1...1_000_000).contains(number) {
            window = Int(number)
          } else {
            problem("recipe.cursor.dedupe.window", "expected an integer 1-1000000")
          }
        }
        cursor.dedupe = (keys, window)
      }
    }
    if let initialValue = members["initial"] {
      cursor.initial = source(initialValue, "recipe.cursor.initial")
      switch cursor.initial?.origin {
      case .event?: problem("recipe.cursor.initial", "an initial cursor cannot come from an event")
      case .body?: problem("recipe.cursor.initial", "use from: session for a value of an answer")
      case .header?: problem("recipe.cursor.initial", "use from: session for a header's value")
      default: break
      }
      if cursor.value.contains(where: { $0.part != nil }) {
        problem("recipe.cursor.initial", "a cursor in parts starts empty (its first poll sends none)")
      }
    }
    if let sessionValue = members["session"] {
      if !cursor.opaque { problem("recipe.cursor.session", "only for an opaque cursor") }
      if case .array(let items) = sessionValue, !items.isEmpty {
        for (index, item) in items.enumerated() {
          if let name = string(item, "recipe.cursor.session[\(index)]") { cursor.session.append(name) }
        }
      } else {
        problem("recipe.cursor.session", "expected a non-empty array of session value names")
      }
    }
    if let indexValue = members["index"] {
      if cursor.opaque { problem("recipe.cursor.index", "only for an integer cursor") }
      cursor.index = source(indexValue, "recipe.cursor.index")
      switch cursor.index?.origin {
      case .header?, .body?, nil: break
      default: problem("recipe.cursor.index", "the answer's index comes from a header or the body")
      }
    }
    return cursor
  }

  // MARK: Rules

  mutating func condition(_ value: JSONValue, _ path: String, negatable: Bool = true) -> Recipe.Condition? {
    if case .object(let members) = value, members["not"] != nil {
      // `{"not": {…}}`: the inner condition negated; nothing beside it, and one `not` only.
      guard negatable else {
        problem("\(path).not", "a not inside a not: write the condition itself")
        return nil
      }
      guard let outer = object(value, path, keys: ["not"]), let inner = outer["not"] else { return nil }
      guard var condition = condition(inner, "\(path).not", negatable: false) else { return nil }
      condition.negated = true
      return condition
    }
    guard let members = object(value, path, keys: ["pointer", "equals", "in", "exists", "prefix"]) else { return nil }
    guard let pointer = pointer(members["pointer"], "\(path).pointer", wildcard: true) else {
      if members["pointer"] == nil { problem("\(path).pointer", "required") }
      return nil
    }
    var tests: [Recipe.Condition.Test] = []
    if let equals = members["equals"] { tests.append(.equals(equals)) }
    if let values = members["in"] {
      if case .array(let items) = values, !items.isEmpty {
        tests.append(.oneOf(items))
      } else {
        problem("\(path).in", "expected a non-empty array (an empty one never matches)")
      }
    }
    if let exists = members["exists"] {
      if case .bool(let flag) = exists {
        tests.append(.exists(flag))
      } else {
        problem("\(path).exists", "expected a boolean, got \(exists.kind)")
      }
    }
    if let prefix = string(members["prefix"], "\(path).prefix") { tests.append(.prefix(prefix)) }
    guard tests.count == 1 else {
      problem(path, tests.isEmpty ? "needs one of equals, in, exists, prefix" : "has more than one test")
      return nil
    }
    return Recipe.Condition(pointer: pointer, test: tests[0])
  }

  mutating func rule(
    _ value: JSONValue, _ path: String, hasSession: Bool, hasFetch: Bool = false, hasSync: Bool = false
  ) -> Recipe.Rule? {
    guard
      let members = object(value, path, keys: ["name", "step", "status", "when", "do", "after", "to", "gap"])
    else {
      return nil
    }
    let name = string(members["name"], "\(path).name")
    if let name, !Recipe.Rule.isName(name) {
      problem("\(path).name", "\(Setting.shown(name)) is not 1 to 64 of A-Z, a-z, 0-9, _, . and -")
    }
    let step = string(members["step"], "\(path).step") ?? "poll"
    if !["poll", "session", "fetch", "sync", "*"].contains(step) {
      problem(
        "\(path).step", "\(Setting.shown(step)) is not poll, session, fetch, sync or * (so the rule could never match)")
    }
    if step == "fetch" && !hasFetch { problem("\(path).step", "the recipe has no fetch step to match") }
    if step == "session" && !hasSession { problem("\(path).step", "the recipe has no session step to match") }
    if step == "sync" && !hasSync { problem("\(path).step", "the recipe has no sync step to match") }
    var statuses: Recipe.ClosedRangeSet?
    if let status = members["status"] {
      var ranges: [ClosedRange<Int>] = []
      let items: [JSONValue]
      if case .array(let list) = status { items = list } else { items = [status] }
      for item in items {
        switch item {
        case .number(let number) where number.rounded() == number && (100...599).contains(number):
          ranges.append(Int(number)...Int(number))
        case .string(let text) where text.count == 3 && text.hasSuffix("xx") && ("1"..."5").contains(text.prefix(1)):
          let hundred = Int(text.prefix(1))! * 100
          ranges.append(hundred...(hundred + 99))
        default:
          problem("\(path).status", "\(item.kind) is not a status code 100-599 or a class like \"4xx\" (never matches)")
        }
      }
      if items.isEmpty { problem("\(path).status", "an empty list never matches") }
      statuses = Recipe.ClosedRangeSet(ranges: ranges)
    }
    var when: [Recipe.Condition] = []
    if let whenValue = members["when"] {
      let items: [JSONValue]
      if case .array(let list) = whenValue { items = list } else { items = [whenValue] }
      for (index, item) in items.enumerated() {
        if let condition = condition(item, items.count == 1 ? "\(path).when" : "\(path).when[\(index)]") {
          when.append(condition)
        }
      }
    }
    var actions: [Recipe.Action] = []
    switch members["do"] {
    case .string(let text)?:
      if let action = Recipe.Action(rawValue: text) {
        actions = [action]
      } else {
        problem(
          "\(path).do",
          "\(Setting.shown(text)) is not one of \(Recipe.Action.allCases.map(\.rawValue).joined(separator: ", "))")
      }
    case .array(let list)?:
      if list.isEmpty { problem("\(path).do", "an empty list does nothing: name at least one action") }
      for (index, item) in list.enumerated() {
        if case .string(let text) = item, let action = Recipe.Action(rawValue: text) {
          actions.append(action)
        } else {
          problem(
            "\(path).do[\(index)]", "not one of \(Recipe.Action.allCases.map(\.rawValue).joined(separator: ", "))")
        }
      }
    case nil: problem("\(path).do", "required: what the rule does")
    case let other?: problem("\(path).do", "expected an action or a list of actions, got \(other.kind)")
    }
    if actions.contains(.session) && !hasSession { problem("\(path).do", "session but the recipe has no session step") }
    if actions.contains(.fetch) && !hasFetch { problem("\(path).do", "fetch but the recipe has no fetch step") }
    if actions.contains(.fetch) && step != "poll" {
      problem("\(path).do", "fetch follows a poll's answer (step: poll)")
    }
    let exclusive: [Recipe.Action] = [.continue, .empty, .retry, .fail, .fetch, .refuseKey]
    if actions.filter({ exclusive.contains($0) }).count > 1
      || (actions.count > 1 && actions.contains(where: { exclusive.contains($0) }))
    {
      problem("\(path).do", "\(exclusive.map(\.rawValue).joined(separator: ", ")) each stand alone")
    }
    let after = members["after"].flatMap { source($0, "\(path).after") }
    if after != nil && !actions.contains(where: { [.retry, .continue, .empty, .fetch].contains($0) }) {
      problem(
        "\(path).after", "only with do: retry (the wait), or continue, empty or fetch (the wait before the next poll)")
    }
    let to = members["to"].flatMap { source($0, "\(path).to") }
    if case .event = to?.origin { problem("\(path).to", "a reset target comes from the answer, not an event") }
    if to != nil && !actions.contains(.reset) { problem("\(path).to", "only with do: reset") }
    if actions == [.reset] && to == nil { problem("\(path).to", "required with do: reset (where the cursor goes)") }
    var gap = false
    if let gapValue = members["gap"] {
      if case .bool(let flag) = gapValue { gap = flag } else { problem("\(path).gap", "expected a boolean") }
      if !actions.contains(.reset) { problem("\(path).gap", "only with do: reset") }
    }
    if actions.contains(.reset) && step == "session" { problem("\(path).do", "reset reads a poll's answer") }
    // A sync answer sets every stream's cursor from its ids: there is no cursor of its own to reset, no events to
    // skip and nothing to fetch.
    if step == "sync", let other = actions.first(where: { [.reset, .empty, .fetch].contains($0) }) {
      problem(
        "\(path).do", "\(other.rawValue) acts on a poll's answer; a sync rule can continue, session, retry or fail")
    }
    return Recipe.Rule(
      step: step, statuses: statuses, when: when, actions: actions, after: after, to: to, gap: gap, path: path,
      name: name)
  }
}
