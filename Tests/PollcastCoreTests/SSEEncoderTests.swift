import Testing

@testable import PollcastCore

@Suite struct SSEEncoderTests {
  private func roundTrip(_ data: String, type: String? = nil, id: UInt64? = 7) -> SSEParser.Event? {
    var parser = SSEParser()
    let events = parser.feed(SSEEncoder.event(id: id, type: type, data: data))
    #expect(events.count == 1)
    return events.first
  }

  @Test func plainPayloadBecomesOneDataLineWithTheIdBeforeIt() {
    let text = String(decoding: SSEEncoder.event(id: 42, type: nil, data: "hello"), as: UTF8.self)
    #expect(text == "id: 42\ndata: hello\n\n")
  }

  @Test(arguments: ["a\nb", "a\rb", "a\r\nb", "a\n\rb", "\n", "\r\n\r\n", "a\n", "x\r"])
  func everyLineBreakStartsANewDataLineAndNothingEndsTheEventEarly(payload: String) throws {
    let bytes = SSEEncoder.event(id: 1, type: nil, data: payload)
    // Exactly one blank line, at the very end.
    let text = String(decoding: bytes, as: UTF8.self)
    #expect(text.hasSuffix("\n\n"))
    #expect(!String(text.dropLast(2)).contains("\n\n"))
    #expect(!text.contains("\r"))
    let event = try #require(roundTrip(payload, id: 1))
    // Parsers normalise every break to LF.
    let normalised = payload.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
    #expect(event.data == normalised)
  }

  @Test func crlfIsOneBreakNotTwo() throws {
    let text = String(decoding: SSEEncoder.event(id: nil, type: nil, data: "a\r\nb"), as: UTF8.self)
    #expect(text == "data: a\ndata: b\n\n")
  }

  @Test func emptyPayloadStillDispatchesAnEvent() throws {
    let event = try #require(roundTrip(""))
    #expect(event.data == "")
    #expect(event.lastEventID == "7")
  }

  @Test func leadingSpaceInThePayloadIsKept() throws {
    #expect(try #require(roundTrip(" padded")).data == " padded")
    #expect(try #require(roundTrip("  two")).data == "  two")
  }

  @Test func nonASCIITextSurvivesUnchanged() throws {
    let text = "Привет, 世界 — 👋🏽 é"
    #expect(try #require(roundTrip(text)).data == text)
  }

  @Test func payloadThatLooksLikeFieldsCannotInjectThem() throws {
    let event = try #require(roundTrip("x\nid: 999\nevent: evil\n\ndata: y", id: 5))
    #expect(event.lastEventID == "5")
    #expect(event.type == "message")
    #expect(event.data == "x\nid: 999\nevent: evil\n\ndata: y")
  }

  @Test func eventTypeIsWrittenAndStrippedOfLineBreaks() throws {
    let event = try #require(roundTrip("{}", type: "stream-\nattached"))
    #expect(event.type == "stream-attached")
    let plain = String(decoding: SSEEncoder.event(id: 1, type: "message", data: "x"), as: UTF8.self)
    #expect(!plain.contains("event:"))
  }

  @Test(arguments: [UInt64(0), 1, 9, 10, 1_795_000_000_000_000, UInt64.max])
  func idsAreBareDecimalDigits(id: UInt64) {
    let text = String(decoding: SSEEncoder.event(id: id, type: nil, data: "x"), as: UTF8.self)
    #expect(text.hasPrefix("id: \(id)\n"))
  }

  @Test func commentsAndRetryAreNotEvents() {
    var parser = SSEParser()
    let events = parser.feed(SSEEncoder.comment("hi\nthere") + SSEEncoder.retry(milliseconds: 2500))
    #expect(events.isEmpty)
    #expect(parser.retry == 2500)
    #expect(parser.comments == 1)
  }

  @Test func parserHandlesBytesSplitAnywhere() {
    let stream = SSEEncoder.event(id: 1, type: nil, data: "a\r\nb") + SSEEncoder.event(id: 2, type: "x", data: "c")
    for split in 0...stream.count {
      var parser = SSEParser()
      let events = parser.feed(stream[..<split]) + parser.feed(stream[split...])
      #expect(events.map(\.data) == ["a\nb", "c"], "split at \(split)")
    }
  }

  /// A text with nothing to escape is appended whole; one with something to escape goes scalar by scalar. Both must
  /// give JSON that reads back as the text (U+2028 and U+2029 escaped too: JavaScript source forbade them raw).
  @Test(arguments: [
    "plain", "", "a\"b", "back\\slash", "tab\tand\nbreak\r", "\u{01}\u{1F}", "line\u{2028}para\u{2029}", "euro € sign",
    "ünïcödé ✓ 😀", "\u{7F}del",
  ])
  func quotedTextReadsBackAsItself(text: String) throws {
    let quoted = JSONText.quoted(text)
    #expect(quoted.hasPrefix("\"") && quoted.hasSuffix("\""))
    #expect(!quoted.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x2028 || $0.value == 0x2029 })
    #expect(try RawJSON.parse("{\"v\":\(quoted)}")["v"]?.stringValue == text)
    var appended = "x"
    JSONText.appendQuoted(text, to: &appended)
    #expect(appended == "x" + quoted)
    #expect(JSONText.object(["k": quoted, "n": "1"]) == "{\"k\":\(quoted),\"n\":1}")
  }
}

@Suite struct BroadcastBytesTests {
  /// The chunk header is the payload's length in lowercase hex, right-aligned in its slot: every digit count from
  /// one (an empty payload is "0") to six, at each boundary where one more digit is needed.
  @Test(arguments: [0, 1, 9, 10, 15, 16, 255, 256, 4_095, 4_096, 65_536, 1_048_575, 1_048_576])
  func theChunkHeaderIsTheLengthInHex(length: Int) {
    let payload = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31) }
    let bytes = BroadcastBytes(payload)
    #expect(bytes.payload.bytes == payload)
    let expected = Array(String(length, radix: 16).utf8) + [13, 10] + payload + [13, 10]
    #expect(bytes.framed.bytes == expected)
  }
}
