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
/// - `vk`: VK Bots Long Poll. `GET /method/groups.getLongPollServer?access_token=…` → `{"response":{"key","server",
///   "ts"}}` (`{"error":{…}}` with 200 for a wrong token); `GET /lp/vk?act=a_check&key=K&ts=T&wait=W` →
///   `{"ts":"…","updates":[{"type":"message_new","event_id":…,"object":{…}}]}`, or in a 200 body `{"failed":1,"ts"}`
///   (history lost: go on from `ts`), `{"failed":2}` (key expired), `{"failed":3}` (all lost: new key and ts).
/// - `zulip`: Zulip's real-time events. `POST /api/v1/register` (HTTP Basic `email:api_key`, form `event_types`) →
///   `{"result":"success","queue_id":"…","last_event_id":-1,…}`; `GET /api/v1/events?queue_id=Q&last_event_id=L`
///   → `{"result":"success","events":[{"type":"message","id":…,"message":{…}}]}`, held until news or the hold
///   passes, then answered with a `heartbeat` event, which has an id too. Event ids are the queue's own, signed
///   (-1 before the first), increasing and not consecutive: message k of the queue is `1000·k`, heartbeats take
///   the ids between. `zulipExpireQueue()` garbage-collects the queue: its polls get HTTP 400
///   `{"result":"error","code":"BAD_EVENT_QUEUE_ID",…}` and what happens before the next register is lost.
/// - `dropbox`: Dropbox's list_folder longpoll. `POST /2/files/list_folder/get_latest_cursor` (Bearer key) →
///   `{"cursor"}`; `POST /2/files/list_folder/longpoll` (no auth) with `{"cursor","timeout"}` held until news →
///   `{"changes":true|false}` (with `"backoff": N` once `dropboxBackoff(_:)` asks); `POST
///   /2/files/list_folder/continue` (Bearer) with `{"cursor"}` → `{"entries":[{".tag":"file","name","id","rev",…}],
///   "cursor","has_more"}`, `dropbox.page` entries a page. After `dropboxReset()` an older cursor gets 409
///   `{"error_summary":"reset/…","error":{".tag":"reset"}}`.
/// - `cometd`: Bayeux 1.0 long-polling with the ack extension, at `POST /cometd` (JSON arrays of messages):
///   `/meta/handshake` → `clientId`; `/meta/subscribe` to `/orders/**`; `/meta/connect` held until news, answered
///   with the events (`{"channel":"/orders/new","data":{…},"id":"m<N>"}`) and the connect reply, whose `ext.ack` is the
///   batch id to send back (the newest message id in it); a connect with `ext.ack` N gets what came after batch N.
///   `cometdAdvise(intervalMs:)` puts `advice.interval` in the next connect reply; `cometdDropClient()` forgets the
///   client: its connects get `402::Unknown client` with `advice.reconnect: handshake`.
public enum APIShape: String, Sendable, Equatable, CaseIterable {
  case telegram, consul, couchdb, vk, zulip, dropbox, cometd
}

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
    if path == "/method/groups.getLongPollServer" {
      vkServer(request, parameters: parameters)
      return true
    }
    if path == "/lp/vk" {
      vkPoll(request, parameters: parameters)
      return true
    }
    if path == "/cometd" {
      cometd(request)
      return true
    }
    if path.hasPrefix("/2/files/list_folder/") {
      dropbox(request, call: String(path.dropFirst("/2/files/list_folder/".count)))
      return true
    }
    if path == "/api/v1/register" {
      zulipRegister(request)
      return true
    }
    if path == "/api/v1/events" {
      zulipPoll(request, parameters: parameters)
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

  private func vkServer(_ request: HTTPRequest, parameters: [String: String]) {
    guard parameters["access_token"] == options.apiKey else {
      stats.unauthorized += 1
      json(request, #"{"error":{"error_code":5,"error_msg":"User authorization failed: invalid access_token (4)."}}"#)
      return
    }
    stats.sessions += 1
    vk.lost = false
    json(
      request,
      JSONText.object([
        "response": JSONText.object([
          "key": JSONText.quoted("k\(vk.keyGeneration)"), "server": JSONText.quoted("http://\(address)/lp/vk"),
          "ts": JSONText.quoted(String(store.lastID(options.userID))),
        ])
      ]))
  }

  private func vkPoll(_ request: HTTPRequest, parameters: [String: String]) {
    func failed(_ body: String) {
      stats.polls += 1
      json(request, body)
    }
    let newest = JSONText.object(["failed": "1", "ts": JSONText.quoted(String(store.lastID(options.userID)))])
    if vk.lost { return failed(#"{"failed":3}"#) }
    guard parameters["act"] == "a_check", parameters["key"] == "k\(vk.keyGeneration)" else {
      return failed(#"{"failed":2}"#)
    }
    guard let ts = UInt64(parameters["ts"] ?? ""), ts <= store.lastID(options.userID) else { return failed(newest) }
    if vk.historyLost {
      vk.historyLost = false
      return failed(newest)
    }
    let wait = min(Double(parameters["wait"] ?? "25") ?? 25, 90)
    park(
      request, kind: .shape(.vk), token: "vk", cursors: [(options.userID, ts)],
      timeout: min(wait, options.maxPollTimeout),
      user: options.userID)
  }

  /// The next VK poll answers `{"failed":1}` with the newest ts: what happened since the client's ts is lost.
  public func vkLoseHistory() { vk.historyLost = true }
  /// The VK key expires: polls answer `{"failed":2}` until a new `getLongPollServer`.
  public func vkExpireKey() {
    vk.keyGeneration += 1
    for poll in pending.values where poll.kind == .shape(.vk) { finish(poll) { self.json($0, #"{"failed":2}"#) } }
  }
  /// Everything is lost: polls answer `{"failed":3}` until a new `getLongPollServer`.
  public func vkLoseEverything() {
    vk.lost = true
    vk.keyGeneration += 1
    for poll in pending.values where poll.kind == .shape(.vk) { finish(poll) { self.json($0, #"{"failed":3}"#) } }
  }

  /// Zulip's HTTP Basic check: any email, the fixture's API key as the password.
  private func zulipAuthorized(_ request: HTTPRequest) -> Bool {
    guard let header = request.header("Authorization"), header.hasPrefix("Basic "),
      let decoded = Data(base64Encoded: String(header.dropFirst(6))).map({ String(decoding: $0, as: UTF8.self) }),
      let colon = decoded.firstIndex(of: ":")
    else { return false }
    return decoded[decoded.index(after: colon)...] == options.apiKey
  }

  private func zulipRegister(_ request: HTTPRequest) {
    guard zulipAuthorized(request) else {
      stats.unauthorized += 1
      json(request, #"{"result":"error","msg":"Invalid API key","code":"INVALID_API_KEY"}"#, status: 401)
      return
    }
    guard request.method == .post, request.bodyText.contains("event_types=") else {
      json(request, #"{"result":"error","msg":"Missing 'event_types' argument","code":"BAD_REQUEST"}"#, status: 400)
      return
    }
    stats.sessions += 1
    zulip.generation += 1
    zulip.base = store.lastID(options.userID)
    zulip.heartbeats = 0
    json(
      request,
      JSONText.object([
        "result": JSONText.quoted("success"), "msg": JSONText.quoted(""),
        "queue_id": JSONText.quoted(zulipQueueID), "last_event_id": "-1",
        "event_queue_longpoll_timeout_seconds": "90", "zulip_feature_level": "300",
      ]))
  }

  var zulipQueueID: String { "1517975029:\(zulip.generation)" }

  private func zulipPoll(_ request: HTTPRequest, parameters: [String: String]) {
    guard zulipAuthorized(request) else {
      stats.unauthorized += 1
      json(request, #"{"result":"error","msg":"Invalid API key","code":"INVALID_API_KEY"}"#, status: 401)
      return
    }
    if sendCanned(request) { return }
    guard zulip.generation > 0, parameters["queue_id"] == zulipQueueID else {
      stats.polls += 1
      json(request, zulipBadQueue(parameters["queue_id"] ?? ""), status: 400)
      return
    }
    guard let last = Int64(parameters["last_event_id"] ?? ""), last >= -1 else {
      json(request, #"{"result":"error","msg":"Invalid 'last_event_id'","code":"BAD_REQUEST"}"#, status: 400)
      return
    }
    // Event 1000·k is the queue's message k: the poll wants the messages after the last one at or below `last`.
    let cursor = zulip.base + (last < 0 ? 0 : UInt64(last / 1000))
    park(
      request, kind: .shape(.zulip), token: "zulip", cursors: [(options.userID, cursor)],
      timeout: min(90, options.maxPollTimeout), user: options.userID)
  }

  private func zulipBadQueue(_ queue: String) -> String {
    JSONText.object([
      "result": JSONText.quoted("error"), "msg": JSONText.quoted("Bad event queue ID: \(queue)"),
      "queue_id": JSONText.quoted(queue), "code": JSONText.quoted("BAD_EVENT_QUEUE_ID"),
    ])
  }

  /// Zulip garbage-collects the queue (about 10 minutes without a poll on a real server): held polls and later
  /// ones get `BAD_EVENT_QUEUE_ID` until a new register, which starts after whatever was sent meanwhile.
  public func zulipExpireQueue() {
    let queue = zulipQueueID
    zulip.generation += 1
    for poll in pending.values where poll.kind == .shape(.zulip) {
      finish(poll) { self.json($0, self.zulipBadQueue(queue), status: 400) }
    }
  }

  var cometdClientID: String { "fx\(cometd.generation)c0mEtD" }

  private func cometd(_ request: HTTPRequest) {
    guard request.method == .post, let body = try? RawJSON.parse(request.bodyText),
      case .array(let messages) = body.value,
      !messages.isEmpty
    else {
      request.respondError(status: 400, reason: "Bad Request", message: "expected a JSON array of Bayeux messages")
      return
    }
    var replies: [String] = []
    for message in messages {
      let channel = message["channel"]?.stringValue ?? ""
      let id = message["id"].map { ",\"id\":\($0.rawText)" } ?? ""
      let known = cometd.generation > 0 && message["clientId"]?.stringValue == cometdClientID
      switch channel {
      case "/meta/handshake":
        guard message["supportedConnectionTypes"]?.rawText.contains("long-polling") == true else {
          replies.append(
            #"{"channel":"/meta/handshake","successful":false,"error":"403::Unsupported connection type"}"#)
          continue
        }
        stats.sessions += 1
        cometd.generation += 1
        cometd.base = store.lastID(options.userID)
        cometd.subscribed = false
        replies.append(
          "{\"channel\":\"/meta/handshake\",\"successful\":true,\"version\":\"1.0\",\"clientId\":"
            + "\(JSONText.quoted(cometdClientID)),\"supportedConnectionTypes\":[\"long-polling\"],"
            + "\"advice\":{\"reconnect\":\"retry\",\"interval\":0,\"timeout\":30000},\"ext\":{\"ack\":true}\(id)}")
      case "/meta/subscribe":
        guard known else {
          replies.append(
            #"{"channel":"/meta/subscribe","successful":false,"error":"402::Unknown client","advice":{"reconnect":"handshake","interval":0}}"#
          )
          continue
        }
        let subscription = message["subscription"]?.rawText ?? ""
        cometd.subscribed = subscription.contains("/orders/")
        replies.append(
          "{\"channel\":\"/meta/subscribe\",\"successful\":true,\"subscription\":\(subscription)\(id)}")
      case "/meta/connect":
        guard known else {
          stats.polls += 1
          replies.append(
            #"{"channel":"/meta/connect","successful":false,"error":"402::Unknown client","advice":{"reconnect":"handshake","interval":0}}"#
          )
          continue
        }
        // ext.ack: the last batch (message id) the client received; -1 (or none) before the first.
        // (A number, as CometD's server reads it: a string would not acknowledge anything there; refused here.)
        let ackValue = message["ext"]?["ack"]
        if let ackValue, ackValue.stringValue != nil {
          request.respondError(status: 400, reason: "Bad Request", message: "ext.ack must be a number")
          return
        }
        let ack = ackValue.flatMap { Int64($0.rawText) } ?? -1
        let cursor = ack < 0 ? cometd.base : min(max(UInt64(ack), cometd.base), store.lastID(options.userID))
        guard messages.count == 1 else {
          request.respondError(status: 400, reason: "Bad Request", message: "a connect travels alone")
          return
        }
        park(
          request, kind: .shape(.cometd), token: "cometd", cursors: [(options.userID, cursor)],
          timeout: min(30, options.maxPollTimeout), user: options.userID)
        return
      default:
        replies.append(
          "{\"channel\":\(JSONText.quoted(channel)),\"successful\":false,\"error\":\"400::Unknown channel\"\(id)}")
      }
    }
    json(request, "[\(replies.joined(separator: ","))]")
  }

  /// The next connect reply carries `advice.interval` (milliseconds before the next connect).
  public func cometdAdvise(intervalMs: Int) { cometd.interval = intervalMs }

  /// The server forgets the client (a restart, a timeout): held and later connects answer `402::Unknown client`
  /// with `advice.reconnect: handshake`, and what happens before the next handshake is not kept for it.
  public func cometdDropClient() {
    cometd.generation += 1
    for poll in pending.values where poll.kind == .shape(.cometd) {
      finish(poll) {
        self.json(
          $0,
          #"[{"channel":"/meta/connect","successful":false,"error":"402::Unknown client","advice":{"reconnect":"handshake","interval":0}}]"#
        )
      }
    }
  }

  /// Dropbox's cursor text for the state after message `id` in generation `generation`.
  func dropboxCursor(_ id: UInt64) -> String {
    "AAH" + Data("\(dropbox.generation).\(id)".utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
  }

  /// The message id a cursor of this generation stands at; nil for text that is no cursor, `.max` for one of an
  /// older generation (reset).
  private func dropboxPosition(_ cursor: String) -> UInt64? {
    guard cursor.hasPrefix("AAH") else { return nil }
    var text = String(cursor.dropFirst(3))
    while text.count % 4 != 0 { text += "=" }
    guard let data = Data(base64Encoded: text) else { return nil }
    let parts = String(decoding: data, as: UTF8.self).split(separator: ".")
    guard parts.count == 2, let generation = Int(parts[0]), let id = UInt64(parts[1]) else { return nil }
    return generation == dropbox.generation ? min(id, store.lastID(options.userID)) : .max
  }

  private func dropbox(_ request: HTTPRequest, call: String) {
    let bearer = request.header("Authorization") == "Bearer \(options.apiKey)"
    guard request.method == .post, let body = try? RawJSON.parse(request.bodyText) else {
      request.respond(
        status: 400, reason: "Bad Request", contentType: "text/plain; charset=utf-8",
        body:
          "Error in call to API function \"files/list_folder/\(call)\": request body: could not decode input as JSON")
      return
    }
    if call != "longpoll" && !bearer {
      stats.unauthorized += 1
      json(
        request, #"{"error_summary":"invalid_access_token/..","error":{".tag":"invalid_access_token"}}"#, status: 401)
      return
    }
    if call == "get_latest_cursor" {
      stats.sessions += 1
      json(request, JSONText.object(["cursor": JSONText.quoted(dropboxCursor(store.lastID(options.userID)))]))
      return
    }
    if sendCanned(request) { return }
    guard let text = body["cursor"]?.stringValue, let position = dropboxPosition(text) else {
      json(request, #"{"error_summary":"path/malformed_path/..","error":{".tag":"path"}}"#, status: 409)
      return
    }
    guard position != .max else {
      stats.polls += 1
      json(request, #"{"error_summary":"reset/..","error":{".tag":"reset"}}"#, status: 409)
      return
    }
    switch call {
    case "longpoll":
      let timeout = body["timeout"].flatMap { Double($0.rawText) } ?? 30
      guard (30...480).contains(timeout) else {
        json(request, #"{"error_summary":"invalid_timeout/..","error":{".tag":"other"}}"#, status: 400)
        return
      }
      park(
        request, kind: .shape(.dropbox), token: "dropbox", cursors: [(options.userID, position)],
        timeout: min(timeout, options.maxPollTimeout), user: options.userID)
    case "continue":
      stats.polls += 1
      let page = Array(store.after(position, user: options.userID, limit: dropbox.page))
      let entries = page.map { message in
        JSONText.object([
          ".tag": JSONText.quoted("file"), "name": JSONText.quoted("msg-\(message.id).json"),
          "path_lower": JSONText.quoted("/inbox/msg-\(message.id).json"),
          "path_display": JSONText.quoted("/Inbox/msg-\(message.id).json"),
          "id": JSONText.quoted("id:AAAAAAAAAA\(message.id)"),
          "rev": JSONText.quoted(String(format: "%015llx", message.id &* 0x9E37_79B9)),
          "size": String(message.json.utf8.count), "is_downloadable": "true",
        ])
      }
      let last = page.last?.id ?? position
      json(
        request,
        JSONText.object([
          "entries": "[\(entries.joined(separator: ","))]", "cursor": JSONText.quoted(dropboxCursor(last)),
          "has_more": store.lastID(options.userID) > last ? "true" : "false",
        ]))
    default:
      request.respondError(status: 404, reason: "Not Found", message: "Unknown endpoint")
    }
  }

  /// Dropbox resets the folder's cursors: held longpolls and older cursors get 409 `reset`.
  public func dropboxReset() {
    dropbox.generation += 1
    for poll in pending.values where poll.kind == .shape(.dropbox) {
      finish(poll) { self.json($0, #"{"error_summary":"reset/..","error":{".tag":"reset"}}"#, status: 409) }
    }
  }

  /// The next longpoll answer carries `"backoff": seconds`.
  public func dropboxBackoff(_ seconds: Int) { dropbox.backoff = seconds }

  /// Entries per `continue` page.
  public func dropboxPage(_ entries: Int) { dropbox.page = max(1, entries) }

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
    case .vk:
      let updates = messages.map { message in
        JSONText.object([
          "group_id": "1", "type": JSONText.quoted("message_new"),
          "event_id": JSONText.quoted(String(message.id &* 0x9E37_79B9_7F4A_7C15, radix: 16)),
          "v": JSONText.quoted("5.199"), "object": JSONText.object(["message": message.json]),
        ])
      }
      let last = max(cursor, messages.map(\.id).max() ?? 0)
      return JSONText.object(["ts": JSONText.quoted(String(last)), "updates": "[\(updates.joined(separator: ","))]"])
    case .cometd:
      var replies = (cometd.subscribed ? messages : []).map { message in
        "{\"channel\":\"/orders/new\",\"data\":\(message.json),\"id\":\"m\(message.id)\"}"
      }
      let ack = max(cursor, cometd.subscribed ? (messages.map(\.id).max() ?? 0) : store.lastID(options.userID))
      let interval = cometd.interval ?? 0
      cometd.interval = nil
      replies.append(
        "{\"channel\":\"/meta/connect\",\"successful\":true,\"advice\":{\"reconnect\":\"retry\",\"interval\":"
          + "\(interval),\"timeout\":30000},\"ext\":{\"ack\":\(ack)}}")
      return "[\(replies.joined(separator: ","))]"
    case .dropbox:
      var fields = [("changes", messages.isEmpty ? "false" : "true")]
      if let backoff = dropbox.backoff {
        fields.append(("backoff", String(backoff)))
        dropbox.backoff = nil
      }
      return JSONText.object(fields)
    case .zulip:
      var events = messages.map { message in
        JSONText.object([
          "type": JSONText.quoted("message"),
          "id": String(message.id > zulip.base ? (message.id - zulip.base) * 1000 : 0),
          "message": message.json, "flags": "[]",
        ])
      }
      if !events.isEmpty {
        zulip.heartbeats = 0
      } else {
        // The hold passed: a heartbeat, with the next id between the last message's and the next one's.
        zulip.heartbeats = min(999, zulip.heartbeats + 1)
        let id = (cursor - zulip.base) * 1000 + zulip.heartbeats
        events = [JSONText.object(["type": JSONText.quoted("heartbeat"), "id": String(id)])]
      }
      return JSONText.object([
        "result": JSONText.quoted("success"), "msg": JSONText.quoted(""),
        "events": "[\(events.joined(separator: ","))]", "queue_id": JSONText.quoted(zulipQueueID),
      ])
    }
  }

  func respondShape(_ shape: APIShape, _ request: HTTPRequest, body: String) {
    switch shape {
    case .telegram, .couchdb, .vk, .zulip, .dropbox, .cometd:
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
