import Testing

@testable import PollcastCore

@Suite struct ResumeDecisionTests {
  let floor: UInt64 = 1000
  let head: UInt64 = 2000

  private func decide(_ requested: String?) -> ResumeDecision {
    ResumeDecision.decide(requested: requested, floorID: floor, headID: head)
  }

  @Test func noIDMeansLiveOnly() {
    #expect(decide(nil) == .live)
    #expect(decide("") == .live)
  }

  @Test func idsFromTheFloorToTheHeadReplay() {
    #expect(decide("1000") == .replay(after: 1000))
    #expect(decide("1500") == .replay(after: 1500))
    #expect(decide("2000") == .replay(after: 2000))
  }

  @Test func idBelowTheFloorIsTooOld() {
    #expect(decide("999") == .reset(.tooOld, requested: "999"))
    #expect(decide("0") == .reset(.tooOld, requested: "0"))
  }

  @Test func idAboveTheHeadIsFromTheFuture() {
    #expect(decide("2001") == .reset(.future, requested: "2001"))
    #expect(decide(String(UInt64.max)) == .reset(.future, requested: String(UInt64.max)))
  }

  @Test(arguments: [
    "abc", "-5", "+5", "12a", " 1500", "1500 ", "15 00", "0x10", "1e3", "1.5", "18446744073709551616",
    "99999999999999999999999", "١٥٠٠",
  ])
  func malformedIDsAreInvalid(value: String) {
    #expect(decide(value) == .reset(.invalid, requested: value))
  }

  @Test func an8KiBValueIsInvalid() {
    let value = String(repeating: "7", count: 8192)
    #expect(decide(value) == .reset(.invalid, requested: value))
  }

  @Test func parseAcceptsTheLargestU64() {
    #expect(ResumeDecision.parseEventID("18446744073709551615") == .max)
    #expect(ResumeDecision.parseEventID("18446744073709551616") == nil)
  }
}
