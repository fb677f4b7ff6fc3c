import Foundation

/// What a recipe makes of one answer: rules first, in order (the first match wins), then the defaults — 2xx
/// relays its events (204 or an all-whitespace body is an empty answer), 401 starts a new session when the recipe
/// has one, 429 and 503 wait for `Retry-After` when the server sent it, anything else backs off. Pure functions of
/// the answer, so they run off the loop for a large body and are tested without sockets.
enum RecipeAnswer {
  /// Where sources read from: the answer (body, headers), the current event, and the placeholders' values.
  struct Context {
    var json: RawJSON?
    var headers: [(name: String, value: String)] = []
    var event: RawJSON?
    var scope: RecipeScope

    init(json: RawJSON? = nil, headers: [(name: String, value: String)] = [], event: RawJSON? = nil, scope: RecipeScope)
    {
      self.json = json
      self.headers = headers
      self.event = event
      self.scope = scope
    }

    func header(_ name: String) -> String? {
      headers.last { $0.name.caseInsensitiveCompare(name) == .orderedSame }?.value
    }
  }

  enum PollAction {
    case answer(UpstreamPollAnswer)
    /// A new session; with a reset, the cursor then goes to `to` (nil: `cursor.initial` after the session).
    case session(reset: SessionReset?)
    /// The poll said there is news: run the fetch step (`Recipe.fetch`).
    case fetch
    case error(UpstreamError)
  }

  struct SessionReset: Sendable {
    var to: UInt64?
    /// An opaque cursor's new text (nil: `cursor.initial` after the session).
    var token: String?
    var gap: Bool
    var reason: String
  }

  struct PollVerdict {
    var action: PollAction
    var rule: String?
    /// Opaque cursors with `cursor.dedupe`: each message's dedupe key (nil: none), in the order of the answer's one
    /// batch. Empty for any other recipe (read as nil for every message).
    var keys: [String?] = []
    /// A fetch step's answer says there is more (`fetch.repeat_while`): fetch again from its cursor.
    var more = false
    /// With `.fetch`: the wait before the next poll (the rule's `after`).
    var after: Double?
  }

  struct SessionOutcome {
    var values: Result<[String: RecipeValue], UpstreamError>
    var rule: String?
  }

  /// Decodes a body (UTF-8 repair, JSON when it is JSON) and interprets it, off the loop when it is large.
  static func decode<T: Sendable>(
    _ response: UpstreamResponse, weight: Int, isolation: isolated (any Actor)? = #isolation,
    _ interpret: @escaping @Sendable (RepairedText, RawJSON?) -> T
  ) async -> T {
    let body = response.body
    return await response.offLoopIfLarge(weight: weight) { decodeHere(body, interpret) }
  }

  /// Whether `decode` would run here, on the loop: a caller then calls `decodeHere` and awaits nothing (an async call
  /// costs its frame in the task's memory for as long as the task lives, and per-user relaying has a task per
  /// account).
  /// `weight` is the recipe's `RecipeStorage.readingWeight`: an answer read many times over is read off the loop.
  static func decodesHere(_ response: UpstreamResponse, weight: Int) -> Bool {
    response.isSmall(weight: weight)
  }

  /// The body decoded (UTF-8 repair, JSON when it is JSON) and interpreted, on this thread.
  @inline(never)
  static func decodeHere<T>(_ body: [UInt8], _ interpret: (RepairedText, RawJSON?) -> T) -> T {
    let text = RepairedText(body)
    let trimmed = text.text.utf8.contains { !($0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09) }
    return interpret(text, trimmed ? try? RawJSON.parse(text.text) : nil)
  }

  // MARK: Sources and conditions

