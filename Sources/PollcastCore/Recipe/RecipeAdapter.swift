import Foundation

/// Runs a `Recipe` against its legacy API: the session steps at (re)start and after a `session` rule, then one
/// poll at a time. What an answer means is decided by `RecipeAnswer.interpret` (a pure function, off the loop for a
/// large body), so every rule is tested without sockets.
public class RecipeAdapter: UpstreamAdapter, @unchecked Sendable {  // loop-confined
  /// The recipe, held once for every adapter that runs it (`RecipeStorage`).
  let storage: RecipeStorage
  public final var recipe: Recipe { _read { yield storage.recipe } }
  public var name: String { recipe.name }
  let environment: [String: String]
  let credential: String?
  let pollTimeout: Double
  let requestTimeout: Double
  let connectTimeout: Double
  /// The session's extracted values; nil until the session ran (always "ran" for a recipe without one).
  private var sessionValues: [String: RecipeValue]?
  /// A `[session, reset]` rule: where the cursor goes once the new session is up.
  private var pendingReset: (to: UInt64?, token: String?, gap: Bool, reason: String)?
  /// An opaque cursor's first text (`cursor.initial`), until the API gives one.
  private var initialToken: String?
  /// The session was taken up from a stored cursor (`cursor.session`), not started: `prepare` has no initial
  /// cursor to read, and needs none.
  private var sessionRestored = false

  /// The rule that decided the last answer (nil: a default), for `recipe check` and logs.
  public private(set) var lastRule: String?
  /// `recipe check`: no request waits longer than this, whatever the recipe's timeout.
  public var timeoutCap: Double?

  public convenience init(
    recipe: Recipe, environment: [String: String], credential: String?, pollTimeout: Double = 70,
    requestTimeout: Double = 10, connectTimeout: Double = 5
  ) {
    self.init(
      storage: RecipeStorage(recipe), environment: environment, credential: credential, pollTimeout: pollTimeout,
      requestTimeout: requestTimeout, connectTimeout: connectTimeout)
  }

  init(
    storage: RecipeStorage, environment: [String: String], credential: String?, pollTimeout: Double = 70,
    requestTimeout: Double = 10, connectTimeout: Double = 5
  ) {
    self.storage = storage
    self.environment = environment
    self.credential = credential
    self.pollTimeout = pollTimeout
    self.requestTimeout = requestTimeout
    self.connectTimeout = connectTimeout
    if storage.recipe.session.isEmpty { sessionValues = [:] }
  }

  public var canSync: Bool { recipe.sync != nil }

  /// The streams the session covers, in the recipe's order (`recipe.streams` rendered; one with no value or empty
  /// is left out), or the recipe's one stream.
  func sessionStreams() throws(UpstreamError) -> [String] {
    guard recipe.isMultiStream else { return [recipe.stream] }
    let scope = scope()
    var streams: [String] = []
    for template in recipe.streams {
      guard let name = try? template.render(scope, .text), !name.isEmpty, !streams.contains(name) else { continue }
      streams.append(name)
    }
    guard !streams.isEmpty else { throw UpstreamError(.decoding, "recipe.streams: the session names no stream") }
    return streams
  }

  /// The streams `{cursors}` lists first (the last `prepare`'s): the primary account before its linked one.
  var preparedStreams: [String] = []

  /// `{cursors}`: each stream's cursor as `recipe.cursor.list` writes it, the prepared streams first, then any
  /// other the worker holds a cursor for, by name.
  func cursorList(_ cursors: [String: UInt64]) -> String {
    var text = ""
    func add(_ stream: String, _ cursor: UInt64) {
      if !text.isEmpty { text += recipe.cursor.listJoin }
      for part in recipe.cursor.listEach.parts {
        switch part {
        case .literal(let literal): text += literal
        case .placeholder(.cursor): text += String(cursor)
        case .placeholder: text += stream
        }
      }
    }
    var listed = 0
    for stream in preparedStreams {
      guard let cursor = cursors[stream] else { continue }
      add(stream, cursor)
      listed += 1
    }
    if listed < cursors.count {
      for stream in cursors.keys.sorted() where !preparedStreams.contains(stream) { add(stream, cursors[stream]!) }
    }
    return text
  }
  public var hasSession: Bool { sessionValues != nil }
  public func invalidateSession() {
    if !recipe.session.isEmpty { sessionValues = nil }
    baseScope = nil
    sessionRestored = false
  }

