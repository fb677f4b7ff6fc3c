import Foundation
import Testing

@testable import PollcastCore

@Suite struct BackoffTests {
  @Test(arguments: ["abc-._~XYZ09", "101:5,202:7", "a b&c=d/e?f#g", "ключ ✓ 🎉", "%41+", ""])
  func queryValuesAreEncodedAsFoundationWould(_ value: String) {
    var allowed = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    allowed.insert(charactersIn: "-._~")
    #expect(encodeQueryValue(value) == value.addingPercentEncoding(withAllowedCharacters: allowed))
  }

  @Test func ceilingDoublesFromTheBaseUpToTheCap() {
    let backoff = Backoff(base: 2, cap: 30)
    #expect((0..<6).map { backoff.ceiling(attempt: $0) } == [2, 4, 8, 16, 30, 30])
    #expect(backoff.ceiling(attempt: 10_000) == 30)
  }

  @Test func delaysAreFullJitterUniformOverZeroToTheCeiling() {
    // Seeded, so the test is reproducible; 20,000 draws per attempt, 10 equal bins: a chi-square statistic above
    // 27.9 (9 degrees of freedom, p = 0.001) would mean the draws are not uniform.
    var random = SeededRandom(seed: 42)
    for attempt in 0..<5 {
      var backoff = Backoff(base: 2, cap: 30)
      let ceiling = backoff.ceiling(attempt: attempt)
      var bins = [Int](repeating: 0, count: 10)
      var sum = 0.0
      let draws = 20_000
      for _ in 0..<draws {
        backoff.reset()
        for _ in 0..<attempt { _ = backoff.nextDelay(using: &random) }
        let delay = backoff.nextDelay(using: &random)
        #expect(delay >= 0 && delay <= ceiling)
        bins[min(9, Int(delay / ceiling * 10))] += 1
        sum += delay
      }
      let expected = Double(draws) / 10
      let chiSquare = bins.reduce(0.0) { $0 + pow(Double($1) - expected, 2) / expected }
      #expect(chiSquare < 27.9, "attempt \(attempt): bins \(bins)")
      #expect(
        abs(sum / Double(draws) - ceiling / 2) < ceiling * 0.02, "attempt \(attempt): mean \(sum / Double(draws))")
    }
  }

  @Test func resetStartsOverAfterASuccess() {
    var random = SeededRandom(seed: 7)
    var backoff = Backoff(base: 1, cap: 100)
    for _ in 0..<5 { _ = backoff.nextDelay(using: &random) }
    #expect(backoff.attempt == 5)
    backoff.reset()
    #expect(backoff.attempt == 0)
    #expect(backoff.nextDelay(using: &random) <= 1)
  }

  @Test func sameSeedSameDelays() {
    var a = SeededRandom(seed: 1)
    var b = SeededRandom(seed: 1)
    var first = Backoff()
    var second = Backoff()
    #expect((0..<8).map { _ in first.nextDelay(using: &a) } == (0..<8).map { _ in second.nextDelay(using: &b) })
  }
}

