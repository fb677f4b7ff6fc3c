/// The upstream worker's cursor rules as a plain value: which streams are polled and from where, what a
/// preparation changes, which messages of an answer are new, resent or skipped, what moves which cursor, and what
/// is backlog. The worker keeps only the I/O around it (polls, commits, logs, status), so every rule here is tested
/// without sockets.
///
/// The seed's invariant: a cursor moves only once the events it covers are stored (`stored(_:)` after the commit
/// of `cursors(after:)`), so a crash never skips a message.
struct CursorBook: Sendable {
  private(set) var streams: [String] = []
  private(set) var cursors: [String: UInt64] = [:]
  /// The API's opaque cursor per stream (opaque-cursor recipes), stored with the position.
  private(set) var tokens: [String: String] = [:]
  /// Per stream, the upstream's newest id when its backlog began: messages up to it are `backlog: true`.
  private(set) var backlogUntil: [String: UInt64] = [:]
  /// Upstream ids relayed lately, per stream: an id at or below the cursor that is among them is a resend (a
  /// duplicate); one that is not means the upstream's ids went backwards.
  private(set) var recent: [String: RecentIDs] = [:]
  /// Dedupe keys stored lately, per stream (opaque-cursor recipes; in memory, rebuilt from the stored events'
  /// messages after a restart).
  private(set) var recentKeys: [String: RecentKeys] = [:]
  /// Whether a session was prepared before (a stream seen later is attached, and starts from the server's newest).
  private(set) var hadSession = false
  /// Polling on from a stored position: what the upstream got meanwhile is news, not backlog.
  private var restored = false

  init() {}

  /// Polls on from `position` (a worker restarted, or a store read at start).
  init(restoring position: UpstreamWorker.Position) {
    streams = position.streams
    cursors = position.cursors
    tokens = position.tokens
    recent = position.recent
    recentKeys = position.recentKeys
    hadSession = true
    restored = true
  }

  /// Whether an answer moved the cursor of every polled stream: each of them brought an id above where it stood
  /// (`before`), so the upstream is past each cursor and a sync of its newest ids would find nothing below them.
  func movedEveryStream(since before: [String: UInt64]) -> Bool {
    !streams.isEmpty
      && streams.allSatisfy { stream in
        guard let now = cursors[stream] else { return false }
        return before[stream] != now
      }
  }

  var position: UpstreamWorker.Position? {
    guard !streams.isEmpty else { return nil }
    var position = UpstreamWorker.Position(streams: streams, cursors: cursors, tokens: tokens, recent: recent)
    position.recentKeys = recentKeys
    return position
  }

  /// The upstream's ids moved below the relay's cursor: the relay follows the server, and tells clients.
  struct Rewind: Equatable, Sendable {
    var stream: String
    var from: UInt64
    var to: UInt64
    var reason: String
  }

  // MARK: Preparations

  /// What a (re)start changed.
  struct Changes: Equatable, Sendable {
    /// Streams no longer polled: the feed forgets them and says `stream-detached`.
    var detached: [String] = []
    /// Streams polled from now on (after the first session): `stream-attached`.
    var attached: [String] = []
    var rewinds: [Rewind] = []
  }

  /// Applies a (re)start's findings: attached and detached streams, first cursors, backlog bounds, and the
  /// server's ids going below a cursor.
  mutating func apply(_ preparation: UpstreamPreparation, startFrom: UpstreamWorker.StartFrom) -> Changes {
    var changes = Changes()
    let next = preparation.streams
    for stream in streams where !next.contains(stream) {
      cursors[stream] = nil
      tokens[stream] = nil
      backlogUntil[stream] = nil
      changes.detached.append(stream)
    }
    if hadSession { changes.attached = next.filter { !streams.contains($0) } }
    for stream in next {
      let serverLast = preparation.lastIDs?[stream]
      guard let cursor = cursors[stream] else {
        // A stream seen for the first time: the first start follows start_from; a stream attached later
        // starts from the server's newest id (only new messages).
        if serverLast == nil {
          cursors[stream] = preparation.initialCursors[stream] ?? 0
        } else if !hadSession && startFrom == .earliest {
          cursors[stream] = 0
          if let serverLast, serverLast > 0 { backlogUntil[stream] = serverLast }
        } else {
          cursors[stream] = serverLast ?? 0
        }
        continue
      }
      guard let serverLast else { continue }
      if serverLast > cursor && !restored {
        backlogUntil[stream] = max(backlogUntil[stream] ?? 0, serverLast)
      } else if serverLast < cursor {
        // The server's ids went backwards (its data was reset): follow it rather than wait forever.
        changes.rewinds.append(
          Rewind(stream: stream, from: cursor, to: serverLast, reason: "upstream_latest_below_cursor"))
        cursors[stream] = serverLast
        backlogUntil[stream] = nil
        recent[stream] = nil
      }
    }
    streams = next
    hadSession = true
    restored = false
    return changes
  }

  // MARK: Answers

