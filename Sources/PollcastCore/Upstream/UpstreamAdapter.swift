/// One upstream message: its id within its stream and its JSON text exactly as received.
public struct UpstreamMessage: Sendable, Equatable {
  public var id: UInt64
  public var raw: String
  /// Invalid UTF-8 in it was replaced by U+FFFD (`RepairedText`).
  public var repaired: Bool
  /// The API's own id as shown in `upstream_id`, when `id` is the relay's count (an opaque-cursor recipe).
  public var label: String?
  /// What identifies it when the API may deliver it again (an opaque-cursor recipe's `cursor.dedupe`).
  public var dedupeKey: String?

  public init(id: UInt64, raw: String, repaired: Bool = false, label: String? = nil) {
    self.id = id
    self.raw = raw
    self.repaired = repaired
    self.label = label
  }
}

extension Array where Element == UpstreamMessage {
  /// The messages in id order: sorted (stable, so equal ids keep their order) only when they are not in it already,
  /// as APIs send them.
  var inIDOrder: [UpstreamMessage] {
    zip(self, dropFirst()).allSatisfy { $0.id <= $1.id } ? self : sorted { $0.id < $1.id }
  }
}

/// A message that cannot be relayed. With an id (and stream), the cursor still moves past it: one poison
/// message must not stall the stream, and a real upstream would otherwise resend it forever.
public struct UpstreamRejection: Sendable, Equatable {
  public var stream: String?
  public var id: UInt64?
  public var reason: String
  /// Left out on purpose (a recipe's `skip`: heartbeats, meta messages): the cursor moves, nothing is logged.
  public var expected: Bool

  public init(stream: String?, id: UInt64?, reason: String, expected: Bool = false) {
    self.stream = stream
    self.id = id
    self.reason = reason
    self.expected = expected
  }
}

/// What a (re)start found out: the streams the session covers and, when the API has a cursor-sync call, the
/// server's newest id per stream.
public struct UpstreamPreparation: Sendable, Equatable {
  /// Stream names in a stable order (primary account first).
  public var streams: [String]
  /// Server's last id per stream; nil when the API cannot tell (the generic adapter).
  public var lastIDs: [String: UInt64]?
  /// Where a stream starts when the relay has no cursor and the API cannot tell its newest id.
  public var initialCursors: [String: UInt64]

  public init(streams: [String], lastIDs: [String: UInt64]?, initialCursors: [String: UInt64] = [:]) {
    self.streams = streams
    self.lastIDs = lastIDs
    self.initialCursors = initialCursors
  }
}

/// The API said where a stream's cursor stands now (a recipe's `reset`: etcd's cleared index, VK's `failed: 1`).
/// With `gap`, clients are told (the `resync` status event): what the API dropped before that point is lost.
public struct UpstreamCursorReset: Sendable, Equatable {
  public var stream: String
  public var to: UInt64
  public var gap: Bool
  public var reason: String

  public init(stream: String, to: UInt64, gap: Bool, reason: String) {
    self.stream = stream
    self.to = to
    self.gap = gap
    self.reason = reason
  }
}

/// One poll's answer, parsed.
public struct UpstreamPollAnswer: Sendable, Equatable {
  /// Messages per stream, in the order the server sent them.
  public var batches: [(stream: String, messages: [UpstreamMessage])]
  /// Messages that could not be relayed (no usable id, not an object, nested too deep), with why; logged and
  /// counted.
  public var rejected: [UpstreamRejection] = []
  /// Cursors the API moved (applied once the answer's messages are stored).
  public var resets: [UpstreamCursorReset] = []
  /// The API's opaque cursor per stream after this answer: stored in the same commit as the answer's messages.
  public var tokens: [String: String] = [:]
  /// How many recent dedupe keys per stream the cursor book remembers.
  public var dedupeWindow = RecentKeys.capacity
  /// The API asks for this many seconds before the next poll (a recipe's `after` on continue, empty or fetch:
  /// Dropbox's `backoff`).
  public var nextPollAfter: Double?
  /// A fetch chain ended at its byte bound (`upstream.max_body_bytes`) while the API still had pages: they are
  /// fetched after the next poll.
  public var fetchCut = false

  public init(batches: [(stream: String, messages: [UpstreamMessage])], rejected: [UpstreamRejection] = []) {
    self.batches = batches
    self.rejected = rejected
  }

  public static func == (a: UpstreamPollAnswer, b: UpstreamPollAnswer) -> Bool {
    a.rejected == b.rejected && a.resets == b.resets && a.tokens == b.tokens && a.nextPollAfter == b.nextPollAfter
      && a.batches.count == b.batches.count
      && zip(a.batches, b.batches).allSatisfy { $0.stream == $1.stream && $0.messages == $1.messages }
  }

  // A closure, not `\.messages.isEmpty`: a key path of two components passed as a function is built and walked at
  // run time (`swift_getKeyPath`, generic metadata lookups): ~1 % of the relay's CPU in per-user relaying, once a poll.
  public var isEmpty: Bool { batches.allSatisfy { $0.messages.isEmpty } }
}

