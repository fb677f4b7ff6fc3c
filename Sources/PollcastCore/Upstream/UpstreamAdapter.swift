/// One upstream message: its id within its stream and its JSON text exactly as received.
public struct UpstreamMessage: Sendable, Equatable {
  public var id: UInt64
  public var raw: String

  public init(id: UInt64, raw: String) {
    self.id = id
    self.raw = raw
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

/// One poll's answer, parsed.
public struct UpstreamPollAnswer: Sendable, Equatable {
  /// Messages per stream, in the order the server sent them.
  public var batches: [(stream: String, messages: [UpstreamMessage])]
  /// Messages that could not be relayed (no usable id, not an object), with why; logged and counted.
  public var rejected: [String] = []

  public init(batches: [(stream: String, messages: [UpstreamMessage])], rejected: [String] = []) {
    self.batches = batches
    self.rejected = rejected
  }

  public static func == (a: UpstreamPollAnswer, b: UpstreamPollAnswer) -> Bool {
    a.rejected == b.rejected && a.batches.count == b.batches.count
      && zip(a.batches, b.batches).allSatisfy { $0.stream == $1.stream && $0.messages == $1.messages }
  }

  public var isEmpty: Bool { batches.allSatisfy(\.messages.isEmpty) }
}

/// A legacy API's shape: how to start (session, cursor sync) and how to poll. Loop-confined: the worker calls
/// it from the loop only.
public protocol UpstreamAdapter: AnyObject, Sendable {
  var name: String { get }
  /// True once a session is established (always true for APIs without one).
  var hasSession: Bool { get }
  /// Establishes a session if there is none, then reads the server's newest ids.
  func prepare(_ client: UpstreamClient, isolation: isolated (any Actor)?) async throws(UpstreamError)
    -> UpstreamPreparation
  /// One long-poll from `cursors`.
  func poll(_ client: UpstreamClient, cursors: [String: UInt64], isolation: isolated (any Actor)?)
    async throws(UpstreamError) -> UpstreamPollAnswer
  /// Forgets the session (after a 401), so the next `prepare` starts a new one.
  func invalidateSession()
}

extension UpstreamResponse {
  /// The body as JSON, or a decoding error that says what was wrong.
  func json(_ what: String) throws(UpstreamError) -> RawJSON {
    let text = try text()
    do {
      return try RawJSON.parse(text)
    } catch {
      throw UpstreamError(.decoding, "\(what) answer is not JSON", cause: error.description)
    }
  }

  /// Throws for anything but 200: 401 as an expired session (when `sessionOn401`), the rest as status errors.
  func requireOK(_ what: String, sessionOn401: Bool) throws(UpstreamError) {
    if status == 200 { return }
    if status == 401 && sessionOn401 { throw UpstreamError(.sessionExpired, "\(what): token refused (401)") }
    let snippet = String(decoding: body.prefix(200), as: UTF8.self)
    throw UpstreamError(.status(status), "\(what) answered \(status)", cause: snippet.isEmpty ? nil : snippet)
  }
}
