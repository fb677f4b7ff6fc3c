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

/// A credential's keyed digest: what the hub files keys under, so that a refused key is remembered without being
/// kept. 128 bits from two independently salted SipHash runs (Swift's `Hasher`, itself randomly seeded per
/// process): not a cryptographic commitment, a map key no outsider can aim collisions at.
struct CredentialDigest: Hashable, Sendable {
  let high: UInt64
  let low: UInt64

  init(_ credential: String, salt: (UInt64, UInt64)) {
    var first = Hasher()
    first.combine(salt.0)
    first.combine(credential)
    var second = Hasher()
    second.combine(salt.1)
    second.combine(credential)
    high = UInt64(bitPattern: Int64(first.finalize()))
    low = UInt64(bitPattern: Int64(second.finalize()))
  }

  /// 32 hex digits (each half padded: unpadded halves could spell one string for two digests).
  var hex: String {
    (withUnsafeBytes(of: high.bigEndian, Array.init) + withUnsafeBytes(of: low.bigEndian, Array.init)).lowercaseHex
  }
}

extension UpstreamAdapter {
  /// The streams an adapter without a session step reads (a recipe's one stream; `generic` is one).
  var defaultStreams: [String] {
    (self as? RecipeAdapter).map { [$0.recipe.stream] } ?? []
  }
}