/// A legacy API's shape: how to start (session, cursor sync) and how to poll. Loop-confined: the worker calls
/// it from the loop only.
public protocol UpstreamAdapter: AnyObject, Sendable {
  var name: String { get }
  /// True once a session is established (always true for APIs without one).
  var hasSession: Bool { get }
  /// Establishes a session if there is none, then reads the server's newest ids.
  func prepare(_ client: some UpstreamTransport, isolation: isolated (any Actor)?) async throws(UpstreamError)
    -> UpstreamPreparation
  /// One long-poll from `cursors` (and, for an API with opaque cursors, `tokens`: its own cursor per stream).
  func poll(
    _ client: some UpstreamTransport, cursors: [String: UInt64], tokens: [String: String],
    isolation: isolated (any Actor)?
  ) async throws(UpstreamError) -> UpstreamPollAnswer
  /// Forgets the session (after a 401), so the next `prepare` starts a new one.
  func invalidateSession()
  /// Before the first `prepare` of a worker restored from a stored position: the opaque cursors it polls on from.
  /// An adapter whose cursors carry their session (`Recipe.Cursor.session`) takes it up again from them.
  func restore(tokens: [String: String])
  /// An opaque-cursor API's dedupe key of a stored event (its message as relayed), and how many are kept: a
  /// restarted relay remembers what it stored, so a redelivery right after the restart is dropped. nil: none.
  var storedKeys: (key: @Sendable (StoredEvent) -> String?, window: Int)? { get }
  /// Whether `prepare` reads the server's newest ids (a resync is worth a call).
  var canSync: Bool { get }
  /// An opaque cursor (`tokens`) as `/metrics` and status events show it: the API's own cursor, without the
  /// session values it is bound to and without secrets, at most `UpstreamCursorDisplay.limit` characters.
  func shownCursor(_ token: String) -> String
  /// Per-user relaying: whose account the adapter's credential opens. An API with a session step creates the
  /// session (kept for the first poll) and returns its user id; one without returns nil, and the account is keyed
  /// by the credential (a refused credential then shows on the first poll). A 401 or 403 means the credential is
  /// refused; any other failure means the upstream could not tell.
  func identify(_ client: some UpstreamTransport, isolation: isolated (any Actor)?) async throws(UpstreamError)
    -> UpstreamIdentity?
}

/// Whose account a credential opens, as the legacy API's session call says: the user and the streams its
/// session reads (its own, then its linked account's).
public struct UpstreamIdentity: Sendable, Equatable {
  public var user: String
  public var streams: [String]
}

extension UpstreamAdapter {
  public func shownCursor(_ token: String) -> String { UpstreamCursorDisplay.shown(token) }
  public func restore(tokens: [String: String]) {}
  public var storedKeys: (key: @Sendable (StoredEvent) -> String?, window: Int)? { nil }

  // No default for `isolation` here: a call without it would bind statically to this and skip the adapter's own.
  public func identify(_ client: some UpstreamTransport, isolation: isolated (any Actor)?)
    async throws(UpstreamError) -> UpstreamIdentity?
  { nil }
}

extension UpstreamResponse {
  /// The body as JSON, or a decoding error that says what was wrong.
  func json(_ what: String) throws(UpstreamError) -> RawJSON {
    try UpstreamResponse.parse(text(), what).json
  }

  static func parse(_ text: RepairedText, _ what: String) throws(UpstreamError) -> (json: RawJSON, text: RepairedText) {
    do {
      return (try RawJSON.parse(text.text), text)
    } catch {
      throw UpstreamError(.decoding, "\(what) answer is not JSON", cause: error.description)
    }
  }

  /// Bodies up to this size are decoded on the loop; larger ones on another thread, so that a huge answer never
  /// holds the loop (1,000,000 tiny messages held it for 7.3 s).
  static let inlineDecodeLimit = 64 << 10

  /// Decodes the body (UTF-8 repair, JSON, then `interpret`) off the loop when it is large.
  ///
  /// Runs on the caller's actor (the loop) for a small body: without `isolation` a nonisolated async function
  /// hops to the global executor and back, two thread switches per poll (perf: a tenth of the relay's CPU with
  /// 2,000 accounts polling).
  func decode<T: Sendable>(
    _ what: String, isolation: isolated (any Actor)? = #isolation,
    _ interpret: @escaping @Sendable (RawJSON, RepairedText) throws(UpstreamError) -> T
  ) async throws(UpstreamError) -> T {
    let body = self.body
    let work: @Sendable () -> Result<T, UpstreamError> = {
      Result { () throws(UpstreamError) -> T in
        let (json, text) = try UpstreamResponse.parse(RepairedText(body), what)
        return try interpret(json, text)
      }
    }
    return try await offLoopIfLarge(work).get()
  }