  /// A source's value, or nil when what it names is absent.
  static func value(_ source: Recipe.Source, _ context: Context) -> RecipeValue? {
    var found: RecipeValue?
    switch source.origin {
    case .body(let pointer):
      if pointer.hasWildcardSegment {
        found = context.json.flatMap { resolveAll($0, pointer).lazy.compactMap(value(of:)).first }
      } else {
        found = context.json?.resolve(pointer: pointer).flatMap(value(of:))
      }
    case .event(let pointer): found = context.event?.resolve(pointer: pointer).flatMap(value(of:))
    case .header(let name): found = context.header(name).map { RecipeValue(text: $0) }
    case .constant(let constant): found = constant
    case .session(let name): found = context.scope[name]
    case .template(let template): found = (try? template.render(context.scope, .text)).map { RecipeValue(text: $0) }
    }
    guard source.add != 0, let text = found?.text else { return found }
    guard let number = Int64(text.trimmingSpacesAndTabs) else { return nil }
    let (sum, overflow) = number.addingReportingOverflow(source.add)
    return overflow ? nil : RecipeValue(text: String(sum), json: String(sum))
  }

  static func value(of json: RawJSON) -> RecipeValue? {
    switch json.value {
    case .null, .tooDeep: nil
    case .string(let text): RecipeValue(text: text, json: json.rawText)
    default: RecipeValue(text: json.rawText, json: json.rawText)
    }
  }

  /// A source that must hold an unsigned integer.
  static func integer(_ source: Recipe.Source, _ context: Context, _ what: String) throws(UpstreamError) -> UInt64 {
    guard let value = value(source, context) else { throw UpstreamError(.decoding, "\(what): names nothing") }
    guard let number = UInt64(value.text.trimmingSpacesAndTabs) else {
      let shown = UpstreamResponse.scrub(value.text, context.scope.redactions ?? context.scope.secrets)
      throw UpstreamError(.decoding, "\(what): \"\(shown.prefix(40))\" is not an unsigned integer")
    }
    return number
  }

  /// A delay in seconds: a number (in the source's unit) or an HTTP date.
  static func delay(_ source: Recipe.Source, _ context: Context) -> Double? {
    guard let text = (value(source, context)?.text.trimmingSpacesAndTabs).map(String.init) else { return nil }
    if let number = Double(text), number.isFinite, number >= 0 { return source.milliseconds ? number / 1000 : number }
    // The clock is read here, only for an HTTP date, not on every answer.
    return httpDate(text).map { max(0, $0.timeIntervalSinceNow) }
  }

  static func httpDate(_ text: String) -> Date? {
    let formatter = DateFormatter()
    formatter.locale = Locale(identifier: "en_US_POSIX")
    formatter.timeZone = TimeZone(identifier: "GMT")
    formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
    return formatter.date(from: text)
  }

  /// The values a pointer names; one `*` segment stands for every element or member.
  static func resolveAll(_ json: RawJSON, _ pointer: String) -> [RawJSON] {
    guard let star = pointer.firstSlashStar,
      star.upperBound == pointer.endIndex || pointer[star.upperBound] == "/"
    else { return json.resolve(pointer: pointer).map { [$0] } ?? [] }
    let prefix = String(pointer[..<star.lowerBound])
    let suffix = String(pointer[star.upperBound...])
    guard let container = json.resolve(pointer: prefix) else { return [] }
    let elements: [RawJSON]
    switch container.value {
    case .array(let items): elements = items
    case .object(let members): elements = members.map(\.value)
    default: return []
    }
    return elements.compactMap { $0.resolve(pointer: suffix) }
  }

  static func matches(_ condition: Recipe.Condition, _ json: RawJSON?) -> Bool {
    let found = json.map { resolveAll($0, condition.pointer) } ?? []
    let holds: Bool
    switch condition.test {
    case .exists(let wanted): holds = found.isEmpty != wanted
    case .equals(let expected): holds = found.contains { equal($0, expected) }
    case .oneOf(let options): holds = found.contains { value in options.contains { equal(value, $0) } }
    case .prefix(let prefix): holds = found.contains { $0.stringValue?.hasPrefix(prefix) == true }
    }
    return holds != condition.negated
  }

