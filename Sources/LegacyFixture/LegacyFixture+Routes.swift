import CLibevent
import Foundation
import PollcastCore

/// A poll parked until a message after one of its cursors exists, its timeout passes, or its client leaves.
final class PendingPoll: @unchecked Sendable {  // loop thread only
  enum Kind: Equatable {
    /// `/api/messages/poll`: several users, one cursor each.
    case chat
    /// `/api/feed`: one user's messages in the generic single-stream shape.
    case generic
    /// Another real API's shape over the primary account's messages (`LegacyFixture+Shapes`).
    case shape(APIShape)
  }

  let id: Int
  let kind: Kind
  let request: HTTPRequest
  let token: String
  let cursors: [(user: String, id: UInt64)]
  let fault: FixtureFault?
  /// The account whose poll this is (per-user statistics), and the API key a generic poll presented.
  var user: String?
  var apiKey: String?
  var timer: LoopTimer?
  /// Set once the answer is decided (a delayed answer waits with it set, so new messages do not re-arm it).
  var answering = false
  weak var watch: ConnectionWatch?
  /// A read event on the client's socket while the poll is parked: evhttp stops reading once a request is in,
  /// so without it a client that gives up would go unnoticed and still count as in flight.
  var hangupEvent: OpaquePointer?

  func stopWatchingHangup() {
    if let hangupEvent { event_free(hangupEvent) }
    hangupEvent = nil
  }

  deinit { stopWatchingHangup() }

  init(
    id: Int, kind: Kind, request: HTTPRequest, token: String, cursors: [(user: String, id: UInt64)],
    fault: FixtureFault?
  ) {
    self.id = id
    self.kind = kind
    self.request = request
    self.token = token
    self.cursors = cursors
    self.fault = fault
  }
}