  /// Runs `work` here (on the loop) for a body up to `inlineDecodeLimit`, on another thread for a larger one: the
  /// one place that rule lives, for the adapters' decoding and the recipes'.
  func offLoopIfLarge<T: Sendable>(
    weight: Int = 1, isolation: isolated (any Actor)? = #isolation, _ work: @escaping @Sendable () -> T
  ) async -> T {
    if isSmall(weight: weight) { return work() }
    return await Task.detached(priority: .userInitiated, operation: work).value
  }

  /// Whether the body is small enough to be read on the loop when reading costs `weight` passes over it (a recipe's
  /// conditions with `*` each walk the answer again).
  func isSmall(weight: Int) -> Bool {
    let (cost, overflow) = body.count.multipliedReportingOverflow(by: max(1, weight))
    return !overflow && cost <= UpstreamResponse.inlineDecodeLimit
  }

  /// Throws for anything but 200: 401 as an expired session (when `sessionOn401`), the rest as status errors.
  ///
  /// The error carries the first 200 bytes of the body, which end up in the log: an error page may echo what the
  /// request carried, so every value of `secrets` (raw and percent-encoded) is cut out of it, and a call that
  /// authenticates with a key (`secrets` nil: its key is not known here) shows no body at all.
  func requireOK(_ what: String, sessionOn401: Bool, scrubbing secrets: [String]?) throws(UpstreamError) {
    if status == 200 { return }
    if status == 401 && sessionOn401 { throw UpstreamError(.sessionExpired, "\(what): token refused (401)") }
    guard let secrets else {
      throw UpstreamError(.status(status), "\(what) answered \(status)", cause: "body not shown (\(body.count) bytes)")
    }
    let snippet = UpstreamResponse.scrub(String(decoding: body.prefix(200), as: UTF8.self), secrets)
    throw UpstreamError(.status(status), "\(what) answered \(status)", cause: snippet.isEmpty ? nil : snippet)
  }

  /// `text` with every secret (as is, and percent-encoded) replaced by `[redacted]`, and the values of
  /// secret-looking query parameters redacted as in a URL.
  static func scrub(_ text: String, _ secrets: [String]) -> String {
    var shown = text
    for form in redactedForms(of: secrets) {
      shown = shown.replacingEvery(form, with: "[redacted]")
    }
    return shown
  }

  /// Every spelling of `secrets` that can stand in a text shown: as is, percent-encoded, JSON-escaped (and with `/`
  /// escaped as `\/`, as some encoders write it), longest first, so that a secret containing another (a key
  /// `4711.S3CRET` and a user id `4711`) is hidden whole before the shorter one is.
  static func redactedForms(of secrets: [String]) -> [String] {
    var forms: Set<String> = []
    for secret in secrets where !secret.isEmpty {
      forms.insert(secret)
      forms.insert(encodeQueryValue(secret))
      let escaped = String(JSONText.quoted(secret).dropFirst().dropLast())
      forms.insert(escaped)
      forms.insert(escaped.replacingEvery("/", with: "\\/"))
    }
    return forms.sorted { $0.utf8.count != $1.utf8.count ? $0.utf8.count > $1.utf8.count : $0 < $1 }
  }
}

extension UpstreamMessage {
  /// `element` as a message, or nil with a rejection added to `answer` (not an object, no unsigned id, nested
  /// too deep). The rejection keeps the id when there is one, so the cursor moves past it.
  static func checked(
    _ element: RawJSON, id idValue: RawJSON?, stream: String, text: RepairedText?, into answer: inout UpstreamPollAnswer
  ) -> UpstreamMessage? {
    let id = idValue?.unsignedID
    guard case .object = element.value, let id else {
      answer.rejected.append(
        UpstreamRejection(
          stream: stream, id: nil,
          reason: "message without an unsigned integer id: \(String(element.rawText.prefix(120)))"))
      return nil
    }
    guard !element.poisoned else {
      answer.rejected.append(
        UpstreamRejection(stream: stream, id: id, reason: "nested deeper than \(RawJSON.maxDepth) levels"))
      return nil
    }
    let repaired = text?.repaired(offset: element.offset, count: element.text.count) ?? false
    return UpstreamMessage(id: id, raw: element.rawText, repaired: repaired)
  }
}

/// How an opaque cursor is shown: control bytes and line separators as `?` (it goes into a Prometheus label and a
/// JSON string, where `JSONText.quoted` would write them as `\u` escapes a Prometheus label cannot hold), and cut
/// to `limit` characters with `…` (a Dropbox cursor runs to hundreds).
public enum UpstreamCursorDisplay {
  public static let limit = 96

  public static func shown(_ cursor: String) -> String {
    var text = String(
      String.UnicodeScalarView(
        cursor.unicodeScalars.map {
          $0.value < 0x20 || $0.value == 0x7F || $0.value == 0x2028 || $0.value == 0x2029 ? "?" : $0
        }))
    if text.count > limit { text = text.prefix(limit - 1) + "…" }
    return text
  }
}