  /// What to do with one poll's answer, decided before anything is published.
  struct Plan: Sendable {
    /// The messages to relay, in order.
    var fresh: [(stream: String, message: UpstreamMessage)] = []
    /// Per stream, the highest id of a message that cannot be relayed: the cursor moves past it, so the upstream
    /// does not send it forever.
    var skipped: [String: UInt64] = [:]
    /// Streams whose ids went backwards: the cursor follows the server to the answer's highest id.
    var rewinds: [Rewind] = []
    /// Stream names the answer held that are not polled (ignored).
    var unknownStreams: [String] = []
    /// Messages dropped as resends.
    var duplicates = 0
    /// Cursors the API moved (recipe `reset`), for known streams.
    var resets: [UpstreamCursorReset] = []
    /// The API's opaque cursors after the answer, for known streams: committed with its last messages.
    var tokens: [String: String] = [:]
    var dedupeWindow = RecentKeys.capacity

    var wentBackwards: Bool { !rewinds.isEmpty }
  }

  func plan(_ answer: UpstreamPollAnswer) -> Plan {
    var plan = Plan()
    for rejection in answer.rejected {
      if let stream = rejection.stream, let id = rejection.id, streams.contains(stream) {
        plan.skipped[stream] = max(plan.skipped[stream] ?? 0, id)
      }
    }
    plan.resets = answer.resets.filter { streams.contains($0.stream) }
    plan.tokens = answer.tokens.filter { streams.contains($0.key) }
    for batch in answer.batches {
      guard streams.contains(batch.stream) else {
        plan.unknownStreams.append(batch.stream)
        continue
      }
      // Adapters sort off the loop; an answer that arrives unsorted anyway is sorted here.
      let sorted = batch.messages.inIDOrder
      // A stream the API reset in this answer is judged from the reset point, with no memory of the old ids.
      let reset = plan.resets.last { $0.stream == batch.stream }
      let cursor = reset?.to ?? cursors[batch.stream] ?? 0
      let decision = CursorDecision.decide(
        ids: sorted.map(\.id), cursor: cursor, recent: reset == nil ? recent[batch.stream] ?? RecentIDs() : RecentIDs())
      if decision.backwards, let last = sorted.last?.id {
        plan.rewinds.append(Rewind(stream: batch.stream, from: cursor, to: last, reason: "ids_went_backwards"))
      }
      var keysInAnswer: Set<String> = []
      var kept = 0
      for index in decision.fresh {
        let message = sorted[index]
        if let key = message.dedupeKey {
          // Delivered again (lately, or twice in this answer): relayed once already.
          // After a reset, the keys stored before it belong to the old numbering (see `forgetKeys`).
          if (reset == nil && recentKeys[batch.stream]?.contains(key) == true) || !keysInAnswer.insert(key).inserted {
            continue
          }
        }
        plan.fresh.append((batch.stream, message))
        kept += 1
      }
      plan.duplicates += sorted.count - kept
      plan.dedupeWindow = answer.dedupeWindow
    }
    return plan
  }

  /// The cursors once `slice` is stored: what is committed with it.
  func cursors(after slice: ArraySlice<(stream: String, message: UpstreamMessage)>) -> [String: UInt64] {
    var next = cursors
    for (stream, message) in slice { next[stream] = message.id }
    return next
  }

  /// `slice` is stored (with `cursors(after: slice)`): the cursors move, and its ids (and dedupe keys, kept up to
  /// `window` per stream) count as relayed lately.
  mutating func stored(
    _ slice: ArraySlice<(stream: String, message: UpstreamMessage)>, window: Int = RecentKeys.capacity
  ) {
    cursors = cursors(after: slice)
    for (stream, message) in slice {
      recent[stream, default: RecentIDs()].insert(message.id)
      if let key = message.dedupeKey { recentKeys[stream, default: RecentKeys(capacity: window)].insert(key) }
    }
  }

  /// A stream the API reset numbers its events anew: the dedupe keys stored under the old numbering are forgotten,
  /// or a new numbering that reuses them (Zulip's event ids restart in a new queue) would lose its first events as
  /// redeliveries. Call once `plan` is made, before its messages are stored.
  mutating func forgetKeys(resetIn plan: Plan) {
    for reset in plan.resets { recentKeys[reset.stream] = nil }
  }

  /// The cursors once every fresh message of `plan` is stored: past the skipped ids, and to the rewinds' targets.
  func settled(_ plan: Plan) -> [String: UInt64] {
    var next = cursors
    for (stream, id) in plan.skipped where id > next[stream] ?? 0 { next[stream] = id }
    for rewind in plan.rewinds { next[rewind.stream] = rewind.to }
    // A reset stream whose answer also brought events stands at its last stored event (set by `stored`).
    for reset in plan.resets where !plan.fresh.contains(where: { $0.stream == reset.stream }) {
      next[reset.stream] = reset.to
    }
    return next
  }

  /// The opaque cursors once the whole of `plan` is stored.
  func tokens(after plan: Plan) -> [String: String] { tokens.merging(plan.tokens) { _, new in new } }