extension LegacyFixture {
  func route(_ request: HTTPRequest) {
    let query = request.queryItems
    guard let path = request.path else {
      request.respondError(status: 400, reason: "Bad Request", message: "malformed request target")
      return
    }
    let parameters = Dictionary(query, uniquingKeysWith: { first, _ in first })
    switch (request.method, path) {
    case (.post, "/api/session"): createSession(request)
    case (.get, "/api/messages/last"): lastIDs(request, token: parameters["token"])
    case (.get, "/api/messages/poll"): poll(request, parameters: parameters)
    case (.get, "/api/feed"): genericPoll(request, parameters: parameters)
    case (_, _) where routeShape(request, path: path, parameters: parameters): break
    case (.post, "/_control/messages"): controlMessages(request)
    case (.post, "/_control/link"): controlLink(request)
    case (.delete, "/_control/link"):
      let user = (try? RawJSON.parse(request.bodyText))?["user_id"]?.stringValue ?? options.userID
      setLinkedUser(nil, for: user)
      json(request, JSONText.object(["user_id": JSONText.quoted(user), "linked_user_id": "null"]))
    case (.post, "/_control/expire-tokens"):
      expireTokens()
      json(request, #"{"expired":true}"#)
    case (.post, "/_control/keys"), (.delete, "/_control/keys"): controlKeys(request)
    case (.post, "/_control/faults"): controlFaults(request)
    case (.post, "/_control/poison"): controlPoison(request)
    case (.post, "/_control/rewind"): controlRewind(request)
    case (.get, "/_control/stats"): json(request, statsJSON())
    case (.post, "/_control/reset-maxima"):
      resetMaxima()
      json(request, statsJSON())
    case (_, "/api/session"), (_, "/api/messages/last"), (_, "/api/messages/poll"), (_, "/api/feed"),
      (_, "/_control/messages"), (_, "/_control/link"), (_, "/_control/expire-tokens"), (_, "/_control/faults"),
      (_, "/_control/stats"), (_, "/_control/reset-maxima"), (_, "/_control/poison"), (_, "/_control/rewind"),
      (_, "/_control/keys"):
      request.respondError(status: 405, reason: "Method Not Allowed", message: "wrong method for \(path)")
    default:
      request.respondError(status: 404, reason: "Not Found", message: "no such path: \(path)")
    }
  }

  func json(_ request: HTTPRequest, _ body: String, status: Int32 = 200) {
    guard body.contains(LegacyFixture.invalidUTF8Marker) else {
      request.respond(
        status: status, reason: status == 200 ? "OK" : "Error", contentType: "application/json", body: body)
      return
    }
    let parts = body.components(separatedBy: LegacyFixture.invalidUTF8Marker)
    var bytes = Array(parts[0].utf8)
    for part in parts.dropFirst() { bytes += [0xC3, 0x28, 0xFF] + Array(part.utf8) }
    request.respond(
      status: status, reason: status == 200 ? "OK" : "Error", contentType: "application/json", bytes: bytes)
  }

  func badRequest(_ request: HTTPRequest, _ message: String) {
    json(request, JSONText.object(["error": JSONText.quoted(message)]), status: 400)
  }

  // MARK: Legacy API

  private func createSession(_ request: HTTPRequest) {
    let authorization = request.header("Authorization") ?? ""
    guard authorization.hasPrefix("Bearer "), let user = account(forAPIKey: String(authorization.dropFirst(7))) else {
      stats.unauthorized += 1
      json(request, #"{"error":"invalid api key"}"#, status: 401)
      return
    }
    let (token, _) = issueSession(for: user, apiKey: String(authorization.dropFirst(7)))
    let linked = users(of: user).dropFirst().first
    json(
      request,
      JSONText.object([
        "token": JSONText.quoted(token), "user_id": JSONText.quoted(user),
        "linked_user_id": linked.map(JSONText.quoted) ?? "null", "expires_in": String(Int(options.tokenLifetime)),
      ]))
  }

  private func lastIDs(_ request: HTTPRequest, token: String?) {
    guard let session = validSession(token) else {
      stats.unauthorized += 1
      json(request, #"{"error":"token expired"}"#, status: 401)
      return
    }
    stats.syncs += 1
    let ids = users(of: session.userID).map { "\(JSONText.quoted($0)):\(store.lastID($0))" }.joined(separator: ",")
    json(request, "{\"last_ids\":{\(ids)}}")
  }

  private func poll(_ request: HTTPRequest, parameters: [String: String]) {
    guard let token = parameters["token"], let session = validSession(token) else {
      stats.unauthorized += 1
      json(request, #"{"error":"token expired"}"#, status: 401)
      return
    }
    var cursors: [(user: String, id: UInt64)] = []
    for part in (parameters["cursor"] ?? "").split(separator: ",") {
      let pieces = part.split(separator: ":")
      guard pieces.count == 2, let id = UInt64(pieces[1]) else {
        badRequest(request, "cursor must look like 101:1200,202:77")
        return
      }
      cursors.append((String(pieces[0]), id))
    }
    let readable = Set(users(of: session.userID))
    cursors = cursors.filter { readable.contains($0.user) }
    guard let timeout = pollTimeout(parameters, request) else { return }
    park(request, kind: .chat, token: token, cursors: cursors, timeout: timeout, user: session.userID)
  }

  /// `GET /api/feed?after=N`: with `Authorization: Bearer <api key>` the key's account (401 for an unknown or
  /// revoked key), without one the `user` parameter's (default the primary account).
  private func genericPoll(_ request: HTTPRequest, parameters: [String: String]) {
    var user = parameters["user"] ?? options.userID
    var apiKey: String?
    if let authorization = request.header("Authorization") {
      guard authorization.hasPrefix("Bearer "), let owner = account(forAPIKey: String(authorization.dropFirst(7)))
      else {
        stats.unauthorized += 1
        json(request, #"{"error":"invalid api key"}"#, status: 401)
        return
      }
      user = owner
      apiKey = String(authorization.dropFirst(7))
    }
    guard let after = UInt64(parameters["after"] ?? "0") else {
      badRequest(request, "after must be a message id")
      return
    }
    guard let timeout = pollTimeout(parameters, request) else { return }
    park(
      request, kind: .generic, token: "generic:\(user)", cursors: [(user, after)], timeout: timeout, user: user,
      apiKey: apiKey)
  }

  func pollTimeout(_ parameters: [String: String], _ request: HTTPRequest) -> Double? {
    guard let timeout = Double(parameters["timeout"] ?? "25"), timeout >= 0, timeout.isFinite else {
      badRequest(request, "timeout must be a number of seconds")
      return nil
    }
    return min(timeout, options.maxPollTimeout)
  }

  func park(
    _ request: HTTPRequest, kind: PendingPoll.Kind, token: String, cursors: [(user: String, id: UInt64)],
    timeout: Double, user: String?, apiKey: String? = nil
  ) {
    stats.polls += 1
    var fault = faults.isEmpty ? nil : faults.removeFirst()
    if fault != nil {
      stats.faultsApplied += 1
    } else if let user, options.stalls(user) {
      fault = .hang
    } else if options.answerDelay > 0 {
      fault = .delay(milliseconds: Int((options.answerDelay * 1000).rounded()))
    }
    if case .status(let code) = fault {
      json(request, #"{"error":"injected fault"}"#, status: Int32(code))
      return
    }
    let poll = PendingPoll(
      id: nextPollID, kind: kind, request: request, token: token, cursors: cursors, fault: fault)
    nextPollID += 1
    poll.user = user
    poll.apiKey = apiKey
    pending[poll.id] = poll
    let inFlight = (inFlightByToken[token] ?? 0) + 1
    inFlightByToken[token] = inFlight
    stats.maxPollsInFlightPerToken = max(stats.maxPollsInFlightPerToken, inFlight)
    if let user {
      var perUser = stats.users[user, default: LegacyFixture.UserStats()]
      perUser.polls += 1
      perUser.pollsInFlight += 1
      perUser.maxPollsInFlight = max(perUser.maxPollsInFlight, perUser.pollsInFlight)
      stats.users[user] = perUser
    }
    stats.maxConcurrentPolls = max(stats.maxConcurrentPolls, pending.count)
    if let watch = watch(request) {
      watch.pollID = poll.id
      poll.watch = watch
      watchHangup(poll, watch: watch)
    }
    if fault == .hang { return }
    if hasNews(poll) {
      answer(poll)
      return
    }
    let timer = LoopTimer(loop: loop) { [weak self, weak poll] in
      guard let self, let poll else { return }
      self.assumeIsolated { $0.answer(poll) }
    }
    timer.schedule(after: timeout)
    poll.timer = timer
  }

  private func hasNews(_ poll: PendingPoll) -> Bool {
    poll.cursors.contains { store.lastID($0.user) > $0.id }
  }

  func wake(user: String) {
    for poll in pending.values
    where !poll.answering && poll.fault != .hang && poll.cursors.contains(where: { $0.user == user }) {
      if hasNews(poll) { answer(poll) }
    }
  }

  /// Builds the answer now and sends it, bent by the poll's fault.
  func answer(_ poll: PendingPoll) {
    guard pending[poll.id] != nil, !poll.answering else { return }
    poll.answering = true
    poll.timer = nil
    let body = answerBody(poll)
    let kind = poll.kind  // not the poll: the delay timer it owns keeps this closure
    let send: @Sendable (isolated LegacyFixture, HTTPRequest) -> Void = { fixture, request in
      if case .shape(let shape) = kind {
        fixture.respondShape(shape, request, body: body)
      } else {
        fixture.json(request, body)
      }
    }
    switch poll.fault {
    case .delay(let milliseconds):
      // Stays in flight (and parked) until the delayed answer goes out.
      let timer = LoopTimer(loop: loop) { [weak self, weak poll] in
        guard let self, let poll else { return }
        self.assumeIsolated { fixture in fixture.finish(poll) { send(fixture, $0) } }
      }
      timer.schedule(after: Double(milliseconds) / 1000)
      poll.timer = timer
    case .malformedJSON:
      finish(poll) { self.json($0, "{\"\(self.options.userID)\":[{\"id\":1,\"text\":\"unterminated") }
    case .resetMidBody:
      finish(poll) { request in self.sendPartialThenReset(request, body: body, watch: poll.watch) }
    default:
      finish(poll) { send(self, $0) }
    }
  }

  private func answerBody(_ poll: PendingPoll) -> String {
    var parts: [String] = []
    for cursor in poll.cursors {
      var messages = Array(store.after(cursor.id, user: cursor.user, limit: options.pageSize))
      if poll.fault == .duplicate {
        messages = Array(store.already(cursor.id, user: cursor.user, count: 3)) + messages
      }
      switch poll.kind {
      case .chat:
        parts.append("\(JSONText.quoted(cursor.user)):[\(messages.map(\.json).joined(separator: ","))]")
      case .generic:
        // The generic shape: {"data":{"items":[{"seq":N,"message":{…}}]}}
        let items = messages.map { "{\"seq\":\($0.id),\"message\":\($0.json)}" }.joined(separator: ",")
        return "{\"data\":{\"items\":[\(items)]}}"
      case .shape(let shape):
        return shapeBody(shape, after: cursor.id, messages: messages)
      }
    }
    let anyMessages = poll.cursors.contains { store.lastID($0.user) > $0.id } || poll.fault == .duplicate
    return anyMessages ? "{\(parts.joined(separator: ","))}" : "{}"
  }

  /// Removes the poll from the books and sends its response.
  func finish(_ poll: PendingPoll, respond: (HTTPRequest) -> Void) {
    guard pending.removeValue(forKey: poll.id) != nil else { return }
    poll.timer = nil
    release(poll)
    respond(poll.request)
  }

  private func watchHangup(_ poll: PendingPoll, watch: ConnectionWatch) {
    guard let bufferevent = evhttp_connection_get_bufferevent(watch.connection) else { return }
    let fd = bufferevent_getfd(bufferevent)
    // Unretained: the event is freed (stopWatchingHangup) before the watch or the poll can go away.
    do {
      let event = try LibeventCall.check(
        event_new(
          loop.base, fd, pollcast_EV_READ | pollcast_EV_PERSIST, fixtureHangup,
          Unmanaged.passUnretained(watch).toOpaque()),
        "event_new(hangup)")
      poll.hangupEvent = event
      try LibeventCall.check(event_add(event, nil), "event_add(hangup)")
    } catch {
      // Without the watch a client that gives up stays "in flight" until the poll's own timeout: say so.
      FileHandle.standardError.write(Data("fixture: cannot watch a parked poll's socket: \(error)\n".utf8))
    }
  }

  func clientReadable(_ watch: ConnectionWatch) {
    guard let bufferevent = evhttp_connection_get_bufferevent(watch.connection) else { return }
    var byte: UInt8 = 0
    let count = recv(bufferevent_getfd(bufferevent), &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
    if count > 0 {
      // A pipelined request: not a hang-up; evhttp reads it after this answer.
      if let id = watch.pollID { pending[id]?.stopWatchingHangup() }
      return
    }
    if count < 0 && (errno == EAGAIN || errno == EINTR) { return }
    // EOF or reset: free the connection; its close callback (connectionClosed) takes the poll off the books.
    evhttp_connection_free(watch.connection)
  }

  private func release(_ poll: PendingPoll) {
    poll.stopWatchingHangup()
    if let count = inFlightByToken[poll.token] {
      inFlightByToken[poll.token] = count > 1 ? count - 1 : nil
    }
    if let user = poll.user, let perUser = stats.users[user] {
      stats.users[user]?.pollsInFlight = max(0, perUser.pollsInFlight - 1)
    }
    if poll.watch?.pollID == poll.id { poll.watch?.pollID = nil }
  }

  /// Status line, headers and half the body, then a TCP reset.
  private func sendPartialThenReset(_ request: HTTPRequest, body: String, watch: ConnectionWatch?) {
    request.addHeader("Content-Type", "application/json")
    request.addHeader("Content-Length", String(body.utf8.count))
    evhttp_send_reply_start(request.raw, 200, "OK")
    let buffer = evbuffer_new()
    defer { evbuffer_free(buffer) }
    let half = Array(body.utf8.prefix(max(1, body.utf8.count / 2)))
    half.withUnsafeBytes { _ = evbuffer_add(buffer, $0.baseAddress, $0.count) }
    guard let watch else { return }
    // The watch lives while its connection does; the callback runs only while the connection is open.
    evhttp_send_reply_chunk_with_cb(
      request.raw, buffer, fixtureResetAfterFlush, Unmanaged.passUnretained(watch).toOpaque())
  }

  // MARK: Connections

  private func watch(_ request: HTTPRequest) -> ConnectionWatch? {
    guard let connection = request.connection else { return nil }
    if let existing = connections[connection] { return existing }
    let watch = ConnectionWatch(fixture: self, connection: connection)
    connections[connection] = watch
    // Unretained: `connections` keeps the watch until this callback removes it.
    evhttp_connection_set_closecb(connection, fixtureConnectionClosed, Unmanaged.passUnretained(watch).toOpaque())
    return watch
  }

  func connectionClosed(_ watch: ConnectionWatch) {
    connections[watch.connection] = nil
    guard let id = watch.pollID, let poll = pending.removeValue(forKey: id) else { return }
    // The client gave up on this poll (its own timeout, a cancel): it is no longer in flight.
    poll.timer = nil
    release(poll)
  }

  func resetConnection(_ watch: ConnectionWatch) {
    let connection = watch.connection
    if let bufferevent = evhttp_connection_get_bufferevent(connection) {
      let fd = bufferevent_getfd(bufferevent)
      var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    }
    evhttp_connection_free(connection)
  }

  // MARK: Control API

  private func controlMessages(_ request: HTTPRequest) {
    guard let body = try? RawJSON.parse(request.bodyText) else {
      badRequest(request, "body must be JSON like {\"user_id\":\"101\",\"text\":\"hi\"}")
      return
    }
    guard let user = body["user_id"]?.stringValue, !user.isEmpty else {
      badRequest(request, "user_id (a string) is required")
      return
    }
    var texts: [String] = []
    if let text = body["text"]?.stringValue { texts.append(text) }
    if let list = body["texts"] {
      guard case .array(let elements) = list.value, elements.allSatisfy({ $0.stringValue != nil }) else {
        badRequest(request, "texts must be an array of strings")
        return
      }
      texts += elements.compactMap(\.stringValue)
    }
    guard !texts.isEmpty else {
      badRequest(request, "give text or texts")
      return
    }
    let ids = append(
      user: user, texts: texts, from: body["from"]?.stringValue ?? "alice", chatID: body["chat_id"]?.stringValue ?? "c1"
    )
    json(request, "{\"ids\":[\(ids.map(String.init).joined(separator: ","))]}")
  }

  private func controlLink(_ request: HTTPRequest) {
    guard let body = try? RawJSON.parse(request.bodyText), let linked = body["linked_user_id"]?.stringValue,
      !linked.isEmpty
    else {
      badRequest(request, "body must be {\"linked_user_id\":\"202\"} (and optionally \"user_id\")")
      return
    }
    let user = body["user_id"]?.stringValue ?? options.userID
    setLinkedUser(linked, for: user)
    json(request, JSONText.object(["user_id": JSONText.quoted(user), "linked_user_id": JSONText.quoted(linked)]))
  }

  /// `POST {"user_id":"1000","api_key":"phone-1000"}` adds a key for an account; `DELETE {"api_key":"key-1000"}`
  /// revokes one (its sessions and parked polls answer 401).
  private func controlKeys(_ request: HTTPRequest) {
    guard let body = try? RawJSON.parse(request.bodyText), let key = body["api_key"]?.stringValue, !key.isEmpty
    else {
      badRequest(request, "body must be {\"api_key\":\"…\"} (and \"user_id\" to add a key)")
      return
    }
    if request.method == .delete {
      revokeKey(key)
      json(request, JSONText.object(["revoked": "true"]))
      return
    }
    guard let user = body["user_id"]?.stringValue, !user.isEmpty else {
      badRequest(request, "user_id (a string) is required to add a key")
      return
    }
    addKey(key, for: user)
    json(request, JSONText.object(["user_id": JSONText.quoted(user), "added": "true"]))
  }

  /// `{"user_id":"101","kind":"invalid_utf8"|"deep"}`: appends one poison message.
  private func controlPoison(_ request: HTTPRequest) {
    guard let body = try? RawJSON.parse(request.bodyText), let user = body["user_id"]?.stringValue,
      let kind = body["kind"]?.stringValue.flatMap(LegacyFixture.Poison.init(rawValue:))
    else {
      badRequest(request, "body must be {\"user_id\":\"101\",\"kind\":\"invalid_utf8\", \"deep\" or \"no_id\"}")
      return
    }
    json(request, "{\"ids\":[\(appendPoison(user: user, kind))]}")
  }

  /// `{"user_id":"101","last_id":5}`: forgets the user's messages above 5 (a restored database).
  private func controlRewind(_ request: HTTPRequest) {
    guard let body = try? RawJSON.parse(request.bodyText), let user = body["user_id"]?.stringValue,
      let last = body["last_id"]?.unsignedID
    else {
      badRequest(request, "body must be {\"user_id\":\"101\",\"last_id\":5}")
      return
    }
    rewind(user: user, to: last)
    json(request, JSONText.object(["user_id": JSONText.quoted(user), "last_id": String(last)]))
  }

  private func controlFaults(_ request: HTTPRequest) {
    do {
      let body = try RawJSON.parse(request.bodyText)
      guard let list = body["faults"], case .array(let elements) = list.value else {
        throw FixtureError("body must be {\"faults\":[…]}")
      }
      var parsed: [FixtureFault] = []
      for element in elements { parsed.append(try FixtureFault(json: element)) }
      queue(parsed)
      json(request, "{\"queued\":\(parsed.count),\"pending\":\(faults.count)}")
    } catch {
      badRequest(request, "\(error)")
    }
  }

  func statsJSON() -> String {
    let snapshot = statistics()
    let messages = snapshot.messages.keys.sorted().map { "\(JSONText.quoted($0)):\(snapshot.messages[$0]!)" }
    return JSONText.object([
      "polls": String(snapshot.polls), "polls_in_flight": String(snapshot.pollsInFlight),
      "max_concurrent_polls": String(snapshot.maxConcurrentPolls),
      "max_polls_in_flight_per_token": String(snapshot.maxPollsInFlightPerToken),
      "sessions": String(snapshot.sessions), "syncs": String(snapshot.syncs),
      "unauthorized": String(snapshot.unauthorized),
      "faults_applied": String(snapshot.faultsApplied), "faults_pending": String(snapshot.faultsPending),
      "linked_user_id": linkedUserID.map(JSONText.quoted) ?? "null",
      "messages": "{\(messages.joined(separator: ","))}",
      "users": "{"
        + snapshot.users.keys.sorted().map { user in
          let perUser = snapshot.users[user]!
          return JSONText.quoted(user) + ":"
            + JSONText.object([
              "sessions": String(perUser.sessions), "polls": String(perUser.polls),
              "polls_in_flight": String(perUser.pollsInFlight),
              "max_polls_in_flight": String(perUser.maxPollsInFlight),
            ])
        }.joined(separator: ",") + "}",
    ])
  }
}

private let fixtureConnectionClosed: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  _, context in
  guard let context else { return }
  let watch = Unmanaged<ConnectionWatch>.fromOpaque(context).takeUnretainedValue()
  watch.fixture?.assumeIsolated { $0.connectionClosed(watch) }
}

private let fixtureHangup: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  _, _, context in
  guard let context else { return }
  let watch = Unmanaged<ConnectionWatch>.fromOpaque(context).takeUnretainedValue()
  watch.fixture?.assumeIsolated { $0.clientReadable(watch) }
}

private let fixtureResetAfterFlush: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  _, context in
  guard let context else { return }
  let watch = Unmanaged<ConnectionWatch>.fromOpaque(context).takeUnretainedValue()
  watch.fixture?.assumeIsolated { $0.resetConnection(watch) }
}
