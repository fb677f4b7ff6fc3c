// libFuzzer entry point for Pollcast's parsers. Compiled together with PollcastCore's sources into one module by
// scripts/fuzz.sh (swiftc -sanitize=fuzzer,address), so internal types are reachable. The target is chosen by
// POLLCAST_FUZZ_TARGET; each checks properties, not only "no crash".
import Foundation

private let target = ProcessInfo.processInfo.environment["POLLCAST_FUZZ_TARGET"] ?? "rawjson"

@_cdecl("LLVMFuzzerTestOneInput")
public func pollcastFuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> Int32 {
  let bytes = Array(UnsafeBufferPointer(start: data, count: size))
  switch target {
  case "rawjson": FuzzChecks.rawJSON(bytes)
  case "sse": FuzzChecks.sseRoundTrip(bytes)
  case "resume": FuzzChecks.resume(bytes)
  case "query": FuzzChecks.query(bytes)
  case "pointer": FuzzChecks.pointer(bytes)
  case "template": FuzzChecks.template(bytes)
  case "config": FuzzChecks.configuration(bytes)
  case "cursor": FuzzChecks.cursorDecision(bytes)
  case "jwt": FuzzChecks.jwt(bytes)
  case "credential": FuzzChecks.credential(bytes)
  case "store": FuzzChecks.store(bytes)
  case "redis": FuzzChecks.redis(bytes)
  case "recipe": FuzzChecks.recipe(bytes)
  case "target": FuzzChecks.keptTarget(bytes)
  default: fatalError("unknown POLLCAST_FUZZ_TARGET \(target)")
  }
  return 0
}

enum FuzzChecks {
  /// Any URL (any method from the first byte) is either left to libcurl or is a kept-alive target whose parts are
  /// what the URL says: a port in 1...65535, a path that starts with "/" and has no fragment, an authority and a
  /// host found in the URL, an IP address or a name DNS can carry (at most 253 bytes of letters, digits, `-`, `_`
  /// and dots). The URL is scanned by byte offsets: never a crash, whatever the bytes.
  static func keptTarget(_ bytes: [UInt8]) {
    let methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"]
    let method = methods[Int(bytes.first ?? 0) % methods.count]
    let url = String(decoding: bytes.dropFirst(), as: UTF8.self)
    let body: [UInt8]? = (bytes.first ?? 0) & 0x80 != 0 ? [1] : nil
    guard
      let target = KeepAliveConnection.target(for: UpstreamRequest(method: method, url: url, body: body, label: "f"))
    else { return }
    precondition(url.lowercased().hasPrefix("http://"), "a target from a URL that is not plain http")
    precondition(target.port >= 1, "port 0")
    // By bytes, as the request line is sent: "/" and a combining mark are one Character, not a "/" prefix.
    func within(_ part: Substring, _ whole: Substring) -> Bool {
      Array(whole.utf8).firstRange(of: Array(part.utf8)) != nil
    }
    precondition(
      target.path.utf8.first == UInt8(ascii: "/") && !target.path.utf8.contains(UInt8(ascii: "#")),
      "a path that is not a request target")
    precondition(
      within(target.authority, Substring(url)) && !target.authority.utf8.contains(UInt8(ascii: "@")),
      "an authority not in the URL")
    precondition(
      !target.host.isEmpty && within(Substring(target.host), target.authority), "a host not in the authority")
    if let name = target.name {
      precondition(name == target.host && name.utf8.count <= 253, "a name longer than DNS carries")
      precondition(
        name.utf8.allSatisfy {
          $0 == 0x2D || $0 == 0x2E || $0 == 0x5F || (0x30...0x39).contains($0) || (0x41...0x5A).contains($0)
            || (0x61...0x7A).contains($0)
        },
        "a name with a byte DNS does not carry")
    } else {
      precondition(KeepAliveConnection.isAddress(target.host), "neither a name nor an address")
    }
    if body != nil { precondition(method == "POST" || method == "PUT", "a body on a method that does not carry one") }
  }

