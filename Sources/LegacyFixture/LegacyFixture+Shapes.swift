import Foundation
import PollcastCore

/// Other real long-poll APIs' wire shapes over the primary account's messages, for the recipe examples' tests
/// (`../shared/LONGPOLL-APIS.md` describes each as it is on the wire):
///
/// - `telegram`: `GET /bot<token>/getUpdates?offset=N&timeout=S` → `{"ok":true,"result":[{"update_id":…}]}`; the
///   token is the fixture's API key (401 otherwise); `offset` confirms everything below it; a second poll while
///   one is held ends the older one with 409 "Conflict: terminated by other getUpdates request", as Telegram does.
/// - `consul`: `GET /v1/kv/app/?recurse=true&index=N&wait=5s` blocks while the index is at most N, then answers the
///   whole prefix (`[{"Key","Value" (base64),"CreateIndex","ModifyIndex",…}]`, 404 when empty) with the index in
///   `X-Consul-Index`. After `rewind(user:to:)` the index goes backwards, as after a snapshot restore.
/// - `couchdb`: `GET /<db>/_changes?feed=longpoll&since=S&timeout=MS&include_docs=true` →
///   `{"results":[{"seq","id","changes":[{"rev"}],"doc"}],"last_seq","pending"}` with CouchDB 2.x's opaque seqs
///   (`"7-g1AAAA…"`); `since=now` starts at the newest, `since=0` at the beginning; a `.duplicate` fault redelivers
///   the last changes again, as a cluster does after a rewound `since`.
public enum APIShape: String, Sendable, Equatable, CaseIterable { case telegram, consul, couchdb }

/// A one-off answer for the next poll of a shape (rate limits, server errors), sent instead of a real one.
public struct CannedAnswer: Sendable {
  public var status: Int32
  public var body: String
  public var headers: [(String, String)]

  public init(status: Int32, body: String, headers: [(String, String)] = []) {
    self.status = status
    self.body = body
    self.headers = headers
  }
}

extension LegacyFixture {
  /// Handles the shapes' paths; false for any other path.
  func routeShape(_ request: HTTPRequest, path: String, parameters: [String: String]) -> Bool {
    if path.hasPrefix("/bot") && path.hasSuffix("/getUpdates") {
      telegramPoll(request, token: String(path.dropFirst(4).dropLast(11)), parameters: parameters)
      return true
    }
    if path == "/v1/kv/app" || path == "/v1/kv/app/" {
      consulPoll(request, parameters: parameters)
      return true
    }
    if path.hasSuffix("/_changes") && path.split(separator: "/").count == 2 {
      couchPoll(request, parameters: parameters)
      return true
    }
    return false
  }

  /// Sends the next canned answer, if one is queued (counted as a poll).
  private func sendCanned(_ request: HTTPRequest) -> Bool {
    guard !cannedAnswers.isEmpty else { return false }
    let canned = cannedAnswers.removeFirst()
    stats.polls += 1
    request.respond(
      status: canned.status, reason: canned.status == 200 ? "OK" : "Error", contentType: "application/json",
      body: canned.body, headers: canned.headers)
    return true
  }

