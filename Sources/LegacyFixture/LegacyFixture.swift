import CLibevent
import Foundation
import PollcastCore

/// The reference legacy long-poll API (DESIGN's "Upstream" section) with its control API and fault injection.
///
/// It runs on its own event loop thread, like a separate server would, holds any number of polls without
/// busy-waiting (each is a parked evhttp request plus one timer), and counts what tests need: polls, polls in
/// flight (overall and per token), sessions.
public actor LegacyFixture {
  public struct Options: Sendable {
    public var host = "127.0.0.1"
    public var port = 0
    public var apiKey = "dev-key"
    public var userID = "101"
    public var linkedUserID: String? = "202"
    /// Seconds a token lives (`expires_in`).
    public var tokenLifetime = 300.0
    /// Largest `timeout` a poll may ask for.
    public var maxPollTimeout = 120.0
    /// Messages per user in one answer, at most.
    public var pageSize = 100
    /// Extra accounts for per-user relaying: users `1000` … `1000+accounts-1`, API key `key-<user_id>`, no linked
    /// account (DESIGN, "Who reads what").
    public var accounts = 0
    /// Seconds every poll answer waits after it is decided, as a slow legacy API's would (0: none). The poll stays in
    /// flight meanwhile. Sessions and control answers are not delayed.
    public var answerDelay = 0.0
    /// The share of accounts (0 to 1) whose polls are never answered, as if the legacy API stalled their
    /// connections; chosen by a hash of the user id, so the same accounts stall on every run.
    public var stallFraction = 0.0

    public init() {}

    /// Whether `user`'s polls stall (`stallFraction`): FNV-1a of the id, in thousandths.
    public func stalls(_ user: String) -> Bool {
      guard stallFraction > 0 else { return false }
      var hash: UInt64 = 0xcbf2_9ce4_8422_2325
      for byte in user.utf8 { hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3 }
      return Double(hash % 1000) < stallFraction * 1000
    }
  }

  public struct Stats: Sendable, Equatable {
    public var polls = 0
    public var pollsInFlight = 0
    public var maxConcurrentPolls = 0
    /// The largest number of polls one token had in flight at once.
    public var maxPollsInFlightPerToken = 0
    public var sessions = 0
    /// `GET /api/messages/last` calls answered (a relay's cursor syncs).
    public var syncs = 0
    public var unauthorized = 0
    public var faultsApplied = 0
    public var faultsPending = 0
    public var messages: [String: Int] = [:]
    /// Per account that has had a session: sessions started, polls in flight now, most polls in flight at once.
    public var users: [String: UserStats] = [:]
  }

  public struct UserStats: Sendable, Equatable {
    public var sessions = 0
    /// Polls received, answered or not.
    public var polls = 0
    public var pollsInFlight = 0
    public var maxPollsInFlight = 0
  }

  public nonisolated let loop: EventLoop
  public nonisolated let options: Options
  /// `host:port` the fixture listens on.
  public nonisolated let address: String
  public nonisolated let port: Int
  public nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  private var listener: HTTPListener?
  var store = MessageStore()
  /// The primary account's linked account (`--linked-user-id`, `/_control/link`).
  var linkedUserID: String?
  /// The other accounts' linked accounts.
  var linkedByUser: [String: String] = [:]
  var sessions: [String: Session] = [:]
  var pending: [Int: PendingPoll] = [:]
  var nextPollID = 1
  var inFlightByToken: [String: Int] = [:]
  var faults: [FixtureFault] = []
  /// One-off answers for the next polls of the other APIs' shapes (`queueCanned`).
  var cannedAnswers: [CannedAnswer] = []
  /// The VK shape's key generation and one-off losses.
  var vk = VKState()
  /// The Zulip shape's event queue: its generation (0: none registered yet), the message id it started after,
  /// and the heartbeats sent since its last message.
  var zulip = (generation: 0, base: UInt64(0), heartbeats: UInt64(0))
  /// The Dropbox shape's cursor generation (a reset starts a new one), one-off backoff, and page size.
  var dropbox = (generation: 1, backoff: Int?.none, page: 100)
  /// The CometD shape's client generation (0: no handshake yet), the message id its queue starts after, whether it
  /// subscribed to `/orders/**`, and a one-off `advice.interval`.
  var cometd = (generation: 0, base: UInt64(0), subscribed: false, interval: Int?.none)
  struct VKState {
    var keyGeneration = 1
    var historyLost = false
    var lost = false
  }
  var stats = Stats()
  var connections: [OpaquePointer: ConnectionWatch] = [:]
  private var chatter: LoopTimer?
  private var chatterCount = 0

  struct Session {
    let userID: String
    let expiresAt: Double
    /// The API key that opened it: revoking the key revokes its sessions.
    var apiKey: String? = nil
    var revoked = false
  }

  /// Keys added with `/_control/keys` (key → user), and keys revoked (built-in or added).
  var addedKeys: [String: String] = [:]
  var revokedKeys: Set<String> = []

  /// Starts a fixture on its own loop thread.
  public static func start(_ options: Options = Options()) async throws -> LegacyFixture {
    let socket = try ListeningSocket.bind(host: options.host, port: options.port, backlog: 4096)
    let loop = try EventLoop()
    loop.start()
    let fixture = LegacyFixture(loop: loop, options: options, socket: socket)
    try await fixture.listen(socket)
    return fixture
  }

  private init(loop: EventLoop, options: Options, socket: ListeningSocket) {
    self.loop = loop
    self.options = options
    self.address = socket.address
    self.port = socket.port
    self.linkedUserID = options.linkedUserID
  }

  private func listen(_ socket: ListeningSocket) throws {
    let listener = HTTPListener(loop: loop) { [weak self] request in
      self?.assumeIsolated { $0.route(request) }
    }
    // The hang-up watch keeps evhttp's close callback across a connection's requests: no keep-alive deadline.
    try listener.start(socket: socket, limits: .init(maxBodyBytes: 4 << 20, timeout: 600, keepAliveDeadline: false))
    self.listener = listener
  }

  /// Stops the server and its loop thread.
  public func shutdown() async {
    chatter = nil
    for poll in pending.values { poll.timer = nil }
    pending.removeAll()
    listener?.close()
    listener = nil
    let loop = self.loop
    Thread.detachNewThread { loop.stop() }
  }

  // MARK: In-process control (the same operations as the control API)

  /// Appends a message every `seconds`, alternating between the primary and the linked account (demos).
  public func startChatter(every seconds: Double) {
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in
      self?.assumeIsolated { fixture in
        fixture.chatterCount += 1
        let users = fixture.sessionUsers()
        let user = users[fixture.chatterCount % users.count]
        let speaker = ["alice", "bob", "carol"][fixture.chatterCount % 3]
        fixture.append(user: user, texts: ["demo message \(fixture.chatterCount)"], from: speaker)
      }
    }
    timer.schedule(after: seconds)
    chatter = timer
  }

  /// Appends messages for `user`; returns their ids. Pending polls waiting on that user are answered.
  @discardableResult
  public func append(user: String, texts: [String], from: String = "alice", chatID: String = "c1") -> [UInt64] {
    let ids = texts.map { store.append(user: user, text: $0, from: from, chatID: chatID) }
    if !ids.isEmpty { wake(user: user) }
    return ids
  }

  /// A message that hostile or broken upstream data would produce, for the relay's hardening tests.
  public enum Poison: String, Sendable, CaseIterable {
    /// Its text holds bytes that are not UTF-8 (a truncated two-byte sequence and a 0xFF).
    case invalidUTF8 = "invalid_utf8"
    /// A member nested 300 arrays deep.
    case deep
    /// No "id" member at all.
    case noID = "no_id"
  }

  /// Appends `count` poison messages for `user`; returns the last one's id.
  @discardableResult
  public func appendPoison(user: String, _ poison: Poison, count: Int = 1) -> UInt64 {
    var last: UInt64 = 0
    for _ in 0..<max(1, count) {
      last = store.append(user: user) { id in
        switch poison {
        case .invalidUTF8: "{\"id\":\(id),\"text\":\"bad \(LegacyFixture.invalidUTF8Marker) bytes\"}"
        case .noID: "{\"text\":\"message \(id) has no id\"}"
        case .deep:
          "{\"id\":\(id),\"nested\":\(String(repeating: "[", count: 300))\(String(repeating: "]", count: 300))}"
        }
      }
    }
    wake(user: user)
    return last
  }

  /// Stands for two bytes that are not UTF-8 (C3 28 FF) in a stored message; replaced when the answer is sent.
  static let invalidUTF8Marker = "\u{1}INVALID-UTF8\u{1}"

  /// Forgets `user`'s messages above `lastID` (a database restored from an older backup).
  public func rewind(user: String, to lastID: UInt64) { store.rewind(user: user, to: lastID) }

  /// Attaches (or detaches, with nil) the linked account. Like a real API that re-scopes sessions on a link
  /// change, it revokes every token, so the client's next call gets 401 and starts a session that names the new
  /// linked account.
  public func setLinkedUser(_ user: String?) {
    linkedUserID = user
    expireTokens()
  }

  /// Links (or unlinks, with nil) `linked` to account `user`; only that account's tokens are revoked.
  public func setLinkedUser(_ linked: String?, for user: String) {
    guard user != options.userID else {
      setLinkedUser(linked)
      return
    }
    linkedByUser[user] = linked
    for (key, session) in sessions where session.userID == user { sessions[key]?.revoked = true }
    for poll in pending.values where poll.kind == .chat && sessions[poll.token]?.userID == user {
      finish(poll) { $0.respondError(status: 401, reason: "Unauthorized", message: "token expired") }
    }
  }

  /// The account an API key opens, if any.
  func account(forAPIKey key: String) -> String? {
    guard !revokedKeys.contains(key) else { return nil }
    if let user = addedKeys[key] { return user }
    if key == options.apiKey { return options.userID }
    guard options.accounts > 0, key.hasPrefix("key-"), let id = Int(key.dropFirst(4)),
      id >= 1000, id < 1000 + options.accounts, "key-\(id)" == key
    else { return nil }
    return String(id)
  }

  /// Adds an API key for `user` (a second device's key): both keys open the same account.
  public func addKey(_ key: String, for user: String) {
    revokedKeys.remove(key)
    addedKeys[key] = user
  }

  /// Revokes an API key, like a user who resets their key: it opens no session any more, the sessions it opened
  /// answer 401, and their parked polls are answered 401 at once.
  public func revokeKey(_ key: String) {
    revokedKeys.insert(key)
    addedKeys[key] = nil
    for (token, session) in sessions where session.apiKey == key { sessions[token]?.revoked = true }
    for poll in pending.values where poll.kind == .chat && sessions[poll.token]?.apiKey == key {
      finish(poll) { $0.respondError(status: 401, reason: "Unauthorized", message: "token expired") }
    }
    for poll in pending.values where poll.kind == .generic && poll.apiKey == key {
      finish(poll) { $0.respondError(status: 401, reason: "Unauthorized", message: "api key revoked") }
    }
  }

  /// The streams a session of `user` reads: its own and its linked account's.
  func users(of user: String) -> [String] {
    let linked = user == options.userID ? linkedUserID : linkedByUser[user]
    return [user] + (linked.map { [$0] } ?? [])
  }

  /// Every issued token answers 401 from now on.
  public func expireTokens() {
    for key in sessions.keys { sessions[key]?.revoked = true }
    // Polls parked with a revoked token are answered 401 at once, as the real API would on its next check.
    for poll in pending.values where poll.kind == .chat {
      finish(poll) { $0.respondError(status: 401, reason: "Unauthorized", message: "token expired") }
    }
  }

  public func queue(_ faults: [FixtureFault]) { self.faults += faults }

  /// Every token issued so far (tests check that none of them reaches a log).
  public func issuedTokens() -> [String] { Array(sessions.keys) }

  public func statistics() -> Stats {
    var snapshot = stats
    snapshot.faultsPending = faults.count
    snapshot.messages = store.counts
    snapshot.pollsInFlight = pending.count
    return snapshot
  }

  /// Forgets the maxima so a test can measure one phase.
  public func resetMaxima() {
    stats.maxConcurrentPolls = pending.count
    stats.maxPollsInFlightPerToken = inFlightByToken.values.max() ?? 0
  }

  /// The primary account's streams.
  func sessionUsers() -> [String] { users(of: options.userID) }

  func validSession(_ token: String?) -> Session? {
    guard let token, let session = sessions[token], !session.revoked, MonotonicClock.seconds() < session.expiresAt
    else { return nil }
    return session
  }

  func issueSession(for user: String, apiKey: String? = nil) -> (token: String, session: Session) {
    var bytes = [UInt8](repeating: 0, count: 16)
    for index in bytes.indices { bytes[index] = UInt8.random(in: 0...255) }
    let token = bytes.map { String(format: "%02x", $0) }.joined()
    let session = Session(userID: user, expiresAt: MonotonicClock.seconds() + options.tokenLifetime, apiKey: apiKey)
    sessions[token] = session
    stats.sessions += 1
    stats.users[user, default: UserStats()].sessions += 1
    return (token, session)
  }
}

/// Watches one client connection so that a poll whose client went away stops counting as in flight.
final class ConnectionWatch: @unchecked Sendable {  // loop thread only
  weak var fixture: LegacyFixture?
  var pollID: Int?
  let connection: OpaquePointer

  init(fixture: LegacyFixture, connection: OpaquePointer) {
    self.fixture = fixture
    self.connection = connection
  }
}
