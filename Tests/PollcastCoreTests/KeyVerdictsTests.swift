import Testing

@testable import PollcastCore

/// Per-user relaying's memory of key checks without sockets: refusals expire, the refused set is bounded,
/// accepted keys are filed under their account, and when a key is trusted without asking the legacy API again.
@Suite struct KeyVerdictsTests {
  let salt: (UInt64, UInt64) = (1, 2)
  func digest(_ key: String) -> CredentialDigest { CredentialDigest(key, salt: salt) }

  @Test func aRefusalIsAnsweredFromMemoryUntilItsTimeRunsOut() {
    var verdicts = KeyVerdicts(seconds: 30, refusedCapacity: 10)
    verdicts.refuse(digest("bad"), now: 100)
    let within = verdicts.isRefused(digest("bad"), now: 129.9)
    let other = verdicts.isRefused(digest("other"), now: 110)
    let expired = verdicts.isRefused(digest("bad"), now: 130)
    #expect(within && !other)
    #expect(!expired, "expired at refusal + seconds")
    #expect(verdicts.refusedCount == 0, "an expired refusal is forgotten when asked")
  }

  @Test func theRefusedSetIsBoundedExpiredFirstThenAll() {
    var verdicts = KeyVerdicts(seconds: 10, refusedCapacity: 3)
    verdicts.refuse(digest("a"), now: 0)
    verdicts.refuse(digest("b"), now: 0)
    verdicts.refuse(digest("c"), now: 5)
    // Full: the two expired by now (0 + 10 <= 12) go first, the live one stays.
    verdicts.refuse(digest("d"), now: 12)
    #expect(verdicts.refusedCount == 2)
    let kept = (verdicts.isRefused(digest("c"), now: 12), verdicts.isRefused(digest("d"), now: 12))
    #expect(kept == (true, true))
    verdicts.refuse(digest("e"), now: 12)
    // Full with none expired: all go, and the new one is kept.
    verdicts.refuse(digest("f"), now: 12)
    #expect(verdicts.refusedCount == 1)
    let after = (verdicts.isRefused(digest("f"), now: 12), verdicts.isRefused(digest("c"), now: 12))
    #expect(after == (true, false))
  }

  @Test func anAcceptedKeyIsForgottenOnlyUnderItsOwnAccount() {
    var verdicts = KeyVerdicts(seconds: 30, refusedCapacity: 10)
    verdicts.accept(digest("k"), account: "user:1")
    #expect(verdicts.account(of: digest("k")) == "user:1")
    verdicts.accept(digest("k"), account: "user:2")
    verdicts.forget(digest("k"), of: "user:1")
    #expect(verdicts.account(of: digest("k")) == "user:2", "another account took the key since")
    verdicts.forget(digest("k"), of: "user:2")
    #expect(verdicts.account(of: digest("k")) == nil)
  }

  @Test func aKeyIsTrustedWhilePolledWithOrWithinItsTimeAndOtherwiseRechecked() {
    let verdicts = KeyVerdicts(seconds: 30, refusedCapacity: 10)
    #expect(verdicts.trusts(checkedAt: 0, now: 29, pollsWithIt: false))
    #expect(!verdicts.trusts(checkedAt: 0, now: 30, pollsWithIt: false), "a follower node asks again")
    #expect(verdicts.trusts(checkedAt: 0, now: 3600, pollsWithIt: true), "every poll checks it")
    #expect(!verdicts.recheckDue(checkedAt: 0, now: 29, pollsWithIt: false))
    #expect(verdicts.recheckDue(checkedAt: 0, now: 30, pollsWithIt: false))
    #expect(!verdicts.recheckDue(checkedAt: 0, now: 3600, pollsWithIt: true))
  }

  @Test func digestsAreThirtyTwoHexDigits() {
    for key in ["", "a", "key-1000", String(repeating: "z", count: 500)] {
      let hex = digest(key).hex
      #expect(hex.count == 32 && hex.allSatisfy(\.isHexDigit), "\(hex)")
    }
    #expect(digest("a").hex != digest("b").hex)
  }
}
