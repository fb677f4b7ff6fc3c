import Foundation

/// What per-user relaying remembers of the keys it checked with the legacy API, by digest only (never the key):
/// refused keys until their cache time runs out (a retry costs no legacy call), and which account each accepted
/// key of an active account belongs to. A plain value: `AccountHub` asks it before any upstream call, and its
/// rules are unit-tested without sockets (`KeyVerdictsTests`).
struct KeyVerdicts {
  /// How long a refusal is answered from memory, and an accepted key trusted before a new connection checks it
  /// again.
  let seconds: Double
  /// Refused keys remembered at most; past it the expired go first, then all (a flood of random keys cannot grow
  /// memory without bound, and forgetting a refusal only costs a legacy call).
  let refusedCapacity: Int
  private var refused: [CredentialDigest: Double] = [:]
  private var accepted: [CredentialDigest: String] = [:]

  init(seconds: Double, refusedCapacity: Int) {
    self.seconds = seconds
    self.refusedCapacity = max(1, refusedCapacity)
  }

  var refusedCount: Int { refused.count }

  /// Whether `digest` was refused within `seconds` before `now` (an expired refusal is forgotten).
  mutating func isRefused(_ digest: CredentialDigest, now: Double) -> Bool {
    guard let until = refused[digest] else { return false }
    if until > now { return true }
    refused[digest] = nil
    return false
  }

  mutating func refuse(_ digest: CredentialDigest, now: Double) {
    if refused.count >= refusedCapacity {
      refused = refused.filter { $0.value > now }
      if refused.count >= refusedCapacity { refused.removeAll(keepingCapacity: true) }
    }
    refused[digest] = now + seconds
  }

  /// The account an accepted key belongs to, while that account is active.
  func account(of digest: CredentialDigest) -> String? { accepted[digest] }

  mutating func accept(_ digest: CredentialDigest, account: String) { accepted[digest] = account }

  /// Forgets an accepted key, only if it is filed under `account` (another account may have taken it since).
  mutating func forget(_ digest: CredentialDigest, of account: String) {
    if accepted[digest] == account { accepted[digest] = nil }
  }

  /// Whether a key accepted at `checkedAt` is still trusted at `now` without a legacy call: within `seconds`, or
  /// for as long as this node polls with it (every poll checks it, and a refusal stops the loop and forgets it). A
  /// node that only follows another's polling never sees its key checked, so it asks again after `seconds`.
  func trusts(checkedAt: Double, now: Double, pollsWithIt: Bool) -> Bool {
    pollsWithIt || now - checkedAt < seconds
  }

  /// Whether a key that keeps a stream open is due for a re-check at `now`.
  func recheckDue(checkedAt: Double, now: Double, pollsWithIt: Bool) -> Bool {
    !pollsWithIt && now - checkedAt >= seconds
  }
}