  /// Opaque cursors from `tokens(after:)` are stored.
  mutating func moved(tokens next: [String: String]) { tokens = next }

  /// Cursors from `settled(_:)` of `plan` are stored. A stream the API reset starts afresh: its backlog bound
  /// and its recent ids belong to the old numbering.
  mutating func moved(to next: [String: UInt64], after plan: Plan) {
    cursors = next
    for reset in plan.resets {
      backlogUntil[reset.stream] = nil
      if !plan.fresh.contains(where: { $0.stream == reset.stream }) { recent[reset.stream] = nil }
    }
  }

  // MARK: Backlog

  func isBacklog(_ id: UInt64, stream: String) -> Bool { id <= backlogUntil[stream] ?? 0 }

  /// Ends the backlog of streams whose cursor reached its bound; returns those still catching up.
  mutating func settleBacklog() -> [String: UInt64] {
    for (stream, bound) in backlogUntil where (cursors[stream] ?? 0) >= bound { backlogUntil[stream] = nil }
    return backlogUntil
  }
}

extension UpstreamWorker {
  /// Where polling stands: the stored position, with the ids relayed lately (`FeedPosition.recent`). A worker
  /// started later with `restore(_:)` polls on from there (per-user relaying stops an idle account's worker and
  /// makes a new one when a subscriber returns).
  public typealias Position = FeedPosition
}

extension FeedPosition {
  init(streams: [String], cursors: [String: UInt64], tokens: [String: String] = [:], recent: [String: RecentIDs]) {
    self.init(streams: streams, cursors: cursors, tokens: tokens)
    self.recent = recent
  }

  /// A position read from the store: the stored events' upstream ids count as relayed lately, and so do their
  /// dedupe keys as `keys` reads them from a stored event (an opaque-cursor recipe's `cursor.dedupe`), kept up to
  /// `window` per stream.
  public init(
    stored: FeedPosition, events: [StoredEvent], keys: ((StoredEvent) -> String?)? = nil,
    window: Int = 4096
  ) {
    var recent: [String: RecentIDs] = [:]
    var recentKeys: [String: RecentKeys] = [:]
    for event in events {
      guard let stream = event.stream, let id = event.upstreamID else { continue }
      recent[stream, default: RecentIDs()].insert(id)
      if let key = keys?(event) { recentKeys[stream, default: RecentKeys(capacity: window)].insert(key) }
    }
    self.init(streams: stored.streams, cursors: stored.cursors, tokens: stored.tokens, recent: recent)
    self.recentKeys = recentKeys
  }
}

/// The last few thousand items seen on one stream, oldest forgotten first: relayed ids (`RecentIDs`, to tell a
/// resend from ids going backwards) and stored dedupe keys (`RecentKeys`, an opaque-cursor recipe's redeliveries).
struct RecentSet<Element: Hashable & Sendable>: Sendable {
  /// How many are kept unless a recipe's `cursor.dedupe.window` says otherwise.
  static var capacity: Int { 4096 }
  let limit: Int
  private var order: [Element] = []
  private var members: Set<Element> = []
  private var next = 0

  init(capacity: Int = RecentSet.capacity) { limit = max(1, capacity) }

  func contains(_ item: Element) -> Bool { members.contains(item) }

  /// Adds `item`; false when it was there already.
  @discardableResult
  mutating func insert(_ item: Element) -> Bool {
    guard !members.contains(item) else { return false }
    if order.count < limit {
      order.append(item)
    } else {
      members.remove(order[next])
      order[next] = item
      next = (next + 1) % limit
    }
    members.insert(item)
    return true
  }
}

typealias RecentIDs = RecentSet<UInt64>
typealias RecentKeys = RecentSet<String>

/// Which messages of one stream's answer are new, and whether the upstream's ids went backwards. A pure value,
/// so the rule is tested (and fuzzed) without sockets.
///
/// - Ids above the cursor are new.
/// - Ids at or below it, beside newer ones, are resends (an upstream repeating its last page): dropped.
/// - An answer with nothing above the cursor that holds an id the relay did not relay lately means the ids went
///   backwards (a restored database; an id of 2^64-1 followed by ordinary ones): every id not relayed lately is
///   new, and the cursor follows the server to the answer's highest id.
struct CursorDecision: Equatable {
  var backwards: Bool
  /// Positions (in the ascending ids given) of the messages to relay.
  var fresh: [Int]

  static func decide(ids: [UInt64], cursor: UInt64, recent: RecentIDs) -> CursorDecision {
    let backwards =
      !ids.isEmpty && !ids.contains { $0 > cursor } && ids.contains { $0 != cursor && !recent.contains($0) }
    var fresh: [Int] = []
    var last = backwards ? nil : Optional(cursor)
    for (index, id) in ids.enumerated() {
      if let previous = last, id <= previous { continue }  // at or below the cursor, or repeated in the answer
      if backwards && (id == cursor || recent.contains(id)) { continue }
      fresh.append(index)
      last = id
    }
    return CursorDecision(backwards: backwards, fresh: fresh)
  }
}
