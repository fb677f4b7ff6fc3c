/// The feeds subscribers read, by key: the shared feed (`Grant.FeedKey.shared`) and, with per-user relaying, one
/// feed per account (kept by the `AccountHub`, which starts, bounds and evicts them).
///
/// Loop-confined: `open` runs on the event loop, in the turn the stream attaches.
public final class FeedHub: Sendable {
  public let shared: Feed
  public let accounts: AccountHub?

  public init(shared: Feed, accounts: AccountHub? = nil) {
    precondition(accounts.map { $0.loop === shared.loop } ?? true, "every feed runs on one event loop")
    self.shared = shared
    self.accounts = accounts
  }

  /// 503: no room for another account (active or kept).
  static let noRoom = StreamRefusal.admission(
    .maxAccounts, message: "the relay serves as many accounts as it may: retry later", retryBase: 5)

  /// The feed `grant` reads, ready to attach to. A grant checked some turns ago may find its account's loop
  /// stopped (grace, room made for another): it restarts with the grant's credential, or the stream is refused
  /// with 503. `asking` (the streams the request names) must be streams the feed carries: an account reads its
  /// linked streams only (403 otherwise).
  public func open(_ grant: Grant, asking: Set<String>?) -> Result<Feed, StreamRefusal> {
    switch grant.feed {
    case .shared:
      return .success(shared)
    case .account(let key):
      guard let accounts, let credential = grant.activation else { return .failure(FeedHub.noRoom) }
      return accounts.assumeIsolated { hub in
        guard let account = hub.account(key), hub.ensureActive(account, credential: credential) else {
          return .failure(FeedHub.noRoom)
        }
        if let outside = asking?.subtracting(account.streams).sorted().first {
          return .failure(.forbiddenStream(outside, message: "this account does not read this stream"))
        }
        return .success(account.feed)
      }
    }
  }

  /// Ends every stream of every feed with a last comment (spread over `spread` seconds). Returns how many.
  public func finishAll(comment: String, spread: Double) async -> Int {
    var ended = await shared.finishAll(comment: comment, spread: spread)
    if let accounts { ended += await accounts.shutdown(comment: comment, spread: spread) }
    return ended
  }
}
