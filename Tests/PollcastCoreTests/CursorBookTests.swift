import Testing

@testable import PollcastCore

/// The worker's cursor rules without sockets: what a preparation changes, what an answer brings, and when a cursor
/// moves (only once its events are stored).
@Suite struct CursorBookTests {
  func message(_ id: UInt64) -> UpstreamMessage { UpstreamMessage(id: id, raw: "{\"n\":\(id)}") }

  func answer(_ batches: [(String, [UInt64])], rejected: [UpstreamRejection] = []) -> UpstreamPollAnswer {
    UpstreamPollAnswer(batches: batches.map { ($0.0, $0.1.map(message)) }, rejected: rejected)
  }

  /// A book that stored `ids` of stream `a` after a first session at `start`.
  func book(start: UInt64 = 0, stored ids: [UInt64] = []) -> CursorBook {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["a"], lastIDs: ["a": start]), startFrom: .latest)
    let plan = book.plan(answer([("a", ids)]))
    book.stored(plan.fresh[...])
    return book
  }

  @Test func theFirstSessionStartsAtTheServersNewestOrAtZeroWithItsBacklog() {
    var latest = CursorBook()
    let changes = latest.apply(
      UpstreamPreparation(streams: ["a", "b"], lastIDs: ["a": 7, "b": 0]), startFrom: .latest)
    #expect(changes == CursorBook.Changes(), "a first session attaches nothing: it starts")
    #expect(latest.cursors == ["a": 7, "b": 0])
    var earliest = CursorBook()
    _ = earliest.apply(UpstreamPreparation(streams: ["a"], lastIDs: ["a": 7]), startFrom: .earliest)
    #expect(earliest.cursors == ["a": 0])
    #expect(earliest.isBacklog(7, stream: "a") && !earliest.isBacklog(8, stream: "a"))
    var sessionless = CursorBook()
    _ = sessionless.apply(
      UpstreamPreparation(streams: ["a"], lastIDs: nil, initialCursors: ["a": 40]), startFrom: .earliest)
    #expect(sessionless.cursors == ["a": 40], "no newest ids: the configured first cursor")
  }

  @Test func aLaterSessionAttachesAndDetachesAndMarksWhatCameMeanwhileAsBacklog() {
    var book = book(start: 5, stored: [6, 7])
    let changes = book.apply(UpstreamPreparation(streams: ["b"], lastIDs: ["b": 3]), startFrom: .earliest)
    #expect(changes.detached == ["a"] && changes.attached == ["b"])
    #expect(book.cursors == ["b": 3], "an attached stream starts at its newest id whatever start_from says")
    var again = self.book(start: 5, stored: [6, 7])
    _ = again.apply(UpstreamPreparation(streams: ["a"], lastIDs: ["a": 12]), startFrom: .latest)
    #expect(again.cursors["a"] == 7, "the cursor stays: 8...12 are polled, not skipped")
    #expect(again.isBacklog(12, stream: "a"))
  }

  @Test func aRestoredPositionTreatsWhatCameMeanwhileAsNews() {
    let stored = book(start: 5, stored: [6, 7]).position!
    var book = CursorBook(restoring: stored)
    _ = book.apply(UpstreamPreparation(streams: ["a"], lastIDs: ["a": 12]), startFrom: .latest)
    #expect(book.cursors["a"] == 7 && !book.isBacklog(12, stream: "a"))
    // The restored page, resent, is recognised as a resend (recent ids travel with the position).
    let plan = book.plan(answer([("a", [6, 7, 8])]))
    #expect(plan.fresh.map(\.message.id) == [8] && plan.duplicates == 2 && !plan.wentBackwards)
  }

  @Test func theServersNewestBelowTheCursorRewindsAndForgetsTheRecentIDs() {
    var book = book(start: 5, stored: [6, 7])
    let changes = book.apply(UpstreamPreparation(streams: ["a"], lastIDs: ["a": 2]), startFrom: .latest)
    #expect(changes.rewinds == [.init(stream: "a", from: 7, to: 2, reason: "upstream_latest_below_cursor")])
    #expect(book.cursors["a"] == 2)
    #expect(book.plan(answer([("a", [3, 6, 7])])).fresh.map(\.message.id) == [3, 6, 7], "the new 6 and 7 are news")
  }

  @Test func aCursorMovesOnlyWhenItsSliceIsStored() {
    var book = book(start: 5)
    let plan = book.plan(answer([("a", [8, 6, 7])]))
    #expect(plan.fresh.map(\.message.id) == [6, 7, 8], "an unsorted answer is relayed in id order")
    #expect(book.cursors(after: plan.fresh[0..<2]) == ["a": 7])
    #expect(book.cursors == ["a": 5], "planning and computing the commit move nothing")
    book.stored(plan.fresh[0..<2])
    #expect(book.cursors == ["a": 7])
    #expect(book.plan(answer([("a", [7, 8])])).fresh.map(\.message.id) == [8], "7 is stored: a resend")
  }

  /// The periodic sync is for a stream gone silent (a restored database that honours the old cursor): an answer
  /// that moved every stream's cursor shows the upstream past each of them.
  @Test func anAnswerMovedEveryStreamOnlyWhenEachCursorMoved() {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["a", "b"], lastIDs: ["a": 5, "b": 0]), startFrom: .latest)
    var before = book.cursors
    #expect(!book.movedEveryStream(since: before), "an empty answer moved nothing")
    let onlyA = book.plan(answer([("a", [6])]))
    book.stored(onlyA.fresh[...])
    #expect(!book.movedEveryStream(since: before), "b stayed where it was")
    before = book.cursors
    let both = book.plan(answer([("a", [7]), ("b", [1])]))
    book.stored(both.fresh[...])
    #expect(book.movedEveryStream(since: before))
    #expect(!CursorBook().movedEveryStream(since: [:]), "no stream: nothing shows the upstream past anything")
  }

  @Test func idsGoingBackwardsAreRelayedAndTheCursorFollowsOnceSettled() {
    var book = book(start: 5, stored: [6, 7, 8])
    let plan = book.plan(answer([("a", [1, 2, 8])]))
    #expect(plan.rewinds == [.init(stream: "a", from: 8, to: 8, reason: "ids_went_backwards")])
    #expect(plan.fresh.map(\.message.id) == [1, 2], "8 was relayed lately: not again")
    book.stored(plan.fresh[...])
    #expect(book.settled(plan) == ["a": 8])
  }

  @Test func poisonWithAnIDMovesTheCursorPastItAndUnknownStreamsAreNamed() {
    var book = book(start: 5)
    let plan = book.plan(
      answer(
        [("a", [6]), ("zz", [1])],
        rejected: [
          UpstreamRejection(stream: "a", id: 9, reason: "not_json"),
          UpstreamRejection(stream: "zz", id: 50, reason: "not_json"),
          UpstreamRejection(stream: "a", id: nil, reason: "no_id"),
        ]))
    #expect(plan.unknownStreams == ["zz"])
    #expect(plan.skipped == ["a": 9], "only polled streams, only ids")
    book.stored(plan.fresh[...])
    let next = book.settled(plan)
    #expect(next == ["a": 9])
    #expect(book.cursors == ["a": 6], "settled cursors move only once stored")
    book.moved(to: next, after: plan)
    #expect(book.cursors == ["a": 9])
  }

  @Test func theBacklogEndsWhenTheCursorReachesItsBound() {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["a", "b"], lastIDs: ["a": 3, "b": 2]), startFrom: .earliest)
    #expect(book.settleBacklog() == ["a": 3, "b": 2])
    let plan = book.plan(answer([("a", [1, 2, 3]), ("b", [1])]))
    book.stored(plan.fresh[...])
    #expect(book.settleBacklog() == ["b": 2])
  }

  @Test func redeliveredEventsAreDroppedByKeyAndOpaqueCursorsMoveWithTheAnswer() {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["c"], lastIDs: nil), startFrom: .latest)
    func keyed(_ id: UInt64, _ key: String) -> UpstreamMessage {
      var message = UpstreamMessage(id: id, raw: "{}")
      message.dedupeKey = key
      return message
    }
    var first = UpstreamPollAnswer(batches: [("c", [keyed(1, "a"), keyed(2, "b"), keyed(3, "a")])])
    first.tokens = ["c": "seq-2", "zz": "unknown stream"]
    let plan = book.plan(first)
    #expect(plan.fresh.map(\.message.id) == [1, 2], "a key twice in one answer is relayed once")
    #expect(plan.tokens == ["c": "seq-2"])
    book.stored(plan.fresh[...], window: 2)
    book.moved(tokens: book.tokens(after: plan))
    #expect(book.tokens == ["c": "seq-2"])
    #expect(book.position?.tokens == ["c": "seq-2"], "stored with the position")
    let again = book.plan(UpstreamPollAnswer(batches: [("c", [keyed(4, "b"), keyed(5, "c")])]))
    #expect(again.fresh.map(\.message.id) == [5] && again.duplicates == 1, "a key stored lately is a redelivery")
  }

  @Test func aResetForgetsTheOldNumberingsDedupeKeys() {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["q"], lastIDs: nil), startFrom: .latest)
    func keyed(_ id: UInt64, _ key: String) -> UpstreamMessage {
      var message = UpstreamMessage(id: id, raw: "{}")
      message.dedupeKey = key
      return message
    }
    let first = book.plan(UpstreamPollAnswer(batches: [("q", [keyed(1, "1000"), keyed(2, "2000")])]))
    book.forgetKeys(resetIn: first)
    book.stored(first.fresh[...])
    // A new queue numbers its events from 1000 again: after its reset, they are news, not redeliveries.
    var renumbered = UpstreamPollAnswer(batches: [("q", [keyed(3, "1000")])])
    renumbered.resets = [UpstreamCursorReset(stream: "q", to: 2, gap: true, reason: "recipe_rules_0")]
    let plan = book.plan(renumbered)
    #expect(plan.fresh.map(\.message.id) == [3] && plan.duplicates == 0)
    book.forgetKeys(resetIn: plan)
    book.stored(plan.fresh[...])
    // Without a reset, the new numbering's keys dedupe again.
    let again = book.plan(UpstreamPollAnswer(batches: [("q", [keyed(4, "1000"), keyed(5, "2000")])]))
    #expect(again.fresh.map(\.message.id) == [5] && again.duplicates == 1, "2000 is not a key of the new queue yet")
  }

  @Test func aResetJudgesTheSameAnswersEventsFromTheResetPoint() {
    var book = CursorBook()
    _ = book.apply(UpstreamPreparation(streams: ["kv"], lastIDs: nil, initialCursors: ["kv": 0]), startFrom: .latest)
    let plan0 = book.plan(answer([("kv", [50])]))
    book.stored(plan0.fresh[...])
    #expect(book.cursors == ["kv": 50])
    // The API's numbering went back to 9: its event 10 is news, and the cursor stands at it once stored.
    var answer = self.answer([("kv", [10])])
    answer.resets = [UpstreamCursorReset(stream: "kv", to: 9, gap: true, reason: "upstream_index_went_backwards")]
    let plan = book.plan(answer)
    #expect(plan.fresh.map(\.message.id) == [10] && !plan.wentBackwards)
    book.stored(plan.fresh[...])
    let next = book.settled(plan)
    #expect(next == ["kv": 10], "the stored event, not the reset point")
    book.moved(to: next, after: plan)
    // A reset without events moves the cursor to its point.
    var bare = UpstreamPollAnswer(batches: [("kv", [])])
    bare.resets = [UpstreamCursorReset(stream: "kv", to: 3, gap: false, reason: "r")]
    let barePlan = book.plan(bare)
    #expect(book.settled(barePlan) == ["kv": 3])
  }
}