  static func equal(_ json: RawJSON, _ expected: JSONValue) -> Bool {
    switch (json.value, expected) {
    case (.null, .null): true
    case (.bool(let a), .bool(let b)): a == b
    case (.number(let text), .number(let b)): Double(text) == b
    case (.string(let a), .string(let b)): a == b
    default: false
    }
  }

  static func rule(
    _ rules: [Recipe.Rule], step: String, status: Int, json: RawJSON?
  ) -> Recipe.Rule? {
    rules.first { rule in
      (rule.step == step || rule.step == "*") && (rule.statuses?.contains(status) ?? true)
        && rule.when.allSatisfy { matches($0, json) }
    }
  }

  static func retryDefault(status: Int, context: Context) -> Double? {
    guard status == 429 || status == 503, let header = context.header("Retry-After") else { return nil }
    // The worker bounds the delay (`UpstreamError.maxRetryAfter`); a negative number means "now".
    return delay(Recipe.Source(origin: .header("Retry-After")), context) ?? (Double(header) == nil ? nil : 0)
  }

  // MARK: Session steps

  @inline(never)  // called from async functions: inlined, its temporaries would sit in their frames
  static func interpretSession(
    status: Int, headers: [(name: String, value: String)], text: RepairedText, json: RawJSON?, step: Recipe.Step,
    rules: [Recipe.Rule], scope: RecipeScope, path: String
  ) -> SessionOutcome {
    let context = Context(json: json, headers: headers, scope: scope)
    let rule = rule(rules, step: "session", status: status, json: json)
    let fail = { (message: String, retry: Double?) in
      SessionOutcome(
        values: .failure(
          UpstreamError(.status(status), message, cause: snippet(text, scope), retryAfter: retry)), rule: rule?.label)
    }
    switch rule?.actions.first {
    case .retry?:
      return fail("\(path) answered \(status): \(rule!.label) says retry", rule!.after.flatMap { delay($0, context) })
    case .fail?: return fail("\(path) answered \(status): \(rule!.label) says fail", nil)
    case .refuseKey?:
      return SessionOutcome(
        values: .failure(
          UpstreamError(.invalidCredential, "\(path) answered \(status): \(rule!.label) refuses the key")),
        rule: rule?.label)
    case .continue?, .empty?: break
    case nil where (200...299).contains(status): break
    case nil: return fail("\(path) answered \(status)", retryDefault(status: status, context: context))
    default: return fail("\(path) answered \(status): \(rule!.label) cannot act on a session step", nil)
    }
    var values: [String: RecipeValue] = [:]
    for (name, source) in step.extract {
      guard let value = value(source, context) else {
        if source.optional { continue }
        return SessionOutcome(
          values: .failure(
            UpstreamError(
              .decoding, "\(path).extract.\(name): the answer has no such value", cause: shape(context.json))),
          rule: rule?.label)
      }
      // A JSON object or array taken whole may hold the answer's own whitespace; only text is sent back as it is.
      let container = value.json == value.text && (value.text.hasPrefix("{") || value.text.hasPrefix("["))
      do throws(UpstreamError) {
        if !container { try refuseControlBytes(value.text, "\(path).extract.\(name)") }
      } catch {
        return SessionOutcome(values: .failure(error), rule: rule?.label)
      }
      values[name] = value
    }
    return SessionOutcome(values: .success(values), rule: rule?.label)
  }

  // MARK: The cursor sync

