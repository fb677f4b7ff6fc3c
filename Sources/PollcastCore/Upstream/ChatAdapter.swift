/// The reference legacy chat API: `POST /api/session` → `GET /api/messages/last` → `GET /api/messages/poll`,
/// a primary and an optional linked account, each a stream with its own cursor.
public final class ChatAdapter: UpstreamAdapter, @unchecked Sendable {  // loop-confined
  public let name = "chat"
  let baseURL: String
  /// How long the server holds a poll (`timeout=`).
  let holdSeconds: Double
  /// Added to the hold for the client-side deadline of a poll.
  let marginSeconds: Double
  let requestTimeout: Double
  let connectTimeout: Double
  private(set) var token: String?
  private(set) var userID: String?
  private(set) var linkedUserID: String?

  public init(
    baseURL: String, holdSeconds: Double = 25, marginSeconds: Double = 10, requestTimeout: Double = 10,
    connectTimeout: Double = 5
  ) {
    var base = baseURL
    while base.hasSuffix("/") { base.removeLast() }
    self.baseURL = base
    self.holdSeconds = holdSeconds
    self.marginSeconds = marginSeconds
    self.requestTimeout = requestTimeout
    self.connectTimeout = connectTimeout
  }

  public var canSync: Bool { true }
  public var hasSession: Bool { token != nil }

  public func invalidateSession() { token = nil }

  /// Creates the session with the client's API key (if there is none yet) and returns its user id.
  public func identify(_ client: UpstreamClient, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamIdentity?
  {
    if token == nil { try await createSession(client) }
    guard let userID else { throw UpstreamError(.sessionExpired, "no session") }
    return UpstreamIdentity(user: userID, streams: [userID] + (linkedUserID.map { [$0] } ?? []))
  }

  public func prepare(_ client: UpstreamClient, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamPreparation
  {
    if token == nil { try await createSession(client) }
    guard let token, let userID else { throw UpstreamError(.sessionExpired, "no session") }
    let response = try await client.send(
      UpstreamRequest(
        url: "\(baseURL)/api/messages/last?token=\(encodeQueryValue(token))", timeout: requestTimeout,
        connectTimeout: connectTimeout, label: "last"))
    try response.requireOK("last ids", sessionOn401: true, scrubbing: [token])
    let json = try response.json("last ids")
    guard let lastIDs = json["last_ids"], case .object(let members) = lastIDs.value else {
      throw UpstreamError(.decoding, "last ids answer has no \"last_ids\" object")
    }
    var ids: [String: UInt64] = [:]
    for (key, value) in members {
      guard let id = value.unsignedID else {
        throw UpstreamError(.decoding, "last id of \(key) is not an unsigned integer", cause: value.rawText)
      }
      ids[key] = id
    }
    let streams = [userID] + (linkedUserID.map { [$0] } ?? [])
    for stream in streams where ids[stream] == nil {
      throw UpstreamError(.decoding, "last ids answer has no entry for stream \(stream)")
    }
    return UpstreamPreparation(streams: streams, lastIDs: ids)
  }

  private func createSession(_ client: UpstreamClient, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError)
  {
    let response = try await client.send(
      UpstreamRequest(
        method: "POST", url: "\(baseURL)/api/session", body: [], timeout: requestTimeout,
        connectTimeout: connectTimeout, authentication: .apiKey, label: "session"))
    // A 401 here means the API key is wrong: that is a failure to back off from, not a session to renew.
    try response.requireOK("session", sessionOn401: false, scrubbing: nil)
    let json = try response.json("session")
    guard let token = json["token"]?.stringValue, !token.isEmpty else {
      throw UpstreamError(.decoding, "session answer has no \"token\"")
    }
    guard let user = json["user_id"], let userID = user.stringValue ?? user.unsignedID.map(String.init) else {
      throw UpstreamError(.decoding, "session answer has no \"user_id\"")
    }
    var linked: String?
    if let value = json["linked_user_id"] {
      switch value.value {
      case .null: linked = nil
      case .string(let text) where !text.isEmpty: linked = text
      case .number(let text): linked = text
      default: throw UpstreamError(.decoding, "session answer's \"linked_user_id\" is neither a string nor null")
      }
    }
    self.token = token
    self.userID = userID
    self.linkedUserID = linked
  }

  public func poll(
    _ client: UpstreamClient, cursors: [String: UInt64], tokens: [String: String] = [:],
    isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    guard let token else { throw UpstreamError(.sessionExpired, "no session") }
    let cursor = cursors.keys.sorted { order($0) < order($1) }.map { "\($0):\(cursors[$0]!)" }.joined(separator: ",")
    let response = try await client.send(
      UpstreamRequest(
        url: "\(baseURL)/api/messages/poll?token=\(encodeQueryValue(token))&cursor=\(encodeQueryValue(cursor))"
          + "&timeout=\(Int(holdSeconds.rounded()))",
        timeout: holdSeconds + marginSeconds, connectTimeout: connectTimeout, label: "poll"))
    try response.requireOK("poll", sessionOn401: true, scrubbing: [token])
    return try await response.decode("poll") { json, text throws(UpstreamError) in
      try ChatAdapter.parsePoll(json, text: text)
    }
  }

  private func order(_ stream: String) -> Int { stream == userID ? 0 : 1 }

  /// `{"101":[{…},…],"202":[]}` → batches; `{}` is an empty answer. One bad message (no id, too deep) is
  /// rejected alone; messages whose invalid UTF-8 was repaired are relayed and marked.
  static func parsePoll(_ json: RawJSON, text: RepairedText? = nil) throws(UpstreamError) -> UpstreamPollAnswer {
    guard case .object(let members) = json.value else {
      throw UpstreamError(.decoding, "poll answer is not an object")
    }
    var answer = UpstreamPollAnswer(batches: [])
    for (stream, value) in members {
      guard case .array(let elements) = value.value else {
        answer.rejected.append(UpstreamRejection(stream: stream, id: nil, reason: "not an array of messages"))
        continue
      }
      var messages: [UpstreamMessage] = []
      for element in elements {
        if let message = UpstreamMessage.checked(element, id: element["id"], stream: stream, text: text, into: &answer)
        {
          messages.append(message)
        }
      }
      // Sorted here, off the loop for a large answer: the worker then only checks the order.
      answer.batches.append((stream, messages.sorted { $0.id < $1.id }))
    }
    return answer
  }
}