  /// A recipe (before the first NUL byte) and a value and an answer body (after it). Any recipe either parses or
  /// fails with problems each named by its path; a parsed one's poll, built with the value in every placeholder
  /// (session values, the credential, the environment, an opaque cursor), either is refused or passes the one
  /// CR/LF-safe check and carries no control byte in its URL or headers; and any answer is interpreted without a
  /// crash, its events numbered and sorted as the cursor book needs.
  static func recipe(_ bytes: [UInt8]) {
    let split = bytes.firstIndex(of: 0) ?? bytes.count
    let text = String(decoding: bytes[..<split], as: UTF8.self)
    let rest = split < bytes.count ? Array(bytes[(split + 1)...]) : []
    let value = String(decoding: rest.prefix(64), as: UTF8.self)
    let body = Array(rest.dropFirst(min(64, rest.count)))
    let environment = [
      "ETCD_URL": "http://127.0.0.1:1", "TELEGRAM_TOKEN": value, "CONSUL_TOKEN": value, "X": value,
    ]
    let parsed = Recipe.parse(text, context: Recipe.Context(environment: environment, hasCredential: true))
    let recipe: Recipe
    switch parsed {
    case .failure(let error):
      precondition(!error.problems.isEmpty)
      for problem in error.problems { precondition(problem.hasPrefix("recipe"), "unnamed problem: \(problem)") }
      return
    case .success(let ok): recipe = ok
    }
    var scope = RecipeScope()
    scope.values = recipe.vars
    for step in recipe.session { for (name, _) in step.extract { scope.values[name] = RecipeValue(text: value) } }
    scope.environment = environment
    scope.credential = value
    scope.cursor = UInt64(rest.count)
    scope.opaque = recipe.cursor.opaque
    scope.token = recipe.cursor.opaque ? value : nil
    scope.cursorList = recipe.isMultiStream ? "\(value):\(rest.count)" : nil
    // The fetch step (when there is one) is built and read like the poll, chosen by the first body byte.
    let fetching = recipe.fetch != nil && (rest.first ?? 0) & 0x80 != 0
    func checkRequest(_ step: Recipe.Step, _ label: String) {
      guard
        let request = try? RecipeRequest.build(step, scope, recipe: recipe, timeout: 5, connectTimeout: 1, label: label)
      else { return }
      do {
        try OutgoingRequest.check(request)
        for (name, headerValue) in request.headers {
          precondition(!name.utf8.contains { $0 < 0x21 } && !headerValue.utf8.contains { $0 == 0x0D || $0 == 0x0A })
        }
        precondition(!request.url.utf8.contains { $0 <= 0x20 })
      } catch {
        precondition(error.kind == .unsafeRequest)
      }
    }
    checkRequest(fetching ? recipe.fetch! : recipe.poll, fetching ? "fetch" : "poll")
    let answer = RepairedText(body)
    if let sync = recipe.sync {
      // The cursor sync: its request passes the same check, and any answer gives an id for every stream or an error.
      checkRequest(sync.step, "sync")
      let streams = [value, "101"]
      let ids = RecipeAnswer.interpretSync(
        status: [200, 401, 503][Int(rest.first ?? 0) % 3], headers: [("Retry-After", value)], text: answer,
        json: try? RawJSON.parse(answer.text), recipe: recipe, scope: scope, streams: streams)
      if case .success(let found) = ids {
        precondition(streams.allSatisfy { found[$0] != nil }, "a stream without an id")
      }
    }
    let verdict = RecipeAnswer.interpretPoll(
      status: [200, 204, 400, 401, 429, 503][Int(rest.first ?? 0) % 6],
      headers: [("X-Etcd-Index", value), ("Retry-After", value), ("Last-Modified", value), ("Etag", value)],
      text: answer, json: try? RawJSON.parse(answer.text), recipe: recipe, scope: scope,
      step: fetching ? "fetch" : "poll")
    if verdict.more { precondition(fetching, "only a fetch step's answer asks to fetch again") }
    if case .fetch = verdict.action { precondition(!fetching && recipe.fetch != nil, "only a poll leads to a fetch") }
    if let after = verdict.after { precondition(after >= 0) }
    if case .answer(let parsedAnswer) = verdict.action, !recipe.cursor.opaque {
      for batch in parsedAnswer.batches {
        precondition(zip(batch.messages, batch.messages.dropFirst()).allSatisfy { $0.id <= $1.id })
      }
      precondition(Set(parsedAnswer.batches.map(\.stream)).count == parsedAnswer.batches.count, "one batch a stream")
    }
    if case .error(let error) = verdict.action, let delay = error.retryAfter { precondition(delay >= 0) }
  }