  /// A sync step's answer: the newest id of each of `streams` from the map at `recipe.sync.ids`. The first rule for
  /// `sync` (or `*`) that matches decides: `continue` reads the ids whatever the status, `session` starts a new
  /// session, `retry` waits `after` (or backs off), `fail` is an error with the answer's status. With no rule, 2xx
  /// is the answer, 401 a new session when the recipe has one, 429 and 503 wait for `Retry-After`, anything else
  /// backs off.
  @inline(never)  // called from async functions: inlined, its temporaries would sit in their frames
  static func interpretSync(
    status: Int, headers: [(name: String, value: String)], text: RepairedText, json: RawJSON?, recipe: Recipe,
    scope: RecipeScope, streams: [String]
  ) -> Result<[String: UInt64], UpstreamError> {
    guard let sync = recipe.sync else { return .success([:]) }
    let context = Context(json: json, headers: headers, scope: scope)
    func failure(_ message: String, retry: Double?) -> Result<[String: UInt64], UpstreamError> {
      .failure(UpstreamError(.status(status), message, cause: snippet(text, scope), retryAfter: retry))
    }
    let rule = rule(recipe.rules, step: "sync", status: status, json: json)
    switch rule?.actions {
    case nil:
      if (200...299).contains(status) { break }
      if status == 401 && !recipe.session.isEmpty {
        return .failure(UpstreamError(.sessionExpired, "sync: token refused (401)"))
      }
      return failure("sync answered \(status)", retry: retryDefault(status: status, context: context))
    case let actions? where actions.contains(.session) && !recipe.session.isEmpty:
      return .failure(UpstreamError(.sessionExpired, "sync answered \(status): \(rule!.label) says session"))
    case [.continue]?: break
    case [.retry]?:
      return failure(
        "sync answered \(status): \(rule!.label) says retry",
        retry: rule!.after.flatMap { delay($0, context) } ?? retryDefault(status: status, context: context))
    case [.fail]?: return failure("sync answered \(status): \(rule!.label) says fail", retry: nil)
    case [.refuseKey]?:
      return .failure(UpstreamError(.invalidCredential, "sync answered \(status): \(rule!.label) refuses the key"))
    default:  // a `*` rule's reset, empty or fetch: they act on a poll's answer
      return failure("sync answered \(status): \(rule!.label) cannot act on a sync step", retry: nil)
    }
    guard let json else {
      return .failure(UpstreamError(.decoding, "sync answer is not JSON", cause: snippet(text, scope)))
    }
    guard let map = sync.ids.isEmpty ? json : json.resolve(pointer: sync.ids), case .object(let members) = map.value
    else {
      return .failure(
        UpstreamError(
          .decoding, "recipe.sync.ids \"\(sync.ids)\" does not name an object in the answer",
          cause: snippet(text, scope)))
    }
    var ids: [String: UInt64] = [:]
    for (stream, value) in members {
      guard let text = self.value(of: value)?.text, let id = UInt64(text.trimmingSpacesAndTabs) else {
        return .failure(
          UpstreamError(
            .decoding, "recipe.sync.ids: the id of stream \(stream) is not an unsigned integer",
            cause: UpstreamResponse.scrub(String(value.rawText.prefix(40)), scope.redactions ?? scope.secrets)))
      }
      ids[stream] = id
    }
    for stream in streams where ids[stream] == nil {
      return .failure(UpstreamError(.decoding, "recipe.sync.ids: the answer has no id for stream \(stream)"))
    }
    return .success(ids)
  }

  // MARK: Polls

  /// A poll's answer, or (`step: "fetch"`) a fetch step's. With a fetch step, a poll's answer carries no events: it
  /// is news to fetch (a `fetch` rule) or none.
  @inline(never)  // called from async functions: inlined, its temporaries would sit in their frames
  static func interpretPoll(
    status: Int, headers: [(name: String, value: String)], text: RepairedText, json: RawJSON?, recipe: Recipe,
    scope: RecipeScope, step: String = "poll"
  ) -> PollVerdict {
    var verdict = interpret(
      status: status, headers: headers, text: text, json: json, recipe: recipe, scope: scope, step: step)
    if step == "fetch", case .answer = verdict.action, let condition = recipe.fetchWhile {
      verdict.more = matches(condition, json)
    }
    return verdict
  }

