import Foundation

extension UpstreamWorker {
  public struct Settings: Sendable {
    public var startFrom: StartFrom = .latest
    public var backoff = Backoff()
    /// Stop polling after this long with no subscriber (nil: never).
    public var idleAfter: Double?
    /// `/readyz` wants a poll completed within this many seconds.
    public var readyWindow: Double = 60
    /// Re-read the upstream's newest ids (chat: `/api/messages/last`) before the next poll once this many seconds
    /// passed since the last sync: a database restored with lower ids is noticed even while polls only time out.
    public var resyncInterval: Double = 60
    /// Events published per loop turn: a huge answer is relayed in slices so no turn holds the loop for long.
    public var publishSlice = 1000
    /// Per-user relaying: a refused credential (401 or 403 where a session is created, or on a poll that has no
    /// session step) means the subscriber's key was revoked. The worker stops and calls `onKeyRefused` instead of
    /// backing off and retrying a key that will not work again.
    public var stopWhenKeyRefused = false
    /// Polls that bring nothing new and return sooner than this are spaced (`PollSpacing`); 0 never spaces.
    public var minPollInterval: Double = 1
    public init() {}
  }

  public enum State: String, Sendable, CaseIterable {
    case stopped, connecting, backoff, backlog, live, idle
  }

  // MARK: Status events

  /// Tells clients that the relay followed the upstream to other ids, where events may have been lost: live ones at
  /// once in the `upstream` status event (`resync`), and every client in the `gap` event returned, which is stored
  /// with the feed's events and given an id, so a client resuming from before it meets it at its place in the
  /// replay. An opaque-cursor API's reset names the API's own cursor the relay polls on from (`api_cursor`).
  func resynced(_ rewind: CursorBook.Rewind, apiCursor: String? = nil) -> FeedEvent {
    var fields: [(String, String)] = [
      ("stream", JSONText.quoted(rewind.stream)), ("reason", JSONText.quoted(rewind.reason)),
      ("cursor", JSONText.quoted(String(rewind.from))), ("upstream_id", JSONText.quoted(String(rewind.to))),
    ]
    if let apiCursor { fields.append(("api_cursor", JSONText.quoted(adapter.shownCursor(apiCursor)))) }
    let status = JSONText.object(
      [("state", JSONText.quoted("resync")), ("adapter", JSONText.quoted(adapter.name))] + fields)
    feed.assumeIsolated { $0.publishStatus(status) }
    return FeedEvent(type: "gap", stream: rewind.stream, data: JSONText.object(fields))
  }

  func updateLiveness() {
    let backlogUntil = book.settleBacklog()
    if backlogUntil.isEmpty {
      setState(.live)
    } else {
      let pending = backlogUntil.keys.sorted().map { "\(JSONText.quoted($0)):\(backlogUntil[$0]!)" }
      setState(.backlog, extra: ["until": "{\(pending.joined(separator: ","))}"])
    }
  }

  func streamNotice(_ stream: String, _ change: String) -> String {
    JSONText.object(["stream": JSONText.quoted(stream), "change": JSONText.quoted(change)])
  }

  /// Publishes the current state's status event again, with `extra` fields.
  func republishState(extra: [(String, String)] = []) {
    var fields = [("state", JSONText.quoted(state.rawValue)), ("adapter", JSONText.quoted(adapter.name))]
    fields += extra
    feed.assumeIsolated {
      $0.publishStatus("{" + fields.map { "\(JSONText.quoted($0.0)):\($0.1)" }.joined(separator: ",") + "}")
    }
  }

  func setState(_ next: State, extra: KeyValuePairs<String, String> = [:]) {
    let changed = next != state
    state = next
    statistics.state = next.rawValue
    guard changed || next == .backoff || next == .backlog else { return }
    republishState(extra: extra.map { ($0.key, $0.value.first == "{" ? $0.value : JSONText.quoted($0.value)) })
    if changed { logger.info("upstream state", metadata: ["state": next.rawValue]) }
  }

  // MARK: Introspection

  public func snapshot() -> UpstreamStatistics {
    var copy = statistics
    copy.cursors = cursors
    copy.apiCursors = book.tokens.mapValues { adapter.shownCursor($0) }
    copy.hasSession = adapter.hasSession
    copy.transportInFlight = client.inFlight
    copy.requestsKeptAlive = client.transport.requestsKeptAlive
    copy.requestsThroughLibcurl = client.transport.requestsThroughLibcurl
    return copy
  }

  /// `/readyz`: ready when a session is established and the upstream answered recently: a poll completed, or
  /// the poll now hanging started, within the window (a long-poll that is simply waiting is healthy).
  public func readiness() -> (ready: Bool, reason: String) {
    if state == .idle { return (true, "idle: no subscribers") }
    if let storeFailing { return (false, "store failing: \(storeFailing)") }
    guard adapter.hasSession else { return (false, "no upstream session") }
    guard state != .backoff else { return (false, "upstream failing: backing off (attempt \(backoff.attempt))") }
    let inFlightSince = statistics.pollsInFlight > 0 ? statistics.pollStarted : nil
    guard let last = [statistics.lastPollCompleted, inFlightSince].compactMap({ $0 }).max() else {
      return (false, "no poll yet")
    }
    let age = MonotonicClock.seconds() - last
    guard age <= settings.readyWindow else {
      return (false, "no upstream answer for \(Int(age)) s (window \(Int(settings.readyWindow)) s)")
    }
    return (true, "ok")
  }
}

extension UpstreamWorker {
  /// Logs the cursors an API reset (a recipe's `reset`), and tells clients of those that left a gap.
  func announce(_ resets: [UpstreamCursorReset], tokens: [String: String]) {
    for reset in resets {
      let from = book.cursors[reset.stream] ?? 0
      logger.warning(
        reset.gap ? "upstream reset the cursor and dropped events: clients are told" : "upstream reset the cursor",
        metadata: [
          "stream": reset.stream, "cursor": String(from), "to": String(reset.to), "reason": reset.reason,
        ])
      if reset.gap {
        statistics.cursorRewinds += 1
        unstoredGaps.append(
          resynced(
            CursorBook.Rewind(stream: reset.stream, from: from, to: reset.to, reason: reset.reason),
            apiCursor: tokens[reset.stream]))
      }
    }
  }

  /// The `message` event for one upstream message: its stream, id, backlog mark and the message verbatim.
  func envelope(_ message: UpstreamMessage, stream: String) -> FeedEvent {
    if message.repaired {
      statistics.repairedMessages += 1
      logger.limited(
        .warning, "upstream message had invalid UTF-8: relayed with U+FFFD",
        metadata: ["stream": stream, "upstream_id": String(message.id)], limiter: &logLimiter)
    }
    let backlog = book.isBacklog(message.id, stream: stream)
    if backlog { statistics.backlogMessages += 1 }
    return FeedEvent(
      stream: stream, data: Self.envelopeData(message, stream: stream, backlog: backlog), upstreamID: message.id)
  }

  /// A relayed message's SSE data: the relay's envelope around the message as the API sent it.
  static func envelopeData(_ message: UpstreamMessage, stream: String, backlog: Bool) -> String {
    JSONText.object([
      "stream": JSONText.quoted(stream), "upstream_id": JSONText.quoted(message.label ?? String(message.id)),
      "backlog": backlog ? "true" : "false", "message": message.raw,
    ])
  }
}