  // MARK: Cursors bound to their session

  /// `cursor.session`'s values of the current session.
  private var boundSession: [String: String] {
    var bound: [String: String] = [:]
    for name in recipe.cursor.session { bound[name] = sessionValues?[name]?.text }
    return bound
  }

  /// The stored form of an opaque cursor that belongs to its session: `{"cursor": API text, "session": {…}}`.
  static func bind(_ token: String, session: [String: String]) -> String {
    JSONText.object([
      ("cursor", JSONText.quoted(token)),
      ("session", JSONText.object(session.keys.sorted().map { ($0, JSONText.quoted(session[$0]!)) })),
    ])
  }

  /// The API text and session values of a stored cursor from `bind`; nil for any other text (a cursor stored
  /// before the recipe bound it to its session).
  static func unbind(_ token: String) -> (cursor: String, session: [String: String])? {
    guard token.hasPrefix("{"), let json = try? RawJSON.parse(token), let cursor = json["cursor"]?.stringValue,
      case .object(let members)? = json["session"]?.value
    else { return nil }
    var session: [String: String] = [:]
    for (name, value) in members {
      guard let text = value.stringValue else { return nil }
      session[name] = text
    }
    return (cursor, session)
  }

  /// The scope without a cursor, built once per session (a poll only adds its cursor): a poll cycle allocates
  /// nothing for it.
  private var baseScope: RecipeScope? { didSet { if baseScope == nil { pollPrefix = nil } } }
  /// The poll's URL with every query member that does not depend on the cursor, rendered once per session (a poll
  /// then renders only its cursor's members), and the members it renders each time.
  private var pollPrefix: RecipeRequest.Prefix?

  func scope(cursor: UInt64? = nil) -> RecipeScope {
    var scope: RecipeScope
    if let baseScope, sessionValues != nil {
      scope = baseScope
    } else {
      scope = RecipeScope()
      scope.vars = recipe.vars
      scope.values = sessionValues ?? [:]
      scope.environment = environment
      scope.credential = credential
      scope.secretNames = storage.secretNames
      scope.literalSecrets = recipe.literalSecrets
      scope.environmentNames = recipe.environmentNames
      scope.redactions = scope.secrets
      if sessionValues != nil { baseScope = scope }
    }
    scope.cursor = cursor
    return scope
  }