  private static func interpret(
    status: Int, headers: [(name: String, value: String)], text: RepairedText, json: RawJSON?, recipe: Recipe,
    scope: RecipeScope, step: String
  ) -> PollVerdict {
    let context = Context(json: json, headers: headers, scope: scope)
    let rule = rule(recipe.rules, step: step, status: status, json: json)
    // A poll followed by a fetch step brings no events itself.
    let notifyOnly = recipe.fetch != nil && step == "poll"
    let blank = json == nil && !text.text.utf8.contains { !($0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09) }
    func failure(_ kind: UpstreamError.Kind, _ message: String, retry: Double? = nil) -> PollVerdict {
      PollVerdict(
        action: .error(UpstreamError(kind, message, cause: snippet(text, scope), retryAfter: retry)), rule: rule?.label)
    }
    // `after` with continue, empty or fetch: the wait before the next poll (Dropbox's `backoff`).
    let after = rule.flatMap { rule in rule.actions.contains(.retry) ? nil : rule.after.flatMap { delay($0, context) } }
    var emptyAnswer = UpstreamPollAnswer(batches: recipe.isMultiStream ? [] : [(recipe.stream, [])])
    emptyAnswer.nextPollAfter = after
    let empty = PollVerdict(action: .answer(emptyAnswer), rule: rule?.label)
    guard let rule else {
      if (200...299).contains(status) {
        if status == 204 || blank || notifyOnly { return empty }
        return events(recipe, text: text, context: context, rule: nil)
      }
      if status == 401 && !recipe.session.isEmpty {
        return PollVerdict(action: .session(reset: nil), rule: nil)
      }
      return failure(
        .status(status), "\(step) answered \(status)", retry: retryDefault(status: status, context: context))
    }
    let actions = rule.actions
    let reason = rule.reason
    if actions.contains(.session) {
      var to: UInt64?
      var token: String?
      if actions.contains(.reset), let source = rule.to {
        if recipe.cursor.opaque {
          guard let text = value(source, context)?.text else {
            return failure(.decoding, "\(rule.path).to: the answer has no value there")
          }
          if let error = controlByteRefusal(text, "\(rule.path).to") {
            return PollVerdict(action: .error(error), rule: rule.label)
          }
          to = scope.cursor ?? 0
          token = text
        } else {
          guard let value = try? integer(source, context, "\(rule.path).to") else {
            return failure(.decoding, "\(rule.path).to: the answer has no unsigned integer there")
          }
          to = value
        }
      }
      let reset =
        actions.contains(.reset) ? SessionReset(to: to, token: token, gap: rule.gap, reason: reason) : nil
      return PollVerdict(action: .session(reset: reset), rule: rule.label)
    }
    switch actions.first {
    case .reset?:
      var answer = UpstreamPollAnswer(batches: [(recipe.stream, [])])
      if recipe.cursor.opaque {
        // The API's new cursor text; the relay's own count of events stays where it is.
        guard let source = rule.to, let text = value(source, context)?.text else {
          return failure(.decoding, "\(rule.path).to: the answer has no value there")
        }
        if let error = controlByteRefusal(text, "\(rule.path).to") {
          return PollVerdict(action: .error(error), rule: rule.label)
        }
        answer.tokens[recipe.stream] = text
        answer.resets = [
          UpstreamCursorReset(stream: recipe.stream, to: scope.cursor ?? 0, gap: rule.gap, reason: reason)
        ]
      } else {
        guard let source = rule.to, let to = try? integer(source, context, "\(rule.path).to") else {
          return failure(.decoding, "\(rule.path).to: the answer has no unsigned integer there")
        }
        answer.resets = [UpstreamCursorReset(stream: recipe.stream, to: to, gap: rule.gap, reason: reason)]
      }
      return PollVerdict(action: .answer(answer), rule: rule.label)
    case .empty?: return empty
    case .retry?:
      return failure(
        .status(status), "\(step) answered \(status): \(rule.label) says retry",
        retry: rule.after.flatMap { delay($0, context) } ?? retryDefault(status: status, context: context))
    case .fail?:
      return failure(.status(status), "\(step) answered \(status): \(rule.label) says fail")
    case .refuseKey?:
      return failure(.invalidCredential, "\(step) answered \(status): \(rule.label) refuses the key")
    case .fetch?:
      var verdict = PollVerdict(action: .fetch, rule: rule.label)
      verdict.after = after
      return verdict
    default:  // continue
      if status == 204 || blank || notifyOnly { return empty }
      var verdict = events(recipe, text: text, context: context, rule: rule.label)
      if case .answer(var answer) = verdict.action {
        answer.nextPollAfter = after
        verdict.action = .answer(answer)
      }
      return verdict
    }
  }