  /// What a relay reads from Redis and its configuration (`store.kind = redis`): any URL parses or is refused
  /// with a reason; any position text decodes to a position that encodes back to the same, or is refused; any
  /// stream entries (ids and fields from the input) load as ascending events whose bytes carry their ids, or are
  /// refused as corrupt. Never a crash.
  static func redis(_ bytes: [UInt8]) {
    let text = String(decoding: bytes, as: UTF8.self)
    switch RedisAddress.parse(text) {
    case .success(let address):
      precondition((1...65535).contains(address.port) && address.database >= 0, "parsed an invalid address")
    case .failure(let problem):
      precondition(!problem.description.isEmpty, "a refusal without a reason")
    }
    if let position = RedisEventStore.decodePosition(text) {
      precondition(
        RedisEventStore.decodePosition(RedisEventStore.encodePosition(position)) == position, "position round trip")
    }
    // Entries: the input split at NUL bytes, each "<id>-0 <data>" (the data after the first space, as bytes).
    var entries: [RedisReply] = []
    for line in bytes.split(separator: 0x00, omittingEmptySubsequences: false).prefix(64) {
      let space = line.firstIndex(of: 0x20) ?? line.endIndex
      let data = Array(line[space...].dropFirst())
      entries.append(
        .array([
          .string(Array(line[..<space])),
          .array([.string(Array("d".utf8)), .string(data), .string(Array("u".utf8)), .string(data)]),
        ]))
    }
    let store = RedisEventStore(address: RedisAddress(), logger: Logger(label: "fuzz", level: .critical))
    guard let events = try? store.parseEntries(.array(entries)) else { return }
    var previous: UInt64?
    for event in events {
      precondition(previous.map { event.id > $0 } ?? true, "entries out of order")
      precondition(StoredEvent.isFrame(id: event.id, event.bytes.bytes), "an entry's bytes name another id")
      previous = event.id
    }
  }

