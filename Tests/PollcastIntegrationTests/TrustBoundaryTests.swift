import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// Nothing a client sends reaches the legacy API unchecked: a credential with control bytes (raw, folded or
/// percent-encoded, in the header, the cookie or the query) is refused with 401 `malformed_credential` before any
/// upstream call, and a capturing loopback server standing in for the legacy API proves that it never receives a
/// split header or a second request.
@Suite(.serialized, .timeLimit(.minutes(5))) struct TrustBoundaryTests {
  /// The issue's exploit: a cookie that ends the Authorization header and appends a whole second request.
  static let smuggledCookie =
    "pollcast_token=x%0D%0AContent-Length%3A%200%0D%0A%0D%0APOST%20%2F_control%2Fkeys%20HTTP%2F1.1%0D%0AHost%3A%20x"
    + "%0D%0AContent-Type%3A%20application%2Fjson%0D%0AContent-Length%3A%2042%0D%0A%0D%0A%7B%22user_id%22%3A%221006"
    + "%22%2C%22api_key%22%3A%22mallory-key%22%7DGET%20%2F_control%2Fstats%20HTTP%2F1.1%0D%0AX-Pad%3A%20"

  /// Requests that each carry a credential with a control byte (or a space) in one source.
  static let hostileRequests: [(String, String)] = [
    ("cookie, the issue's exploit", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: \(smuggledCookie)\r\n\r\n"),
    ("cookie, %0A only", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: pollcast_token=key-1000%0AX-Evil:%201\r\n\r\n"),
    ("cookie, NUL", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: pollcast_token=key-1000%00tail\r\n\r\n"),
    ("cookie, quoted CR", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: pollcast_token=\"a%0Db\"\r\n\r\n"),
    ("cookie, raw tab", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: pollcast_token=key\t1000\r\n\r\n"),
    ("header, encoded", "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k%0D%0AX-Evil: 1\r\n\r\n"),
    ("header, folded line", "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1000\r\n X-Evil: 1\r\n\r\n"),
    ("header, inner space", "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key 1000\r\n\r\n"),
    ("header, DEL", "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key\u{7F}1000\r\n\r\n"),
    // evhttp reads header lines as C strings: without the guard, the key before the NUL was used and sent upstream.
    ("header, raw NUL", "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-1000\u{0}X\r\n\r\n"),
    ("cookie, raw NUL", "GET /events HTTP/1.1\r\nHost: x\r\nCookie: pollcast_token=key-1000\u{0}X\r\n\r\n"),
    (
      "other header, raw ESC",
      "GET /events HTTP/1.1\r\nHost: x\r\nLast-Event-ID: 5\u{1B}[2J\r\nAuthorization: Bearer key-1000\r\n\r\n"
    ),
    ("query, CR LF", "GET /events?access_token=k%0D%0AX-Evil:%201 HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("query, NUL", "GET /events?access_token=key-1000%00x HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("query, plus as space", "GET /events?access_token=key+1000%20x HTTP/1.1\r\nHost: x\r\n\r\n"),
  ]

  /// Sends every hostile request; each must be refused (401 malformed_credential, or 400 where the HTTP parser
  /// already refuses the request) and the legacy API must receive nothing at all.
  func expectNothingReaches(_ capture: CapturingServer, relayPort: Int) throws {
    for (name, request) in Self.hostileRequests {
      // Connection: close, so the exchange ends with the answer.
      let closing = request.replacingOccurrences(of: "Host: x\r\n", with: "Host: x\r\nConnection: close\r\n")
      let answer = try rawExchange(port: relayPort, closing, timeout: 3)
      let status = answer.statuses.first ?? 0
      #expect(status == 401 || status == 400, "\(name): \(answer.text.prefix(200))")
      if status == 401 { #expect(answer.text.contains("malformed_credential"), "\(name): \(answer.text.prefix(300))") }
    }
    let received = String(decoding: capture.receivedBytes, as: UTF8.self)
    #expect(received.isEmpty, "the legacy API received: \(received.prefix(600).debugDescription)")
  }

  @Test(arguments: [CredentialCharset.b64token, .visible])
  func controlBytesInAnyCredentialSourceNeverReachTheLegacyAPI(charset: CredentialCharset) async throws {
    let capture = try CapturingServer(status: 401)
    defer { capture.stop() }
    try await AccountsHarness.start(fixtureURL: capture.url, charset: charset).run { harness in
      try expectNothingReaches(capture, relayPort: harness.port)
      // Teeth: a clean key does reach the stand-in, as exactly one request with exactly the key in its header.
      let clean = try rawExchange(
        port: harness.port,
        "GET /events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nCookie: pollcast_token=key-1000\r\n\r\n",
        timeout: 5)
      #expect(clean.statuses.first == 401)
      let received = capture.received
      #expect(received.count == 1, "\(received.map(\.line))")
      #expect(received.first?.line == "POST /api/session HTTP/1.1")
      #expect(
        received.first?.headers.filter { $0.name.lowercased() == "authorization" }.map(\.value) == ["Bearer key-1000"])
      #expect(received.first?.headers.contains { $0.name.lowercased().hasPrefix("x-") } == false)
    }
  }

  /// `auth.credential_charset = visible` widens the charset for legacy keys to visible ASCII, and such a key is
  /// sent exactly as it is: one header, nothing more.
  @Test func aVisibleASCIIKeyGoesOutAsOneHeaderExactly() async throws {
    let capture = try CapturingServer(status: 401)
    defer { capture.stop() }
    try await AccountsHarness.start(fixtureURL: capture.url, charset: .visible).run { harness in
      let key = "k\"e;y{}%:!"
      let answer = try httpGet(port: harness.port, "/events", headers: [("Authorization", "Bearer \(key)")])
      #expect(answer.status == 401)
      let received = capture.received
      #expect(received.count == 1)
      #expect(
        received.first?.headers.filter { $0.name.lowercased() == "authorization" }.map(\.value) == ["Bearer \(key)"])
      // The default charset refuses the same key before any call.
      #expect(!CredentialCharset.b64token.accepts(key))
    }
  }

  /// The generic adapter puts the credential in a URL template and a header template: the hostile credentials
  /// never get there, and a clean one is percent-encoded in the URL and exact in the header.
  @Test func theGenericAdaptersCredentialTemplatesCarryOnlyCheckedCredentials() async throws {
    let capture = try CapturingServer(status: 401)
    defer { capture.stop() }
    let generic = GenericAdapter.Settings(
      urlTemplate: "\(capture.url)/poll?key={credential}&since={cursor}", headers: ["X-Key: {credential}"],
      timeout: 3)
    try await AccountsHarness.start(generic: generic, charset: .visible).run { harness in
      try expectNothingReaches(capture, relayPort: harness.port)
      let key = "a/b+c=&d"
      _ = try? rawExchange(
        port: harness.port, "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(key)\r\n\r\n", timeout: 2)
      let deadline = MonotonicClock.seconds() + 5
      while capture.received.isEmpty && MonotonicClock.seconds() < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      let first = try #require(capture.received.first)
      #expect(first.line == "GET /poll?key=a%2Fb%2Bc%3D%26d&since=0 HTTP/1.1")
      #expect(first.headers.filter { $0.name == "X-Key" }.map(\.value) == [key])
    }
  }

  /// A key placed in a URL path stays in its segment: `..` or `.` would make `/api/users/../events` (or, normalised,
  /// `/api/events`), which an API may serve for every account. Such a key is refused as a key, nothing is sent for
  /// it, and a plain key still polls its own path.
  @Test func aKeyThatIsADotSegmentNeverMovesThePollToAnotherPath() async throws {
    let capture = try CapturingServer(status: 200, body: "{\"data\":{\"items\":[]}}")
    defer { capture.stop() }
    let generic = GenericAdapter.Settings(
      urlTemplate: "\(capture.url)/api/users/{credential}/events?after={cursor}", eventsPointer: "/data/items",
      timeout: 3)
    try await AccountsHarness.start(generic: generic, charset: .visible).run { harness in
      for key in ["..", ".", "%2e%2e"] {
        _ = try? rawExchange(
          port: harness.port,
          "GET /events HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer \(key)\r\n\r\n", timeout: 1)
      }
      _ = try? rawExchange(
        port: harness.port, "GET /events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice\r\n\r\n", timeout: 1)
      let deadline = MonotonicClock.seconds() + 5
      while !capture.received.contains(where: { $0.line.contains("/alice/") }) && MonotonicClock.seconds() < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      try await Task.sleep(for: .milliseconds(300))
      let lines = capture.received.map(\.line)
      #expect(lines.contains { $0.hasPrefix("GET /api/users/alice/events?after=") })
      // `%2e%2e` is sent encoded (`%252e%252e`): one plain segment of its own.
      let allowed = ["/api/users/alice/events?", "/api/users/%252e%252e/events?"]
      for line in lines {
        #expect(allowed.contains { line.hasPrefix("GET \($0)") }, "the legacy API was asked for \(line)")
      }
    }
  }

  /// The builder is the last step before the wire: a request with a control byte in a header value, the URL or
  /// the method is refused as `unsafeRequest` and not one byte reaches the server, whoever built it.
  @Test func theRequestBuilderRefusesControlBytesBeforeTheWire() async throws {
    let capture = try CapturingServer(status: 200, body: "{}")
    defer { capture.stop() }
    let driver = try await KeptClientDriver.make()
    defer { driver.loop.stop() }
    let hostile: [UpstreamRequest] = [
      UpstreamRequest(url: "\(capture.url)/a", headers: [("X-A", "1\r\nX-B: 2")], label: "t"),
      UpstreamRequest(url: "\(capture.url)/a", headers: [("X-A", "1\n")], label: "t"),
      UpstreamRequest(url: "\(capture.url)/a", headers: [("X-A", "1\u{0}2")], label: "t"),
      UpstreamRequest(url: "\(capture.url)/a", headers: [("X-A\r\nX-B", "1")], label: "t"),
      UpstreamRequest(url: "\(capture.url)/a HTTP/1.1\r\nX-B: 1\r\n\r\nGET /b", label: "t"),
      UpstreamRequest(url: "\(capture.url)/a\u{0}b", label: "t"),
      UpstreamRequest(method: "GET /x HTTP/1.1\r\n", url: "\(capture.url)/a", label: "t"),
    ]
    for request in hostile {
      let outcome = await driver.send(request)
      guard case .failure(let error) = outcome else {
        Issue.record("sent: \(request.url) \(request.headers)")
        continue
      }
      #expect(error.kind == .unsafeRequest, "\(error)")
    }
    #expect(capture.receivedBytes.isEmpty, "\(String(decoding: capture.receivedBytes, as: UTF8.self).debugDescription)")
    // Teeth: a clean request goes through.
    let clean = await driver.send(UpstreamRequest(url: "\(capture.url)/ok", headers: [("X-A", "1\t2")], label: "t"))
    #expect((try? clean.get().status) == 200)
    #expect(capture.received.map(\.line) == ["GET /ok HTTP/1.1"])
  }
}