  public func identify(_ client: some UpstreamTransport, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamIdentity?
  {
    guard let user = recipe.user else { return nil }
    if sessionValues == nil { try await runSession(client) }
    let id = try user.render(scope(), .text)
    guard !id.isEmpty else { throw UpstreamError(.decoding, "recipe.user is empty in the session's answer") }
    return UpstreamIdentity(user: id, streams: try sessionStreams())
  }

  public func restore(tokens: [String: String]) {
    guard !recipe.cursor.session.isEmpty, sessionValues == nil, let token = tokens[recipe.stream],
      let bound = RecipeAdapter.unbind(token), recipe.cursor.session.allSatisfy({ bound.session[$0] != nil })
    else { return }
    sessionValues = bound.session.mapValues { RecipeValue(text: $0) }
    baseScope = nil
    sessionRestored = true
  }

  /// The API's cursor: a bound one without its session's values, a cursor in parts as its JSON object; every
  /// secret the requests carry (the session's values, environment values, the credential) replaced.
  public func shownCursor(_ token: String) -> String {
    let cursor = RecipeAdapter.unbind(token)?.cursor ?? token
    let scope = scope()
    return UpstreamCursorDisplay.shown(UpstreamResponse.scrub(cursor, scope.redactions ?? scope.secrets))
  }

  public var storedKeys: (key: @Sendable (StoredEvent) -> String?, window: Int)? {
    guard recipe.cursor.opaque, let dedupe = recipe.cursor.dedupe else { return nil }
    let pointers = dedupe.keys
    return ({ RecipeAnswer.dedupeKey(stored: $0, pointers) }, dedupe.window)
  }

  public func prepare(_ client: some UpstreamTransport, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamPreparation
  {
    if sessionValues == nil { try await runSession(client) }
    var preparation = try preparation()
    preparation.lastIDs = try await syncIDs(client, preparation.streams)
    return preparation
  }

  /// The session's streams and where they start (synchronous: see `stepRequest`).
  @inline(never)
  private func preparation() throws(UpstreamError) -> UpstreamPreparation {
    var initial: [String: UInt64] = [:]
    if sessionRestored {
      sessionRestored = false
    } else if let source = recipe.cursor.initial {
      let context = RecipeAnswer.Context(scope: scope())
      if recipe.cursor.opaque {
        guard let text = RecipeAnswer.value(source, context)?.text else {
          throw UpstreamError(.decoding, "recipe.cursor.initial: names nothing")
        }
        try RecipeAnswer.refuseControlBytes(text, "recipe.cursor.initial")
        initialToken = text
      } else {
        initial[recipe.stream] = try RecipeAnswer.integer(source, context, "recipe.cursor.initial")
      }
    }
    let streams = try sessionStreams()
    preparedStreams = streams
    return UpstreamPreparation(streams: streams, lastIDs: nil, initialCursors: initial)
  }

  /// The sync step's newest id per stream (nil without one).
  @inline(never)
  private func syncIDs(
    _ client: some UpstreamTransport, _ streams: [String], isolation: isolated (any Actor)? = #isolation
  )
    async throws(UpstreamError) -> [String: UInt64]?
  {
    guard recipe.sync != nil else { return nil }
    let step = try stepRequest(.sync)
    let response = try await client.send(step.request)
    let storage = self.storage
    let scope = step.scope
    let interpret: @Sendable (RepairedText, RawJSON?) -> Result<[String: UInt64], UpstreamError> = { text, json in
      RecipeAnswer.interpretSync(
        status: response.status, headers: response.headers, text: text, json: json, recipe: storage.recipe,
        scope: scope, streams: streams)
    }
    if RecipeAnswer.decodesHere(response, weight: storage.readingWeight) {
      return try RecipeAnswer.decodeHere(response.body, interpret).get()
    }
    return try await RecipeAnswer.decode(response, weight: storage.readingWeight, interpret).get()
  }

  enum StepName {
    case sync
    case session(Int, [String: RecipeValue])
  }

  /// A session or sync step's request and the scope it was built in. Synchronous and not inlined, like `planPoll`:
  /// an async function's frame holds every temporary of its body, and the task keeps its largest frames for as long
  /// as the account's worker runs (a 4 KB session frame stayed in every account's memory).
  @inline(never)
  private func stepRequest(_ name: StepName) throws(UpstreamError) -> (request: UpstreamRequest, scope: RecipeScope) {
    switch name {
    case .sync:
      let sync = recipe.sync!
      let current = scope()
      let request = try RecipeRequest.build(
        sync.step, current, vars: storage.varNames, headerNames: storage.headerNames,
        timeout: min(sync.step.timeout ?? requestTimeout, timeoutCap ?? .infinity), connectTimeout: connectTimeout,
        label: "sync", hosts: storage.allowedHosts)
      return (request, current)
    case .session(let index, let values):
      let step = recipe.session[index]
      var building = scope()
      building.values.merge(values) { _, new in new }
      building.redactions = building.secrets  // the earlier steps' values are secrets too
      let request = try RecipeRequest.build(
        step, building, vars: storage.varNames, headerNames: storage.headerNames,
        timeout: min(step.timeout ?? requestTimeout, timeoutCap ?? .infinity), connectTimeout: connectTimeout,
        label: "session", hosts: storage.allowedHosts)
      return (request, building)
    }
  }

  @inline(never)
  private func runSession(_ client: some UpstreamTransport, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError)
  {
    sessionValues = nil
    var values: [String: RecipeValue] = [:]
    for index in recipe.session.indices {
      let step = try stepRequest(.session(index, values))
      let response = try await client.send(step.request)
      let storage = self.storage
      let scope = step.scope
      let interpret: @Sendable (RepairedText, RawJSON?) -> RecipeAnswer.SessionOutcome = { text, json in
        RecipeAnswer.interpretSession(
          status: response.status, headers: response.headers, text: text, json: json,
          step: storage.recipe.session[index], rules: storage.recipe.rules, scope: scope,
          path: "recipe.session[\(index)]")
      }
      let outcome =
        RecipeAnswer.decodesHere(response, weight: storage.readingWeight)
        ? RecipeAnswer.decodeHere(response.body, interpret)
        : await RecipeAnswer.decode(response, weight: storage.readingWeight, interpret)
      lastRule = outcome.rule
      values.merge(try outcome.values.get()) { _, new in new }
    }
    try established(values)
  }

  /// The session's values are in: the scope is built anew, and a pending reset to `cursor.initial` reads it.
  @inline(never)
  private func established(_ values: [String: RecipeValue]) throws(UpstreamError) {
    sessionValues = values
    baseScope = nil
    if let pending = pendingReset, pending.to == nil || (recipe.cursor.opaque && pending.token == nil),
      let source = recipe.cursor.initial
    {
      let context = RecipeAnswer.Context(scope: scope())
      if recipe.cursor.opaque {
        guard let text = RecipeAnswer.value(source, context)?.text else {
          throw UpstreamError(.decoding, "recipe.cursor.initial: names nothing")
        }
        pendingReset = (pending.to, text, pending.gap, pending.reason)
      } else {
        pendingReset = (
          try RecipeAnswer.integer(source, context, "recipe.cursor.initial"), nil, pending.gap, pending.reason
        )
      }
    }
  }

  /// What a poll decided before it went out, kept until its answer is read, with the request it sends and the
  /// outcome `UpstreamTransport.send(held:)` writes back. A reference to this is what the poll's async frame holds
  /// while the poll hangs (per-user relaying holds thousands): no request, response or error is copied into it, and the
  /// answer is read in its own function.
  final class PollPlan: HeldRequest, @unchecked Sendable {  // loop-confined
    let scope: RecipeScope
    let reset: UpstreamCursorReset?
    let resetToken: String?
    let cursor: UInt64

    init(
      request: UpstreamRequest, scope: RecipeScope, reset: UpstreamCursorReset?, resetToken: String?, cursor: UInt64
    ) {
      (self.scope, self.reset, self.resetToken, self.cursor) = (scope, reset, resetToken, cursor)
      super.init(request)
    }
  }

  @inline(never)
  public final func poll(
    _ client: some UpstreamTransport, cursors: [String: UInt64], tokens: [String: String] = [:],
    isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    let plan = try planPoll(cursors: cursors, tokens: tokens)
    // The plan, not its request, is handed over, and the response comes back in it: a struct argument to an async
    // call is copied into this frame (twice, measured), and a result or typed error takes slots in it; every
    // account keeps this frame while its poll hangs.
    await client.send(held: plan, isolation: isolation)
    return try await read(plan, client, isolation: isolation)
  }

  @inline(never)
  private func planPoll(cursors: [String: UInt64], tokens: [String: String]) throws(UpstreamError) -> PollPlan {
    if sessionValues == nil { throw UpstreamError(.sessionExpired, "no session") }
    var reset: UpstreamCursorReset?
    var resetToken: String?
    if let pending = pendingReset, let to = pending.to ?? (recipe.cursor.opaque ? cursors[recipe.stream] ?? 0 : nil) {
      reset = UpstreamCursorReset(stream: recipe.stream, to: to, gap: pending.gap, reason: pending.reason)
      resetToken = pending.token
    }
    var stored = tokens[recipe.stream]
    if !recipe.cursor.session.isEmpty, let token = stored, let bound = RecipeAdapter.unbind(token) {
      if bound.session == boundSession {
        stored = bound.cursor
      } else if reset == nil {
        // A new session the rules did not reset the cursor for (a 401, say): the stored cursor counts in the old
        // one, so the new one starts from its own first cursor, and clients are told what may be lost between.
        stored = nil
        reset = UpstreamCursorReset(
          stream: recipe.stream, to: cursors[recipe.stream] ?? 0, gap: true, reason: "recipe_session_changed")
        resetToken = initialToken
      }
    }
    let cursor = reset?.to ?? cursors[recipe.stream] ?? 0
    var current = scope(cursor: recipe.isMultiStream ? nil : cursor)
    if recipe.isMultiStream { current.cursorList = cursorList(cursors) }
    if recipe.cursor.opaque {
      current.opaque = true
      current.token = resetToken ?? stored ?? initialToken
    }
    if pollPrefix == nil { pollPrefix = RecipeRequest.prefix(recipe.poll, scope(), recipe: recipe) }
    let storage = self.storage
    let request = try RecipeRequest.build(
      storage.recipe.poll, current, vars: storage.varNames, headerNames: storage.headerNames,
      timeout: min(storage.recipe.poll.timeout ?? pollTimeout, timeoutCap ?? .infinity),
      connectTimeout: connectTimeout, label: "poll", prefix: pollPrefix, hosts: storage.allowedHosts)
    return PollPlan(request: request, scope: current, reset: reset, resetToken: resetToken, cursor: cursor)
  }

  /// A poll's answer, read as the plan it went out with says. Most answers are read in one synchronous step; an
  /// answer decoded off the loop (a large body) or one that says to fetch takes an awaited path, in frames made
  /// only then (every account's cycle task keeps the deepest chain of async frames it ever needed).
  @inline(never)
  private func read(
    _ plan: PollPlan, _ client: some UpstreamTransport, isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    switch try readHere(plan) {
    case .answer(let answer):
      return answer
    case .fetch(let after):
      return try await fetchThenFinish(client, plan, after: after)
    case .decodeApart:
      return try await readApart(plan, client)
    }
  }

  /// What `readHere` made of an answer.
  private enum ReadHere {
    case answer(UpstreamPollAnswer)
    /// The answer says to fetch (with the poll delay it asked for, if any).
    case fetch(after: Double?)
    /// The body is decoded off the loop.
    case decodeApart
  }

  @inline(never)
  private func readHere(_ plan: PollPlan) throws(UpstreamError) -> ReadHere {
    let response = try plan.response()
    guard RecipeAnswer.decodesHere(response, weight: storage.readingWeight) else { return .decodeApart }
    let verdict = RecipeAnswer.decodeHere(response.body, interpreter(response, plan))
    lastRule = verdict.rule
    guard case .fetch = verdict.action else { return .answer(try finish(verdict.action, keys: verdict.keys, plan)) }
    return .fetch(after: verdict.after)
  }

  /// The poll verdict's interpretation of `response`, for the scope `plan` sent.
  private func interpreter(_ response: UpstreamResponse, _ plan: PollPlan)
    -> @Sendable (RepairedText, RawJSON?) -> RecipeAnswer.PollVerdict
  {
    let storage = self.storage
    let sent = plan.scope
    return { text, json in
      RecipeAnswer.interpretPoll(
        status: response.status, headers: response.headers, text: text, json: json, recipe: storage.recipe,
        scope: sent)
    }
  }

  /// `read` for a body decoded off the loop.
  @inline(never)
  private func readApart(
    _ plan: PollPlan, _ client: some UpstreamTransport, isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    let response = try plan.response()
    let verdict = await RecipeAnswer.decode(response, weight: storage.readingWeight, interpreter(response, plan))
    lastRule = verdict.rule
    guard case .fetch = verdict.action else { return try finish(verdict.action, keys: verdict.keys, plan) }
    return try await fetchThenFinish(client, plan, after: verdict.after)
  }

  /// The fetch a poll's answer asked for, then what it means.
  @inline(never)
  private func fetchThenFinish(
    _ client: some UpstreamTransport, _ plan: PollPlan, after: Double?, isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    var (action, keys) = try await fetchAll(client, from: plan.scope)
    if case .answer(var answer) = action, let after {
      answer.nextPollAfter = after
      action = .answer(answer)
    }
    return try finish(action, keys: keys, plan)
  }

  /// What the answer means for the cursors and the session (synchronous: see `stepRequest`).
  @inline(never)
  private func finish(_ action: RecipeAnswer.PollAction, keys: [String?], _ plan: PollPlan) throws(UpstreamError)
    -> UpstreamPollAnswer
  {
    let (reset, resetToken, cursor) = (plan.reset, plan.resetToken, plan.cursor)
    switch action {
    case .answer(var answer):
      if let reset {
        pendingReset = nil
        answer.resets.insert(reset, at: 0)
        // The reset's cursor is what this poll sent: stored with the answer unless the answer moved it on.
        if let resetToken, answer.tokens[recipe.stream] == nil { answer.tokens[recipe.stream] = resetToken }
      }
      if recipe.cursor.opaque { number(&answer, keys: keys, after: cursor) }
      if !recipe.cursor.session.isEmpty, let token = answer.tokens[recipe.stream] {
        answer.tokens[recipe.stream] = RecipeAdapter.bind(token, session: boundSession)
      }
      return answer
    case .session(let reset):
      if let reset { pendingReset = (reset.to, reset.token, reset.gap, reset.reason) }
      invalidateSession()
      throw UpstreamError(.sessionExpired, "\(lastRule ?? "status 401"): new session")
    case .error(let error):
      throw error
    case .fetch:
      throw UpstreamError(.decoding, "\(lastRule ?? "a rule"): fetch answered fetch")
    }
  }

  /// Fetches after a poll that said there is news: the fetch step from the poll's cursor, again from each answer's
  /// cursor while `fetch.repeat_while` holds (at most `maxFetchPages` times; the next poll goes on from there). The
  /// pages' events make one answer, stored in one commit with the last page's cursor: a crash between pages fetches
  /// them again, and the dedupe key drops what was relayed. The chain also ends once its pages' bodies add up to
  /// `upstream.max_body_bytes`: an API that always says `has_more` cannot make one commit hold unbounded memory. The
  /// pages so far are committed with their last cursor, and the next poll goes on from there: nothing is lost.
  @inline(never)
  private func fetchAll(
    _ client: some UpstreamTransport, from start: RecipeScope, isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> (RecipeAnswer.PollAction, [String?]) {
    guard let fetch = recipe.fetch else { throw UpstreamError(.decoding, "recipe.fetch: no fetch step") }
    var current = start
    var combined = UpstreamPollAnswer(batches: [(recipe.stream, [])])
    var keys: [String?] = []
    var received = 0
    for _ in 0..<RecipeAdapter.maxFetchPages {
      let request = try RecipeRequest.build(
        fetch, current, vars: storage.varNames, headerNames: storage.headerNames,
        timeout: min(fetch.timeout ?? requestTimeout, timeoutCap ?? .infinity), connectTimeout: connectTimeout,
        label: "fetch", hosts: storage.allowedHosts)
      let response = try await client.send(request)
      received += response.body.count
      let storage = self.storage
      let sent = current
      let verdict = await RecipeAnswer.decode(response, weight: storage.readingWeight) { text, json in
        RecipeAnswer.interpretPoll(
          status: response.status, headers: response.headers, text: text, json: json, recipe: storage.recipe,
          scope: sent, step: "fetch")
      }
      lastRule = verdict.rule ?? lastRule
      guard case .answer(let page) = verdict.action else { return (verdict.action, keys) }
      for batch in page.batches { combined.batches[0].messages += batch.messages }
      combined.rejected += page.rejected
      combined.resets += page.resets
      keys += verdict.keys
      if let token = page.tokens[recipe.stream] {
        combined.tokens[recipe.stream] = token
        current.token = token
      }
      guard verdict.more else { break }
      if received >= client.maxBodyBytes {
        combined.fetchCut = true
        break
      }
    }
    return (.answer(combined), keys)
  }

  /// Fetch pages after one poll, at most (a `repeat_while` that always holds must not hold the loop's account).
  static let maxFetchPages = 100
}

extension RecipeAdapter {
  /// Numbers an opaque recipe's events after `cursor` (the count of events relayed) and gives each its dedupe
  /// key; the cursor book drops those it stored lately (an API that redelivers: CouchDB after a rewound `since`).
  fileprivate func number(_ answer: inout UpstreamPollAnswer, keys: [String?], after cursor: UInt64) {
    guard let index = answer.batches.firstIndex(where: { $0.stream == recipe.stream }) else { return }
    var next = cursor
    for position in answer.batches[index].messages.indices {
      next = next == .max ? next : next + 1
      answer.batches[index].messages[position].id = next
      if position < keys.count { answer.batches[index].messages[position].dedupeKey = keys[position] }
    }
    answer.dedupeWindow = recipe.cursor.dedupe?.window ?? RecentKeys.capacity
  }
}

/// A recipe held once for every adapter that runs it (per-user relaying makes thousands): an adapter holds this
/// reference, a closure that reads the answer off the loop captures it, and no poll copies the recipe.
public final class RecipeStorage: Sendable {
  public let recipe: Recipe
  /// `recipe.headerNames`, computed once: every request of the recipe asks for these.
  let headerNames: [String]
  /// `recipe.varNames`, held here so that building a request reads it without copying the recipe.
  let varNames: Set<String>
  /// The names whose values are secrets (vars read from the environment, the session's values), computed once:
  /// every account's scope shares this set.
  let secretNames: Set<String>

  /// How many passes over an answer reading it may take: one, plus one for every rule condition with a `*` (each
  /// walks every element). `RecipeAnswer.decodesHere` reads an answer on the loop only while its size times this
  /// stays small, so no recipe makes the loop walk a large answer a thousand times.
  let readingWeight: Int
  /// Where requests whose URL an answer chose may go.
  let allowedHosts: AllowedHosts

  public init(_ recipe: Recipe) {
    self.recipe = recipe
    headerNames = recipe.headerNames
    varNames = recipe.varNames
    secretNames = recipe.environmentVars.union(recipe.secretSessionNames)
    allowedHosts = recipe.allowedHosts
    readingWeight = 1 + recipe.rules.reduce(0) { $0 + $1.when.filter { $0.pointer.hasWildcardSegment }.count }
  }
}

/// A step's request, built from its templates: the URL with its query, the headers, and a JSON or form body.
enum RecipeRequest {
  static func build(
    _ step: Recipe.Step, _ scope: RecipeScope, recipe: Recipe, timeout: Double, connectTimeout: Double, label: String,
    headerNames: [String]? = nil, prefix: Prefix? = nil
  ) throws(UpstreamError) -> UpstreamRequest {
    try build(
      step, scope, vars: recipe.varNames, headerNames: headerNames ?? recipe.headerNames, timeout: timeout,
      connectTimeout: connectTimeout, label: label, prefix: prefix)
  }

  /// `build` with what it reads of the recipe passed alone: an adapter's every poll takes this, and passing the
  /// whole `Recipe` by value copied it (a retain of each of its members) once a poll.
  static func build(
    _ step: Recipe.Step, _ scope: RecipeScope, vars: Set<String>, headerNames: [String],
    timeout: Double, connectTimeout: Double, label: String, prefix: Prefix? = nil, hosts: AllowedHosts? = nil
  ) throws(UpstreamError) -> UpstreamRequest {
    var url: String
    if let prefix { url = prefix.url } else { url = try step.url.render(scope, .url, vars: vars) }
    if let hosts, Recipe.hostMoves(step, vars: vars), let problem = hosts.problem(for: url) {
      throw UpstreamError(.unsafeRequest, "\(label) request refused: \(problem)")
    }
    var query: [String] = []
    for (name, template) in prefix?.dynamic ?? step.query {
      if let member = try encodedMember(name, template, scope) { query.append(member) }
    }
    appendQuery(query, to: &url)
    var headers: [(String, String)] = []
    for (name, template) in step.headers {
      // A header that is one placeholder with no value, or an empty one, is left out.
      if let single = template.single, scope.value(of: single)?.text.isEmpty ?? true { continue }
      headers.append((name, try template.render(scope, .header)))
    }
    var body: [UInt8]?
    switch step.body {
    case .json(let value):
      headers.append(("Content-Type", "application/json"))
      body = Array(try RecipeRequest.json(value, scope).utf8)
    case .form(let fields):
      headers.append(("Content-Type", "application/x-www-form-urlencoded"))
      var pairs: [String] = []
      for (name, template) in fields {
        if let member = try encodedMember(name, template, scope) { pairs.append(member) }
      }
      body = Array(pairs.joined(separator: "&").utf8)
    case nil: break
    }
    var request = UpstreamRequest(
      method: step.method, url: url, headers: headers, body: body, timeout: timeout, connectTimeout: connectTimeout,
      label: label)
    request.wantedHeaders = headerNames
    request.redact = scope.redactions ?? scope.secrets
    return request
  }

  /// A query or form member, `name=value` percent-encoded; nil when it is one placeholder with no value (left out, as
  /// documented).
  static func encodedMember(_ name: String, _ template: RecipeTemplate, _ scope: RecipeScope) throws(UpstreamError)
    -> String?
  {
    if let single = template.single, scope.value(of: single) == nil { return nil }
    return "\(encodeQueryValue(name))=\(try template.render(scope, .encoded))"
  }

  /// Appends query members to a URL, after `?` or, when it has a query already, `&`. The result is made once, at its
  /// final length: an account keeps its poll's URL (and the session's fixed prefix) while the poll hangs, and `+=`
  /// of a joined string allocated three times and grew the URL's storage by doubling (160 bytes for 70).
  static func appendQuery(_ members: [String], to url: inout String) {
    guard !members.isEmpty else { return }
    var length = url.utf8.count
    for member in members { length += 1 + member.utf8.count }
    var joined = String()
    joined.reserveCapacity(length)
    joined += url
    var separator = url.containsASCII(UInt8(ascii: "?")) ? "&" : "?"
    for member in members {
      joined += separator
      joined += member
      separator = "&"
    }
    url = joined
  }

  /// A step's URL with its query members that do not depend on the cursor, rendered in `scope` (a session's), and
  /// the members that do. Nil when the URL itself holds the cursor, or a fixed member cannot be rendered (the poll
  /// then renders everything, and names the problem).
  struct Prefix {
    var url: String
    var dynamic: [(String, RecipeTemplate)]
  }

  static func prefix(_ step: Recipe.Step, _ scope: RecipeScope, recipe: Recipe) -> Prefix? {
    func changesEveryPoll(_ template: RecipeTemplate) -> Bool {
      template.placeholders.contains { placeholder in
        switch placeholder {
        case .cursor, .next, .cursors, .now, .nonce: true
        case .name(let name): name.hasPrefix("cursor.")
        default: false
        }
      }
    }
    guard !changesEveryPoll(step.url), var url = try? step.url.render(scope, .url, vars: recipe.varNames) else {
      return nil
    }
    var fixed: [String] = []
    var dynamic: [(String, RecipeTemplate)] = []
    for (name, template) in step.query {
      if changesEveryPoll(template) {
        dynamic.append((name, template))
        continue
      }
      do {
        if let member = try encodedMember(name, template, scope) { fixed.append(member) }
      } catch {
        return nil
      }
    }
    appendQuery(fixed, to: &url)
    return Prefix(url: url, dynamic: dynamic)
  }

  /// A JSON body: strings are templates; one that is exactly a placeholder takes its value's JSON form.
  static func json(_ value: JSONValue, _ scope: RecipeScope) throws(UpstreamError) -> String {
    switch value {
    case .null: return "null"
    case .bool(let flag): return flag ? "true" : "false"
    case .number(let number): return JSONValue.numberText(number)
    case .string(let text):
      let template = RecipeTemplate(text)
      if let single = template.single {
        guard let placed = scope.value(of: single) else {
          throw UpstreamError(.decoding, "\(single.spelled) has no value")
        }
        return placed.json
      }
      return JSONText.quoted(try template.render(scope, .text))
    case .array(let items):
      var parts: [String] = []
      for item in items { parts.append(try json(item, scope)) }
      return "[" + parts.joined(separator: ",") + "]"
    case .object(let members):
      var parts: [String] = []
      for key in members.keys.sorted() { parts.append(JSONText.quoted(key) + ":" + (try json(members[key]!, scope))) }
      return "{" + parts.joined(separator: ",") + "}"
    }
  }
}

extension JSONValue {
  /// A number as JSON text: integers without a fraction.
  static func numberText(_ number: Double) -> String {
    if number.rounded() == number && abs(number) < 9e15 { return String(Int64(number)) }
    return number.isFinite ? String(number) : "null"
  }

  /// The value as compact JSON text (keys sorted).
  public var text: String {
    switch self {
    case .null: "null"
    case .bool(let flag): flag ? "true" : "false"
    case .number(let number): JSONValue.numberText(number)
    case .string(let text): JSONText.quoted(text)
    case .array(let items): "[" + items.map(\.text).joined(separator: ",") + "]"
    case .object(let members):
      "{" + members.keys.sorted().map { JSONText.quoted($0) + ":" + members[$0]!.text }.joined(separator: ",") + "}"
    }
  }
}