  /// Any file handed to the SQLite store opens as a store or fails with a `StoreError` (never a crash, never an
  /// empty start). What loads is consistent (ids increasing, at or below the head, each event's bytes carrying its
  /// id), and a commit above the loaded head is read back after it.
  static func store(_ bytes: [UInt8]) {
    let path = NSTemporaryDirectory() + "pollcast-fuzz-store-\(getpid()).db"
    for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) }
    guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { return }
    guard let store = try? SQLiteEventStore.open(path: path) else { return }
    defer { store.close() }
    let loaded: StoredFeed?
    do {
      loaded = try store.load(feed: "shared")
    } catch {
      return
    }
    let head = loaded?.headID ?? 0
    var previous: UInt64?
    for event in loaded?.events ?? [] {
      precondition(event.id <= head && previous.map { event.id > $0 } ?? true, "loaded ids out of order")
      previous = event.id
    }
    guard head < UInt64(Int64.max) - 1 else { return }
    let id = head + 1
    let event = StoredEvent(
      id: id, stream: "s", upstreamID: 1, unixTime: 0, bytes: ByteSlice(SSEEncoder.event(id: id, type: nil, data: "x")))
    let done = DispatchSemaphore(value: 0)
    let committed = Locked(false)
    store.commit(
      StoreBatch(
        feed: "shared", events: [event], position: FeedPosition(streams: ["s"], cursors: ["s": 1]), headID: id,
        floorID: loaded?.floorID ?? 0)
    ) { result in
      if case .success = result { committed.withLock { $0 = true } }
      done.signal()
    }
    done.wait()
    guard committed.withLock({ $0 }), let again = try? store.load(feed: "shared") else { return }
    precondition(again.headID >= id && again.events.last?.id == id, "a commit was not read back")
  }

  /// CRLF and lone CR become LF, byte by byte, as SSE reads line breaks. (Foundation's replacingOccurrences works on
  /// characters and leaves a CR alone when a combining mark follows it: the first fuzz run tripped on exactly that.)
  static func normalisingLineBreaks(_ text: String) -> [UInt8] {
    var out: [UInt8] = []
    var previousCR = false
    for byte in text.utf8 {
      if previousCR && byte == 0x0A {
        previousCR = false
        continue
      }
      previousCR = byte == 0x0D
      out.append(byte == 0x0D ? 0x0A : byte)
    }
    return out
  }

  /// The parser never crashes; what it accepts keeps its exact bytes, and the adapters take it without trapping.
  static func rawJSON(_ bytes: [UInt8]) {
    let text = RepairedText(bytes)
    guard let json = try? RawJSON.parse(text.text) else { return }
    let trimmed = text.text.trimmingCharacters(in: CharacterSet(charactersIn: " \t\r\n"))
    precondition(json.rawText == trimmed, "root value lost bytes")
    _ = try? ChatAdapter.parsePoll(json, text: text)
    _ = try? GenericAdapter.parse(
      json, settings: .init(urlTemplate: "http://x/{cursor}", eventsPointer: "/data/items", idPointer: "/seq"),
      text: text)
  }

  /// Any data survives encoding and parsing, with line breaks normalised to LF; parsing raw bytes gives the same
  /// events however they are split into reads.
  static func sseRoundTrip(_ bytes: [UInt8]) {
    let data = String(decoding: bytes, as: UTF8.self)
    var parser = SSEParser()
    let events = parser.feed(SSEEncoder.event(id: 42, type: "message", data: data))
    precondition(events.count == 1, "one event in, \(events.count) out")
    precondition(Array(events[0].data.utf8) == FuzzChecks.normalisingLineBreaks(data), "data changed in the round trip")
    precondition(events[0].lastEventID == "42")
    var whole = SSEParser()
    let all = whole.feed(bytes)
    var pieces = SSEParser()
    var split: [SSEParser.Event] = []
    var index = 0
    var step = 1
    while index < bytes.count {
      let end = min(bytes.count, index + step)
      split += pieces.feed(bytes[index..<end])
      index = end
      step = step % 7 + 1
    }
    precondition(all == split, "events depend on how the bytes were split")
  }

  /// A strict u64: what parses prints back as the same digits (no sign, no spaces, no overflow).
  static func resume(_ bytes: [UInt8]) {
    let text = String(decoding: bytes, as: UTF8.self)
    if let id = ResumeDecision.parseEventID(text) {
      precondition(text.utf8.allSatisfy { $0 >= 0x30 && $0 <= 0x39 } && UInt64(text) == id, "accepted \(text)")
    } else {
      // Refused: not digits only (Swift's own parser takes "+5" and "-0"), more than 20 of them, or too large.
      precondition(UInt64(text) == nil || "+-".contains(text.first ?? " ") || text.utf8.count > 20, "refused \(text)")
    }
    let floor = UInt64(bytes.count)
    let head = floor &* 3
    switch ResumeDecision.decide(requested: text, floorID: floor, headID: head) {
    case .replay(let after): precondition(after >= floor && after <= head)
    case .live: precondition(text.isEmpty)
    case .reset: break
    }
  }

  /// Parsing never fails; percent-encoding what came out and parsing again gives the same pairs.
  static func query(_ bytes: [UInt8]) {
    let text = String(decoding: bytes, as: UTF8.self)
    let items = QueryString.parse(text)
    let again = items.map { "\(encodeQueryValue($0.name))=\(encodeQueryValue($0.value))" }.joined(separator: "&")
    let reparsed = QueryString.parse(again)
    precondition(reparsed.count == items.count, "pair count changed")
    for (a, b) in zip(items, reparsed) { precondition(a.name == b.name && a.value == b.value, "pair changed") }
  }

  /// The bytes up to the first NUL are a document, the rest a pointer: resolving never traps.
  static func pointer(_ bytes: [UInt8]) {
    let split = bytes.firstIndex(of: 0) ?? bytes.count
    guard let json = try? RawJSON.parse(String(decoding: bytes[..<split], as: UTF8.self)) else { return }
    let pointer = String(decoding: bytes[min(bytes.count, split + 1)...], as: UTF8.self)
    if let found = json.resolve(pointer: pointer) { _ = found.rawText }
    precondition(json.resolve(pointer: "")?.rawText == json.rawText)
  }

  /// Placeholders are always replaced; the cursor is the first 8 bytes.
  static func template(_ bytes: [UInt8]) {
    var cursor: UInt64 = 0
    for byte in bytes.prefix(8) { cursor = cursor << 8 | UInt64(byte) }
    let template = String(decoding: bytes.dropFirst(8), as: UTF8.self)
    let url = GenericAdapter.url(template: template, cursor: cursor)
    if !template.contains("{") { precondition(url == template) }
    if template == "{next}" { precondition(url == String(cursor == .max ? cursor : cursor + 1)) }
    // The builder: a value placed in a URL never brings a control byte or space; one placed in a header is placed
    // as it is or refused, and whatever is not refused passes the last check before the wire.
    let value = String(decoding: bytes.prefix(16), as: UTF8.self)
    if let placed = try? OutgoingRequest.render("http://h/?v={v}", ["v": value], for: .url) {
      precondition(OutgoingRequest.problem(inURL: placed) == nil, "a URL value brought a control byte")
    }
    if let header = try? OutgoingRequest.render("Bearer {v}", ["v": value], for: .header) {
      precondition(!header.utf8.contains(0x0A) && !header.utf8.contains(0x0D), "a header value with CR or LF")
      do {
        try OutgoingRequest.check(UpstreamRequest(url: "http://h/", headers: [("X", header)], label: "fuzz"))
      } catch {
        preconditionFailure("a rendered header was refused at the wire: \(error)")
      }
    }
    if case .success(let (name, headerValue)) = OutgoingRequest.header(line: template) {
      precondition(OutgoingRequest.problem(inHeaderName: name) == nil)
      precondition(OutgoingRequest.problem(inHeaderValue: headerValue, "v") == nil)
    }
    // A key placed in a URL path stays in its segment: the path keeps the template's segments, and the key's is
    // never empty, `.` or `..` (it is refused instead).
    var scope = RecipeScope()
    scope.credential = value
    if let placed = try? RecipeTemplate("http://h/users/{credential}/events?x=1").render(scope, .url) {
      let path = placed.dropFirst("http://h".count).prefix { $0 != "?" }
      let segments = path.split(separator: "/", omittingEmptySubsequences: false)
      precondition(segments.count == 4 && segments[1] == "users" && segments[3] == "events", "left its segment")
      let own = segments[2].removingPercentEncoding ?? String(segments[2])
      precondition(!["", ".", ".."].contains(own), "a dot or empty segment: \(placed)")
    }
    // Redaction hides a secret in every text, whatever surrounds it.
    let secret = String(decoding: bytes.dropFirst(8).prefix(12), as: UTF8.self)
    if !secret.isEmpty, !secret.contains("["), !secret.contains("]"), !"redacted".contains(secret) {
      let shown = UpstreamResponse.scrub(template, [secret, String(secret.prefix(3))])
      let hay = Array(shown.utf8)
      let needle = Array(secret.utf8)
      let found =
        hay.count >= needle.count
        && (0...(hay.count - needle.count)).contains { hay[$0..<$0 + needle.count].elementsEqual(needle) }
      precondition(!found, "a secret shown")
    }
  }

  static let jwtSettings = JWTSettings(
    algorithm: .hs256, keys: ["": Array("0123456789abcdef0123456789abcdef".utf8)], audience: "fuzz", leeway: 30)

  /// Any bytes as a token: refused with a reason (a forged signature never verifies), never a crash; any bytes as
  /// claims JSON: claims or a reason, and granted streams are never empty names.
  static func jwt(_ bytes: [UInt8]) {
    let text = String(decoding: bytes, as: UTF8.self)
    if case .success = JWTVerifier.checkSignature(text, settings: jwtSettings) {
      preconditionFailure("a token verified without the key")
    }
    let verifier = JWTVerifier(settings: jwtSettings)
    _ = verifier.verify(text, now: 1_800_000_000)
    precondition(verifier.cached(text, now: 1_800_000_000) != nil || text.utf8.count > 2048, "not cached")
    guard let json = try? RawJSON.parse(text) else { return }
    if case .success(let claims) = JWTVerifier.claims(from: json, audience: "fuzz") {
      precondition(claims.streams?.contains("") != true, "an empty stream name was granted")
      precondition(claims.expiresAt.isFinite)
    }
  }

  /// Header values split at NULs: Authorization, Cookie, X-Forwarded-For, a trusted block. Extraction and address
  /// resolution never trap; a resolved address is the peer or parses as an address.
  static func credential(_ bytes: [UInt8]) {
    let parts = bytes.split(separator: 0, omittingEmptySubsequences: false).map {
      String(decoding: $0, as: UTF8.self)
    }
    func part(_ index: Int) -> String? { index < parts.count ? parts[index] : nil }
    if let found = CredentialExtractor.extract(
      authorization: part(0), cookie: part(1), query: [("access_token", part(2) ?? "")], cookieName: "pollcast_token",
      allowQuery: true)
    {
      precondition(!found.credential.isEmpty, "an empty credential")
    }
    // Whatever the sources hold, a credential that passes its charset never carries a control byte or a space, and
    // the header built from it is one header line.
    for charset in CredentialCharset.allCases {
      let lookup = CredentialExtractor.lookup(
        authorization: part(0), cookie: part(1), query: [("access_token", part(2) ?? "")], cookieName: "pollcast_token",
        allowQuery: true, charset: charset)
      guard case .found(let credential, _) = lookup else { continue }
      precondition(credential.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F }, "a credential with a control byte or space")
      let request = UpstreamRequest(
        url: "http://h/p?k=" + encodeQueryValue(credential), headers: [("Authorization", "Bearer \(credential)")],
        label: "fuzz")
      do { try OutgoingRequest.check(request) } catch {
        preconditionFailure("a checked credential was refused: \(error)")
      }
    }
    let blocks = [part(4), "127.0.0.1", "10.0.0.0/8"].compactMap { $0.flatMap(AddressBlock.init) }
    let resolver = ClientAddressResolver(trusted: blocks)
    let address = resolver.resolve(peer: "127.0.0.1", forwardedFor: part(3))
    precondition(address == "127.0.0.1" || AddressBlock.parse(address) != nil, "resolved to \(address)")
    for block in blocks { _ = block.contains(part(3) ?? "") }
  }

  /// Any file text gives a configuration or a list of problems, never a crash.
  static func configuration(_ bytes: [UInt8]) {
    let text = String(decoding: bytes, as: UTF8.self)
    do {
      let configuration = try ConfigurationLoader().load(
        fileText: text, fileName: "fuzz.json", environment: [:], overrides: [])
      _ = configuration.problems()
      _ = configuration.redacted
    } catch {
      precondition(!error.problems.isEmpty, "an error without a problem")
    }
  }

  /// What is relayed is strictly increasing; without a rewind it is all above the cursor.
  static func cursorDecision(_ bytes: [UInt8]) {
    var words: [UInt64] = []
    var index = 0
    while index + 2 <= bytes.count {
      words.append(UInt64(bytes[index]) << 8 | UInt64(bytes[index + 1]))
      index += 2
    }
    guard let cursor = words.first else { return }
    var recent = RecentIDs()
    for id in words.dropFirst().prefix(4) { recent.insert(id) }
    let ids = Array(words.dropFirst(5)).sorted()
    let decision = CursorDecision.decide(ids: ids, cursor: cursor, recent: recent)
    let fresh = decision.fresh.map { ids[$0] }
    precondition(zip(fresh, fresh.dropFirst()).allSatisfy { $0 < $1 }, "relayed ids not increasing")
    if !decision.backwards { precondition(fresh.allSatisfy { $0 > cursor }, "relayed an id at or below the cursor") }
    if decision.backwards { precondition(!ids.contains { $0 > cursor }) }
  }
}