  /// The answer's events, each with its id; an event that cannot be relayed is rejected alone (with its id when
  /// it has one, so the cursor moves past it), one the recipe skips moves the cursor quietly. An opaque recipe's
  /// events get their numbers later (`RecipeAdapter`, after dedupe) and the answer carries the API's next cursor.
  static func events(_ recipe: Recipe, text: RepairedText, context: Context, rule: String?) -> PollVerdict {
    let spec = recipe.events
    func failed(_ error: UpstreamError) -> PollVerdict { PollVerdict(action: .error(error), rule: rule) }
    var elements: [RawJSON] = []
    var repairedText: RepairedText? = text
    var answer = UpstreamPollAnswer(batches: [])
    /// Each element's stream (several streams), in the order of `elements`.
    var streams: [String] = []
    /// The streams a map keyed by stream holds an array for (an empty one too), in its order.
    var listed: [String] = []
    switch spec.format {
    case .raw:
      let wrapped = JSONText.object([
        ("body", JSONText.quoted(text.text)),
        ("content_type", JSONText.quoted(context.header("Content-Type") ?? "application/octet-stream")),
      ])
      guard let event = try? RawJSON.parse(wrapped) else {
        return failed(UpstreamError(.decoding, "poll answer cannot be wrapped as an event"))
      }
      elements = [event]
      repairedText = nil
    case .json:
      guard let json = context.json else {
        return failed(UpstreamError(.decoding, "poll answer is not JSON", cause: snippet(text, context.scope)))
      }
      if let source = spec.stream {
        guard let target = spec.pointer.isEmpty ? json : json.resolve(pointer: spec.pointer) else {
          return failed(
            UpstreamError(.decoding, "recipe.poll.events.pointer \"\(spec.pointer)\" names nothing in the answer"))
        }
        switch (source, target.value) {
        case (_, .null): break
        case (.key, .object(let members)):
          for (stream, value) in members {
            switch value.value {
            case .array(let items):
              listed.append(stream)
              elements += items
              streams += repeatElement(stream, count: items.count)
            case .null: break
            default:
              answer.rejected.append(UpstreamRejection(stream: stream, id: nil, reason: "not an array of events"))
            }
          }
        case (.event(let field), .array(let items)):
          for item in items {
            guard let name = item.resolve(pointer: field).flatMap(value(of:))?.text, !name.isEmpty else {
              answer.rejected.append(
                UpstreamRejection(
                  stream: nil, id: nil,
                  reason: "event without a stream at recipe.poll.events.stream: \(String(item.rawText.prefix(120)))"))
              continue
            }
            elements.append(item)
            streams.append(name)
          }
        case (.key, _):
          return failed(
            UpstreamError(
              .decoding, "the answer at recipe.poll.events.pointer is not an object keyed by stream",
              cause: snippet(text, context.scope)))
        case (.event, _):
          return failed(
            UpstreamError(
              .decoding, "the answer at recipe.poll.events.pointer is not an array of events",
              cause: snippet(text, context.scope)))
        }
      } else if spec.genericShape {
        if spec.pointer.isEmpty {
          if case .array(let items) = json.value { elements = items } else { elements = [json] }
        } else {
          guard let target = json.resolve(pointer: spec.pointer) else {
            return failed(UpstreamError(.decoding, "events pointer \"\(spec.pointer)\" names nothing in the answer"))
          }
          switch target.value {
          case .array(let items): elements = items
          case .null: elements = []
          default:
            return failed(UpstreamError(.decoding, "events pointer \"\(spec.pointer)\" does not name an array"))
          }
        }
      } else if spec.pointer.isEmpty {
        elements = [json]  // the whole body is one event (an object, or an array such as Consul's state)
      } else if spec.pointer.hasWildcardSegment {
        elements = resolveAll(json, spec.pointer)
      } else {
        guard let target = json.resolve(pointer: spec.pointer) else {
          return failed(
            UpstreamError(.decoding, "recipe.poll.events.pointer \"\(spec.pointer)\" names nothing in the answer"))
        }
        switch target.value {
        case .array(let items): elements = items
        case .null: elements = []
        default: elements = [target]
        }
      }
    }
    let opaque = recipe.cursor.opaque
    // An id template of an opaque recipe reads the cursor this answer moves to (nchan: Last-Modified:Etag).
    // A cursor read from an event is the answer's last event's, skipped ones included (Zulip: the last id seen,
    // heartbeats too); an answer with no event leaves it where it is.
    let answerEvent = context.event
    var context = context
    var token: String?
    if opaque {
      context.event = elements.last
      do throws(UpstreamError) {
        token = try nextToken(recipe.cursor, context)
      } catch {
        return failed(error)
      }
      if let token { context.scope.token = token }
    }
    var messages: [UpstreamMessage] = []
    messages.reserveCapacity(elements.count)
    /// Several streams: each message's stream, in the order of `messages`.
    var messageStreams: [String] = []
    var keys: [String?] = []
    for (index, element) in elements.enumerated() {
      let stream = index < streams.count ? streams[index] : recipe.stream
      // One context for every event, its `event` set in turn: a copy per event retained each of its members.
      context.event = element
      let shown = spec.id.flatMap { (value($0, context)?.text.trimmingSpacesAndTabs).map(String.init) }
      let id = opaque ? 0 : shown.flatMap { UInt64($0) }
      if spec.skip.contains(where: { matches($0, element) }) {
        if let id, !opaque {
          answer.rejected.append(
            UpstreamRejection(
              stream: stream, id: id, reason: "skipped by recipe.poll.events.skip", expected: true))
        }
        continue
      }
      let container: Bool
      switch element.value {
      case .object: container = true
      case .array: container = !spec.genericShape
      default: container = false
      }
      guard container, let id else {
        answer.rejected.append(
          UpstreamRejection(
            stream: stream, id: nil,
            reason: opaque
              ? "event is neither an object nor an array: \(String(element.rawText.prefix(120)))"
              : "event without an unsigned integer id at recipe.poll.events.id: \(String(element.rawText.prefix(120)))")
        )
        continue
      }
      guard !element.poisoned else {
        answer.rejected.append(
          UpstreamRejection(
            stream: stream, id: opaque ? nil : id, reason: "nested deeper than \(RawJSON.maxDepth) levels"))
        continue
      }
      let repaired =
        repairedText?.repaired(offset: element.offset, count: element.text.count) ?? !text.repairs.isEmpty
      messages.append(UpstreamMessage(id: id, raw: element.rawText, repaired: repaired, label: opaque ? shown : nil))
      if spec.stream != nil { messageStreams.append(stream) }
      // Only a recipe that dedupes has keys (one per message); for any other, `keys` stays empty (every key nil).
      if opaque, let dedupe = recipe.cursor.dedupe { keys.append(dedupeKey(element, dedupe.keys)) }
    }
    if opaque {
      answer.batches.append((recipe.stream, messages))  // the API's order: numbered in it later
      if let token { answer.tokens[recipe.stream] = token }
    } else if spec.stream != nil, listed.count == 1 {
      // An object keyed by stream that names one (the usual answer: the stream with news): its batch as it is. Only
      // an answer keyed by stream lists streams, and each of its events came from a listed one.
      answer.batches.append((listed[0], messages.inIDOrder))
    } else if spec.stream != nil {
      // One batch per stream, in the answer's order (a listed stream with no event too). A stream's batch is found
      // by a scan while there are few (an answer names one or two: no hashing, no table), by a map once there are
      // many (a hostile answer with thousands of keys stays linear).
      let scanned = 8
      var order: [String] = []
      var groups: [[UpstreamMessage]] = []
      var slots: [String: Int] = [:]  // filled once `order` outgrows `scanned`
      func slot(_ stream: String) -> Int {
        if let at = order.count <= scanned ? order.firstIndex(of: stream) : slots[stream] { return at }
        order.append(stream)
        groups.append([])
        if order.count == scanned + 1 {
          for (at, name) in order.enumerated() { slots[name] = at }
        } else if order.count > scanned {
          slots[stream] = order.count - 1
        }
        return order.count - 1
      }
      for stream in listed { _ = slot(stream) }
      for (message, stream) in zip(messages, messageStreams) { groups[slot(stream)].append(message) }
      // In id order here, off the loop for a large answer: the worker then only checks the order.
      for (at, stream) in order.enumerated() { answer.batches.append((stream, groups[at].inIDOrder)) }
    } else {
      answer.batches.append((recipe.stream, messages.inIDOrder))
    }
    context.event = answerEvent
    if let source = recipe.cursor.index, let cursor = context.scope.cursor,
      let index = value(source, context).flatMap({ UInt64($0.text.trimmingSpacesAndTabs) }),
      index < cursor
    {
      // Just below the API's index: the state at that index is news under the new numbering.
      answer.resets = [
        UpstreamCursorReset(
          stream: recipe.stream, to: index > 0 ? index - 1 : 0, gap: true, reason: "upstream_index_went_backwards")
      ]
    }
    return PollVerdict(action: .answer(answer), rule: rule, keys: keys)
  }