@Suite struct RawJSONTests {
  @Test func valuesKeepTheirExactText() throws {
    let document = #"{"101": [ {"id":1201 , "text":"h\u00e9\"llo", "n": 1.50e3} ], "202":[]}"#
    let json = try RawJSON.parse(document)
    let message = try #require(
      json["101"].flatMap { value -> RawJSON? in
        if case .array(let elements) = value.value { return elements.first }
        return nil
      })
    #expect(message.rawText == #"{"id":1201 , "text":"h\u00e9\"llo", "n": 1.50e3}"#)
    #expect(message["id"]?.unsignedID == 1201)
    #expect(message["text"]?.stringValue == "hé\"llo")
    #expect(message["n"]?.rawText == "1.50e3")
  }

  @Test func pointersFollowRFC6901() throws {
    let json = try RawJSON.parse(#"{"data":{"items":[{"seq":5}],"a/b":1,"m~n":2},"":3}"#)
    #expect(json.resolve(pointer: "")?.rawText == json.rawText)
    #expect(json.resolve(pointer: "/data/items/0/seq")?.unsignedID == 5)
    #expect(json.resolve(pointer: "/data/a~1b")?.rawText == "1")
    #expect(json.resolve(pointer: "/data/m~0n")?.rawText == "2")
    #expect(json.resolve(pointer: "/")?.rawText == "3")
    #expect(json.resolve(pointer: "/data/items/1") == nil)
    #expect(json.resolve(pointer: "/data/items/01") == nil)
    #expect(json.resolve(pointer: "data") == nil)
  }

  @Test func surrogatePairsDecode() throws {
    #expect(try RawJSON.parse(#""\ud83d\ude00""#).stringValue == "😀")
  }

  @Test func stringsKeepRunsAroundEscapes() throws {
    #expect(try RawJSON.parse(#""plain ascii, no escape""#).stringValue == "plain ascii, no escape")
    #expect(try RawJSON.parse(#""é中😀""#).stringValue == "é中😀")
    #expect(try RawJSON.parse(#""""#).stringValue == "")
    #expect(try RawJSON.parse(#""\n""#).stringValue == "\n")
    #expect(
      try RawJSON.parse(#""é \"q\" \\ \/ \b\f\n\r\t \u00e9\ud83d\ude00 tail 中""#).stringValue
        == "é \"q\" \\ / \u{08}\u{0C}\n\r\t é😀 tail 中")
    let object = try RawJSON.parse(#"{"k\u0065y":"v\nw","x":"long enough to need storage of its own"}"#)
    #expect(object["key"]?.stringValue == "v\nw")
    #expect(object["x"]?.stringValue == "long enough to need storage of its own")
  }

  @Test(arguments: [
    "", "{", "{\"a\":}", "[1,]", "{\"a\" 1}", "tru", "01", "1.", "-", "\"unterminated", "\"\\x\"", "\"\\ud800\"",
    "{} x", "\"a\u{01}b\"", String(repeating: "[", count: 300) + String(repeating: "]", count: 299),
    String(repeating: "[", count: 300) + String(repeating: "}", count: 300),
  ])
  func malformedDocumentsAreRejected(document: String) {
    #expect(throws: RawJSONError.self) { try RawJSON.parse(document) }
  }

  /// Nesting deeper than the limit no longer fails the document: the deep value is checked without recursion and
  /// marked, so the one message holding it can be skipped while its neighbours are relayed.
  @Test func nestingDeeperThanTheLimitIsMarkedNotFatal() throws {
    let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
    let document = #"{"101":[{"id":1,"text":"a"},{"id":2,"x":"# + deep + #"},{"id":3,"text":"c"}]}"#
    let json = try RawJSON.parse(document)
    #expect(json.poisoned)
    let answer = try ChatAdapter.parsePoll(json)
    #expect(answer.batches.first?.messages.map(\.id) == [1, 3])
    #expect(answer.rejected == [UpstreamRejection(stream: "101", id: 2, reason: "nested deeper than 256 levels")])
    #expect(try !RawJSON.parse(#"{"a":[[1]]}"#).poisoned)
  }

  @Test func invalidUTF8IsRepairedAndTheRepairedMessagesAreKnown() throws {
    let body =
      Array(#"{"101":[{"id":1,"text":"ok"},{"id":2,"text":"bad "#.utf8) + [0xC3, 0x28, 0xFF]
      + Array(#""},{"id":3,"text":"é"}]}"#.utf8)
    let text = RepairedText(body)
    #expect(text.repairs.count == 2)
    let answer = try ChatAdapter.parsePoll(try RawJSON.parse(text.text), text: text)
    let messages = try #require(answer.batches.first?.messages)
    #expect(messages.map(\.id) == [1, 2, 3])
    #expect(messages.map(\.repaired) == [false, true, false])
    #expect(messages[1].raw.contains("\u{FFFD}(\u{FFFD}"))
  }

  @Test func idsAcceptIntegersAndDigitStringsOnly() throws {
    #expect(try RawJSON.parse("42").unsignedID == 42)
    #expect(try RawJSON.parse("\"42\"").unsignedID == 42)
    #expect(try RawJSON.parse("-1").unsignedID == nil)
    #expect(try RawJSON.parse("4.2").unsignedID == nil)
    #expect(try RawJSON.parse("\"4a\"").unsignedID == nil)
    #expect(try RawJSON.parse("null").unsignedID == nil)
  }
}

@Suite struct AdapterParsingTests {
  @Test func chatPollParsesStreamsAndKeepsMessagesVerbatim() throws {
    let answer = try ChatAdapter.parsePoll(
      RawJSON.parse(
        #"{"101":[{"id":3,"text":"a"},{"id":"4","text":"b"}],"202":[],"303":"nope","404":[{"text":"no id"}]}"#))
    #expect(answer.batches.map(\.stream) == ["101", "202", "404"])
    #expect(
      answer.batches[0].messages == [
        .init(id: 3, raw: #"{"id":3,"text":"a"}"#), .init(id: 4, raw: #"{"id":"4","text":"b"}"#),
      ])
    #expect(answer.rejected.count == 2)
  }

  @Test func chatPollOfAnEmptyObjectIsEmpty() throws {
    #expect(try ChatAdapter.parsePoll(RawJSON.parse("{}")).isEmpty)
    #expect(throws: UpstreamError.self) { try ChatAdapter.parsePoll(RawJSON.parse("[]")) }
  }

  @Test func genericFindsEventsAndIdsByPointer() throws {
    let settings = GenericAdapter.Settings(
      urlTemplate: "http://x/{cursor}", eventsPointer: "/data/items", idPointer: "/seq")
    let answer = try GenericAdapter.parse(
      RawJSON.parse(#"{"data":{"items":[{"seq":7,"v":1},{"v":2}]}}"#), settings: settings)
    #expect(answer.batches.first?.messages == [.init(id: 7, raw: #"{"seq":7,"v":1}"#)])
    #expect(answer.rejected.count == 1)
  }

  @Test func genericTakesANonArrayBodyAsOneEventWithTheRootPointer() throws {
    let settings = GenericAdapter.Settings(urlTemplate: "http://x", eventsPointer: "", idPointer: "/id")
    let answer = try GenericAdapter.parse(RawJSON.parse(#"{"id":9,"x":true}"#), settings: settings)
    #expect(answer.batches.first?.messages.map(\.id) == [9])
    let array = try GenericAdapter.parse(RawJSON.parse(#"[{"id":1},{"id":2}]"#), settings: settings)
    #expect(array.batches.first?.messages.map(\.id) == [1, 2])
  }

  @Test func genericPointerToSomethingElseIsADecodingError() {
    let settings = GenericAdapter.Settings(urlTemplate: "http://x", eventsPointer: "/data", idPointer: "/id")
    #expect(throws: UpstreamError.self) { try GenericAdapter.parse(RawJSON.parse(#"{"data":5}"#), settings: settings) }
    #expect(throws: UpstreamError.self) {
      try GenericAdapter.parse(RawJSON.parse(#"{"other":[]}"#), settings: settings)
    }
  }

  @Test func secretsAreRedactedFromURLs() {
    #expect(
      redactURL("http://h/api/messages/poll?token=abc&cursor=101:1&api_key=k")
        == "http://h/api/messages/poll?token=[redacted]&cursor=101:1&api_key=[redacted]")
    #expect(redactURL("http://h/x") == "http://h/x")
    #expect(redactURL("https://user:pa55@legacy.example/api?x=1") == "https://[redacted]@legacy.example/api?x=1")
    #expect(redactURL("http://only-user@h:8080/") == "http://[redacted]@h:8080/")
    #expect(redactURL("http://h/p?q=a@b") == "http://h/p?q=a@b")
    #expect(
      redactURL("http://h/feed?after={cursor}&API_KEY=k&X-Signature=s&access_token=t#frag")
        == "http://h/feed?after={cursor}&API_KEY=[redacted]&X-Signature=[redacted]&access_token=[redacted]#frag")
  }
}

@Suite struct OutgoingRequestTests {
  @Test func templatesEncodeURLValuesAndRefuseControlBytesInHeaderValues() throws {
    #expect(
      try OutgoingRequest.render("http://h/p?k={credential}&c=1", ["credential": "a b\r\n&c"], for: .url)
        == "http://h/p?k=a%20b%0D%0A%26c&c=1")
    #expect(try OutgoingRequest.render("Bearer {credential}", ["credential": "tok"], for: .header) == "Bearer tok")
    for bad in ["a\r\nb", "a\n", "\u{0}", "a\u{7F}", "\u{1B}[31m"] {
      #expect(throws: UpstreamError.self) { try OutgoingRequest.render("X {v}", ["v": bad], for: .header) }
    }
    // An unused placeholder's value is never looked at.
    #expect(try OutgoingRequest.render("plain", ["v": "\r\n"], for: .header) == "plain")
  }

  @Test func configuredHeaderLinesAreSplitAndChecked() throws {
    let (name, value) = try OutgoingRequest.header(line: "X-Api-Key:  abc\tdef ").get()
    #expect(name == "X-Api-Key")
    #expect(value == "abc\tdef")
    for bad in ["no colon", "X-A: 1\r\nX-B: 2", "X A: 1", ": empty name", "X-A: \u{0}"] {
      guard case .failure = OutgoingRequest.header(line: bad) else {
        Issue.record("accepted \(bad.debugDescription)")
        continue
      }
    }
  }

  @Test func everyPartOfARequestIsChecked() {
    let clean = UpstreamRequest(method: "POST", url: "http://h/p?a=1", headers: [("A", "b c")], label: "t")
    #expect(throws: Never.self) { try OutgoingRequest.check(clean) }
    var cases: [UpstreamRequest] = []
    for url in ["http://h/p q", "http://h/p\r\nX: 1", "http://h/\u{0}", "http://h/é"] {
      cases.append(UpstreamRequest(url: url, label: "t"))
    }
    cases.append(UpstreamRequest(method: "GET X", url: "http://h/", label: "t"))
    cases.append(UpstreamRequest(url: "http://h/", headers: [("A", "1\r\n")], label: "t"))
    cases.append(UpstreamRequest(url: "http://h/", headers: [("A:B", "1")], label: "t"))
    for request in cases {
      #expect(throws: UpstreamError.self, "\(request.method) \(request.url) \(request.headers)") {
        try OutgoingRequest.check(request)
      }
    }
  }

  /// RFC 9110's `tchar`, byte by byte: digits, letters and fifteen marks; nothing else of the 256.
  @Test func aTokenByteIsExactlyAnRFC9110Tchar() {
    let marks = Array("!#$%&'*+-.^_`|~".utf8)
    for value in 0...255 {
      let byte = UInt8(value)
      let tchar =
        (0x30...0x39).contains(byte) || (0x41...0x5A).contains(byte) || (0x61...0x7A).contains(byte)
        || marks.contains(byte)
      #expect(OutgoingRequest.isTokenByte(byte) == tchar, "byte 0x\(String(byte, radix: 16))")
      // As a header name's second character (U+0080 and above go as two UTF-8 bytes, neither a tchar).
      let name = "X" + String(Character(Unicode.Scalar(byte)))
      #expect((OutgoingRequest.problem(inHeaderName: name) == nil) == tchar, "byte 0x\(String(byte, radix: 16))")
    }
  }

  @Test func errorSnippetsNeverShowTheRequestsSecrets() {
    let body = Array("bad token tok/en=1 or tok%2Fen=1 for key-1".utf8)
    let response = UpstreamResponse(status: 500, body: body, duration: 0)
    #expect(throws: UpstreamError.self) { try response.requireOK("poll", sessionOn401: true, scrubbing: ["tok/en"]) }
    do {
      try response.requireOK("poll", sessionOn401: true, scrubbing: ["tok/en"])
    } catch {
      #expect(error.cause == "bad token [redacted]=1 or [redacted]=1 for key-1")
    }
    do {
      try response.requireOK("session", sessionOn401: false, scrubbing: nil)
    } catch {
      #expect(!(error.cause ?? "").contains("key-1"))
    }
  }
}

@Suite struct PollSpacingUnitTests {
  @Test func instantEmptyAnswersWaitAtLeastTheMinimumAndGrowWithJitter() {
    var random = SeededRandom(seed: 7)
    var spacing = PollSpacing(minimum: 1, cap: 8)
    // The first: exactly the rest of the minimum interval.
    #expect(spacing.delay(afterPollTaking: 0.1, brought: false, using: &random) == 0.9)
    var ceilings: [Double] = []
    for _ in 0..<6 {
      let delay = spacing.delay(afterPollTaking: 0, brought: false, using: &random)
      #expect(delay >= 1 && delay <= 8)
      ceilings.append(delay)
    }
    #expect(spacing.streak == 7)
    // A held answer (as long as the minimum) resets it; so does an answer that brought something.
    #expect(spacing.delay(afterPollTaking: 1.5, brought: false, using: &random) == 0)
    #expect(spacing.streak == 0)
    _ = spacing.delay(afterPollTaking: 0, brought: false, using: &random)
    #expect(spacing.delay(afterPollTaking: 0, brought: true, using: &random) == 0)
    #expect(spacing.streak == 0)
    var off = PollSpacing(minimum: 0)
    #expect(off.delay(afterPollTaking: 0, brought: false, using: &random) == 0)
  }
}

@Suite struct TextReplacementTests {
  @Test(arguments: [
    ("a-secret-b-secret", "secret", "[x]", "a-[x]-b-[x]"),
    ("aaaa", "aa", "b", "bb"),
    ("nothing here", "secret", "[x]", "nothing here"),
    ("short", "longer than the text", "[x]", "short"),
    ("keep", "", "[x]", "keep"),
    ("ключ ✓ ключ", "ключ", "k", "k ✓ k"),
    ("{cursor}&{cursor}", "{cursor}", "7", "7&7"),
  ])
  func everyOccurrenceIsReplacedLeftToRight(text: String, target: String, replacement: String, expected: String) {
    #expect(text.replacingEvery(target, with: replacement) == expected)
  }

  /// The recipe fuzzer's crash (CI, 2026-12-02): an answer snippet and a secret both holding NUL bytes made
  /// Foundation's replacingOccurrences trap. Redaction is by bytes now, whatever the bytes are.
  @Test func nulAndControlBytesOnEitherSideAreRedactedWithoutATrap() {
    let secret = String(repeating: "\0", count: 35) + "tok\r\nX: 1" + String(repeating: " ", count: 20)
    let body = "{\"errorCode\":401,\"id\0\0\0\":\"" + secret + "\"}" + String(repeating: "\0", count: 40)
    let shown = UpstreamResponse.scrub(body, [secret])
    #expect(!shown.contains("tok\r\nX"))
    #expect(shown.contains("[redacted]"))
    #expect(String(repeating: "\0", count: 64).replacingEvery("\0\0", with: "-") == String(repeating: "-", count: 32))
  }

  /// The byte-level helpers that replaced Foundation's on the recipe's per-answer path keep what it meant there.
  @Test(arguments: [
    (" 42\t", "42"), ("\t \t", ""), ("", ""), ("7", "7"), (" a b ", "a b"), ("\n5\n", "\n5\n"), (" ключ ", "ключ"),
  ])
  func spacesAndTabsAreTrimmedAtBothEnds(text: String, expected: String) {
    #expect(String(text.trimmingSpacesAndTabs) == expected)
    #expect(String(text.dropFirst(0).trimmingSpacesAndTabs) == expected)
  }

  @Test func wildcardSegmentsAndASCIIBytesAreFoundByBytes() throws {
    #expect("/events/*/id".hasWildcardSegment && "/*".hasWildcardSegment)
    #expect(!"/events/a*".hasWildcardSegment && !"*".hasWildcardSegment && !"".hasWildcardSegment)
    let pointer = "/a/b*/*/c"
    let star = try #require(pointer.firstSlashStar)
    #expect(pointer[..<star.lowerBound] == "/a/b*" && pointer[star.upperBound...] == "/c")
    #expect("http://h/p?a=1".containsASCII(UInt8(ascii: "?")) && !"http://h/p".containsASCII(UInt8(ascii: "?")))
    let json = try? RawJSON.parse(#"{"a/b":{"c~d":1},"e":[2]}"#)
    #expect(json?.resolve(pointer: "/a~1b/c~0d")?.rawText == "1")
    #expect(json?.resolve(pointer: "/e/0")?.rawText == "2")
  }
}

@Suite struct KeepAliveTargetTests {
  private func target(_ url: String, method: String = "GET", body: [UInt8]? = nil) -> KeepAliveConnection.Target? {
    KeepAliveConnection.target(for: UpstreamRequest(method: method, url: url, body: body, label: "t"))
  }

  @Test func plainHTTPToAnAddressIsCarriedWithItsPathQueryAndPort() throws {
    let simple = try #require(target("http://127.0.0.1:8080/poll?since=5&key=a%2Fb#frag"))
    #expect(simple.host == "127.0.0.1" && simple.port == 8080)
    #expect(simple.path == "/poll?since=5&key=a%2Fb")
    #expect(simple.authority == "127.0.0.1:8080")
    let bare = try #require(target("HTTP://10.0.0.7"))
    #expect(bare.port == 80 && bare.path == "/")
    let six = try #require(target("http://[::1]:9/x"))
    #expect(six.host == "::1" && six.port == 9 && six.authority == "[::1]:9")
    #expect(target("http://127.0.0.1:1/p", method: "POST", body: [1]) != nil)
  }

  /// A URL with the previous target's origin and a path reuses its host, port and name; anything else is parsed
  /// whole, so a lookalike origin (one more port digit, a query right after the authority) is never reused.
  @Test func aKnownOriginIsReusedOnlyWhenAPathFollowsIt() throws {
    func next(_ url: String, after known: KeepAliveConnection.Target?) -> KeepAliveConnection.Target? {
      KeepAliveConnection.target(for: UpstreamRequest(method: "GET", url: url, label: "t"), after: known)
    }
    let known = try #require(target("http://127.0.0.1:8080/poll?since=1"))
    #expect(known.origin == "http://127.0.0.1:8080")
    let same = try #require(next("http://127.0.0.1:8080/é/poll?since=2#frag", after: known))
    #expect(same.host == "127.0.0.1" && same.port == 8080 && same.authority == "127.0.0.1:8080")
    #expect(same.path == "/é/poll?since=2" && same.origin == known.origin)
    #expect(next("http://127.0.0.1:80801/poll", after: known) == nil)  // port out of range, parsed whole
    #expect(next("http://127.0.0.1:8080?x", after: known) == nil)  // a target must start with "/"
    let other = try #require(next("http://127.0.0.1:808/p", after: known))
    #expect(other.port == 808 && other.path == "/p" && other.origin == "http://127.0.0.1:808")
    let bare = try #require(next("http://127.0.0.1:8080", after: known))
    #expect(bare.path == "/")
    let named = try #require(target("http://api.example:81/a"))
    let again = try #require(next("http://api.example:81/b#x", after: named))
    #expect(again.name == "api.example" && again.host == "api.example" && again.port == 81 && again.path == "/b")
  }

  @Test func edgesOfTheURLAreParsedByBytesWithoutLosingAnything() throws {
    let unicode = try #require(target("http://127.0.0.1:65535/é/𝄞?q=ü#ß"))
    #expect(unicode.port == 65535 && unicode.path == "/é/𝄞?q=ü" && unicode.authority == "127.0.0.1:65535")
    let emptyPort = try #require(target("http://127.0.0.1:/p"))
    #expect(emptyPort.port == 80 && emptyPort.path == "/p")
    let fragmentOnly = try #require(target("http://10.1.2.3#top"))
    #expect(fragmentOnly.host == "10.1.2.3" && fragmentOnly.path == "/")
    let bareSix = try #require(target("http://[2001:db8::5]"))
    #expect(bareSix.host == "2001:db8::5" && bareSix.port == 80 && bareSix.path == "/")
    #expect(target("http://127.0.0.1:123456/p") == nil)
    #expect(target("http://127.0.0.1:-1/p") == nil)
    #expect(target("http://[::1]]/p") == nil)
    #expect(target("http://1.2.3.4é/p") == nil)
  }

  @Test func aNamedHostIsATargetWhoseAddressLibcurlFindsFirst() throws {
    // The name stays in Host; `host` holds the name until UpstreamClient puts the address libcurl reached there.
    let named = try #require(target("http://legacy:8081/poll?since=1"))
    #expect(named.name == "legacy" && named.host == "legacy" && named.port == 8081)
    #expect(named.authority == "legacy:8081" && named.path == "/poll?since=1")
    let dotted = try #require(target("http://api.example/p"))
    #expect(dotted.name == "api.example" && dotted.port == 80)
    #expect(try #require(target("http://127.0.0.1/p")).name == nil)
    #expect(try #require(target("http://[::1]/p")).name == nil)
  }

  @Test func aNameLongerThanDNSAllowsIsLeftToLibcurlWhichRefusesIt() throws {
    // 253 bytes is the longest name DNS carries (four 62-byte labels and a 1-byte one, dots between).
    let longest = Array(repeating: String(repeating: "a", count: 62), count: 4).joined(separator: ".") + ".b"
    #expect(longest.utf8.count == 253)
    let carried = try #require(target("http://\(longest):8081/p"))
    #expect(carried.name == longest && carried.port == 8081)
    #expect(target("http://\(longest)c:8081/p") == nil)
    #expect(target("http://\(String(repeating: "x", count: 10_000))/p") == nil)
  }

  @Test(arguments: [
    "https://127.0.0.1/p", "http://u:p@127.0.0.1/p", "http://api example/p", "http://api$x.example/p",
    "http://127.0.0.1:0/p", "http://127.0.0.1:65536/p", "http://127.0.0.1:8x/p", "http://127.0.0.1?x=1",
    "http://[::1/p", "http://[::1]x/p", "http://999.1.1.1/p", "ftp://127.0.0.1/p", "http://", "http:///p",
    // Found by the fuzzer: a case-folding compare took 0x1A for ":" and 0x0F for "/".
    "http\u{1A}//127.0.0.1:8080/p", "http:\u{0F}\u{0F}127.0.0.1/p",
  ])
  func everythingElseIsLeftToLibcurl(url: String) {
    #expect(target(url) == nil, "\(url)")
  }

  @Test func methodsAndBodiesTheKeptConnectionDoesNotCarryAreLeftToLibcurl() {
    #expect(target("http://127.0.0.1/p", method: "PROPFIND") == nil)
    #expect(target("http://127.0.0.1/p", method: "PATCH") == nil)
    #expect(target("http://127.0.0.1/p", method: "GET", body: [1]) == nil)
    #expect(target("http://127.0.0.1/p", method: "DELETE", body: [1]) == nil)
    #expect(target("http://127.0.0.1/p", method: "DELETE") != nil)
  }
}
