import Testing

@testable import PollcastCore

@Suite struct CursorDecisionTests {
  private func recent(_ ids: [UInt64]) -> RecentIDs {
    var set = RecentIDs()
    for id in ids { set.insert(id) }
    return set
  }

  @Test func idsAboveTheCursorAreNewAndResendsBesideThemAreDropped() {
    let decision = CursorDecision.decide(ids: [3, 4, 5, 6, 7], cursor: 5, recent: recent([3, 4, 5]))
    #expect(decision == CursorDecision(backwards: false, fresh: [3, 4]))
  }

  @Test func aRepeatedIdInOneAnswerIsRelayedOnce() {
    #expect(CursorDecision.decide(ids: [6, 6, 7], cursor: 5, recent: recent([])).fresh == [0, 2])
  }

  @Test func anAnswerOfOnlyResendsIsNotARewind() {
    let decision = CursorDecision.decide(ids: [4, 5], cursor: 5, recent: recent([4, 5]))
    #expect(decision == CursorDecision(backwards: false, fresh: []))
  }

  /// After an id of 2^64-1 every ordinary id is at or below the cursor: before, each was dropped as a
  /// "duplicate" forever, with only a counter to show for it.
  @Test func afterTheLargestIdOrdinaryIdsAreFollowedNotDropped() {
    let decision = CursorDecision.decide(ids: [1, 2, 3], cursor: .max, recent: recent([.max]))
    #expect(decision == CursorDecision(backwards: true, fresh: [0, 1, 2]))
  }

  @Test func aRestoredDatabaseThatResendsWhatWasRelayedDropsOnlyThose() {
    let decision = CursorDecision.decide(ids: [8, 9, 10], cursor: 50, recent: recent([9, 50]))
    #expect(decision == CursorDecision(backwards: true, fresh: [0, 2]))
  }

  @Test func recentIdsForgetTheOldestPastTheirCapacity() {
    var ids = RecentIDs()
    for id in 1...UInt64(RecentIDs.capacity + 10) { ids.insert(id) }
    #expect(!ids.contains(1) && !ids.contains(10))
    #expect(ids.contains(11) && ids.contains(UInt64(RecentIDs.capacity + 10)))
  }
}

@Suite struct LogLimiterTests {
  @Test func theFirstLineOfAKindIsWrittenAndRepeatsAreCountedUntilTheWindowEnds() {
    var limiter = LogLimiter(interval: 10)
    #expect(limiter.admit("x", now: 0) == (true, 0))
    for second in 1...5 { #expect(limiter.admit("x", now: Double(second)).write == false) }
    #expect(limiter.admit("y", now: 5) == (true, 0))
    #expect(limiter.admit("x", now: 11) == (true, 5))
    #expect(limiter.admit("x", now: 12).write == false)
  }
}

@Suite struct QueryStringTests {
  @Test(arguments: [
    ("x=1&y", [("x", "1"), ("y", "")]),
    ("stream=101&stream=202", [("stream", "101"), ("stream", "202")]),
    ("a=%41%42&b=c+d&e=%zz&f=%4", [("a", "AB"), ("b", "c d"), ("e", "%zz"), ("f", "%4")]),
    ("&&=&a==b", [("", ""), ("a", "=b")]),
    ("", []),
  ])
  func parsesLikeABrowser(query: String, expected: [(String, String)]) {
    let items = QueryString.parse(query)
    #expect(items.map(\.name) == expected.map(\.0))
    #expect(items.map(\.value) == expected.map(\.1))
  }
}

@Suite struct RepairedTextTests {
  @Test func validTextIsUntouched() {
    let text = RepairedText(Array("héllo".utf8))
    #expect(text.text == "héllo" && text.repairs.isEmpty)
  }

  @Test func eachInvalidSequenceBecomesOneReplacementWhoseOffsetIsKnown() {
    let text = RepairedText([0x61, 0xFF, 0x62, 0xC3, 0x28])
    #expect(text.text == "a\u{FFFD}b\u{FFFD}(")
    #expect(text.repairs == [1, 5])
    #expect(text.repaired(offset: 0, count: 1) == false)
    #expect(text.repaired(offset: 1, count: 3))
    #expect(text.repaired(offset: 4, count: 1) == false)
    #expect(text.repaired(offset: 5, count: 4))
  }

  /// Valid text is recognized by decoding it and comparing the bytes: a U+FFFD the input really holds is not a
  /// repair, and a repair that keeps the length (three invalid bytes, three of U+FFFD) is still one.
  @Test func aRealReplacementCharacterIsNotARepairAndASameLengthRepairIs() {
    let real = RepairedText(Array("a\u{FFFD}b".utf8))
    #expect(real.text == "a\u{FFFD}b" && real.repairs.isEmpty)
    let truncated = RepairedText([0xF0, 0x90, 0x80, 0x61])  // a four-byte sequence cut after three
    #expect(truncated.text.utf8.count == 4)
    #expect(truncated.text == "\u{FFFD}a" && truncated.repairs == [0])
    let empty = RepairedText([])
    #expect(empty.text.isEmpty && empty.repairs.isEmpty)
  }
}

/// Inputs the fuzzers found, kept as regression tests.
@Suite struct FuzzRegressionTests {
  /// `scripts/fuzz.sh` (target sse) in CI: CR runs, a NUL, control characters and invalid UTF-8 in one input.
  static let sseInput: [UInt8] = [
    13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 204, 147, 58, 32, 49, 32, 49, 0, 97, 116, 100, 58, 10,
    97, 97, 116, 97, 58, 32, 110, 117, 108, 32, 105, 100, 10, 10, 0, 10, 100, 97, 116, 97, 58, 32, 110, 117, 108, 40,
    105, 32, 110, 13, 13, 13, 13, 12, 13, 21, 13, 13, 117,
  ]

  @Test func anyDataSurvivesEncodingAndParsing() {
    let data = String(decoding: FuzzRegressionTests.sseInput, as: UTF8.self)
    var parser = SSEParser()
    let events = parser.feed(SSEEncoder.event(id: 42, type: "message", data: data))
    #expect(events.count == 1)
    // Line breaks normalised byte by byte: a CR before a combining mark (U+0313 here) is still a line break.
    var expected: [UInt8] = []
    var previousCR = false
    for byte in data.utf8 {
      if previousCR && byte == 0x0A {
        previousCR = false
        continue
      }
      previousCR = byte == 0x0D
      expected.append(byte == 0x0D ? 0x0A : byte)
    }
    #expect(events.first.map { Array($0.data.utf8) } == expected)
  }

  @Test func parsingDoesNotDependOnHowTheBytesAreSplit() {
    let bytes = FuzzRegressionTests.sseInput
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
    #expect(all == split)
  }
}