  /// An event's dedupe key: the values at `pointers`, joined; nil when one is missing.
  static func dedupeKey(_ event: RawJSON, _ pointers: [String]) -> String? {
    let parts = pointers.map { event.resolve(pointer: $0).map { value(of: $0)?.text ?? "null" } }
    return parts.contains { $0 == nil } ? nil : parts.map { $0! }.joined(separator: "\u{1F}")
  }

  /// The dedupe key of an event as stored: its SSE frame's data is the relay's envelope, whose `message` is the
  /// event as the API sent it.
  static func dedupeKey(stored event: StoredEvent, _ pointers: [String]) -> String? {
    guard event.type == nil || event.type == "message" else { return nil }
    let text = String(decoding: event.bytes.bytes, as: UTF8.self)
    var data: [Substring] = []
    for line in text.split(separator: "\n", omittingEmptySubsequences: false) where line.hasPrefix("data:") {
      let value = line.dropFirst(5)
      data.append(value.first == " " ? value.dropFirst() : value)
    }
    guard !data.isEmpty, let envelope = try? RawJSON.parse(data.joined(separator: "\n")),
      let message = envelope["message"]
    else { return nil }
    return dedupeKey(message, pointers)
  }

  /// An opaque cursor's next text from an answer: one source's value, or the parts as a JSON object (a part the
  /// answer lacks keeps its previous value). Nil when the answer carries none.
  /// A value with a control byte (but HTAB) is a hostile answer: refused here, before it is stored or sent back in a
  /// header (where the request builder would refuse it on every poll after).
  static func nextToken(_ cursor: Recipe.Cursor, _ context: Context) throws(UpstreamError) -> String? {
    if cursor.value.count == 1, cursor.value[0].part == nil {
      let text = value(cursor.value[0].source, context)?.text
      if let text { try refuseControlBytes(text, "the API's next cursor") }
      return text
    }
    var parts = context.scope.cursorParts
    var found = false
    for (part, source) in cursor.value {
      guard let part, let text = value(source, context)?.text else { continue }
      try refuseControlBytes(text, "the API's next cursor's part \(part)")
      parts[part] = text
      found = true
    }
    guard found else { return nil }
    return JSONText.object(parts.keys.sorted().map { ($0, JSONText.quoted(parts[$0]!)) })
  }
}