  private func telegramPoll(_ request: HTTPRequest, token: String, parameters: [String: String]) {
    guard token == options.apiKey else {
      stats.unauthorized += 1
      json(request, #"{"ok":false,"error_code":401,"description":"Unauthorized"}"#, status: 401)
      return
    }
    if sendCanned(request) { return }
    guard let offset = Int64(parameters["offset"] ?? "0"), let timeout = Double(parameters["timeout"] ?? "0"),
      timeout >= 0, timeout.isFinite
    else {
      json(request, #"{"ok":false,"error_code":400,"description":"Bad Request: wrong offset or timeout"}"#, status: 400)
      return
    }
    for poll in pending.values where poll.kind == .shape(.telegram) {
      finish(poll) {
        self.json(
          $0,
          #"{"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"}"#,
          status: 409)
      }
    }
    let cursor = offset > 0 ? UInt64(offset - 1) : 0
    park(
      request, kind: .shape(.telegram), token: "telegram", cursors: [(options.userID, cursor)],
      timeout: min(timeout, options.maxPollTimeout), user: options.userID)
  }

  private func consulPoll(_ request: HTTPRequest, parameters: [String: String]) {
    if sendCanned(request) { return }
    guard let index = UInt64(parameters["index"] ?? "0") else {
      request.respondError(status: 400, reason: "Bad Request", message: "Invalid index")
      return
    }
    var wait = 300.0
    if let text = parameters["wait"] {
      let units: [(String, Double)] = [("ms", 0.001), ("s", 1), ("m", 60)]
      guard let unit = units.first(where: { text.hasSuffix($0.0) }),
        let number = Double(text.dropLast(unit.0.count)), number >= 0
      else {
        request.respondError(status: 400, reason: "Bad Request", message: "Invalid wait time")
        return
      }
      wait = min(number * unit.1, 600)
    }
    // index=0 (or none) answers at once; otherwise the query blocks while the index is at most `index`.
    park(
      request, kind: .shape(.consul), token: "consul", cursors: [(options.userID, index)],
      timeout: index == 0 ? 0 : min(wait * 1.0625, options.maxPollTimeout), user: options.userID)
  }

  /// CouchDB 2.x's sequence text for change `n`: the number, a dash, and an opaque blob.
  public static func couchSeq(_ n: UInt64) -> String {
    "\(n)-g1AAAA" + Data("pollcast-fixture-\(n)".utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
  }

  private func couchPoll(_ request: HTTPRequest, parameters: [String: String]) {
    guard parameters["feed"] == "longpoll" else {
      json(request, #"{"error":"bad_request","reason":"this fixture serves feed=longpoll"}"#, status: 400)
      return
    }
    if sendCanned(request) { return }
    let since = parameters["since"] ?? "0"
    var cursor: UInt64
    if since == "now" {
      cursor = store.lastID(options.userID)
    } else if let number = since.split(separator: "-").first.flatMap({ UInt64($0) }),
      since == "0" || since == LegacyFixture.couchSeq(number)
    {
      cursor = number
    } else {
      json(
        request, #"{"error":"bad_request","reason":"Malformed sequence supplied in 'since' parameter."}"#, status: 400)
      return
    }
    cursor = min(cursor, store.lastID(options.userID))
    let timeout = (Double(parameters["timeout"] ?? "60000") ?? 60000) / 1000
    park(
      request, kind: .shape(.couchdb), token: "couchdb", cursors: [(options.userID, cursor)],
      timeout: min(max(0, timeout), options.maxPollTimeout), user: options.userID)
  }

  func shapeBody(_ shape: APIShape, after cursor: UInt64, messages: [MessageStore.Message]) -> String {
    switch shape {
    case .telegram:
      let updates = messages.map { "{\"update_id\":\($0.id),\"message\":\($0.json)}" }
      return "{\"ok\":true,\"result\":[\(updates.joined(separator: ","))]}"
    case .consul:
      let all = store.after(0, user: options.userID, limit: Int.max).suffix(options.pageSize)
      let entries = all.map { message in
        JSONText.object([
          "LockIndex": "0", "Key": JSONText.quoted("app/msg-\(message.id)"), "Flags": "0",
          "Value": JSONText.quoted(Data(message.json.utf8).base64EncodedString()),
          "CreateIndex": String(message.id), "ModifyIndex": String(message.id),
        ])
      }
      return "[\(entries.joined(separator: ","))]"
    case .couchdb:
      let results = messages.map { message in
        let rev = "1-" + String(message.id &* 2_654_435_761 % 0xFFFF_FFFF, radix: 16)
        return JSONText.object([
          "seq": JSONText.quoted(LegacyFixture.couchSeq(message.id)), "id": JSONText.quoted("msg-\(message.id)"),
          "changes": "[{\"rev\":\(JSONText.quoted(rev))}]",
          "doc": JSONText.object([
            "_id": JSONText.quoted("msg-\(message.id)"), "_rev": JSONText.quoted(rev), "message": message.json,
          ]),
        ])
      }
      let last = max(cursor, messages.map(\.id).max() ?? 0)
      return JSONText.object([
        "results": "[\(results.joined(separator: ","))]", "last_seq": JSONText.quoted(LegacyFixture.couchSeq(last)),
        "pending": "0",
      ])
    }
  }

  func respondShape(_ shape: APIShape, _ request: HTTPRequest, body: String) {
    switch shape {
    case .telegram, .couchdb:
      json(request, body)
    case .consul:
      let index = max(1, store.lastID(options.userID))
      let headers = [("X-Consul-Index", String(index)), ("X-Consul-Knownleader", "true")]
      if body == "[]" {
        request.respond(status: 404, reason: "Not Found", body: "", headers: headers)
      } else {
        request.respond(status: 200, reason: "OK", contentType: "application/json", body: body, headers: headers)
      }
    }
  }

  /// Answers the next polls of any shape with `answers`, in order, instead of real answers.
  public func queueCanned(_ answers: [CannedAnswer]) { cannedAnswers += answers }
}
