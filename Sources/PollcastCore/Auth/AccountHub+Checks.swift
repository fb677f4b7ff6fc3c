import Foundation

/// Key checks: what is known without a legacy call, the check itself (one per key however many wait), and the
/// periodic re-check of keys that keep streams open.
extension AccountHub {
  /// Re-checks, every `credentialCacheSeconds`, each key that keeps a stream open but is not the one its account's
  /// loop polls with (that one is checked by every poll). A secondary key revoked while another key keeps the
  /// account polling used to go on reading for as long as that lasted: now its streams end with
  /// `credential-revoked` within about `credentialCacheSeconds`.
  ///
  /// The walk visits the accounts in turns (`forEachAccountInTurns`), the loop serving everything else between
  /// them: one pass in one timer callback held the loop 7-12 ms every 15 s at 9,000 accounts (~16-26 ms at 20,000
  /// by extrapolation). A walk still under way when the timer fires again is left to finish; an account that
  /// stopped meanwhile is passed over.
  func recheckKeys() {
    guard !stopped, !recheckWalking else { return }
    recheckWalking = true
    Task {
      let now = MonotonicClock.seconds()
      await forEachAccountInTurns(turn: settings.accountsPerWalkTurn) { recheckDueKeys(of: $0, now: now) }
      recheckWalking = false
    }
  }

  private func recheckDueKeys(of account: Account, now: Double) {
    guard !stopped, account.isActive else { return }
    let polls = account.pollsHere
    // The time test first, the streams' grants only for an account with a key due: most accounts poll with their
    // only key, which is never due, and building every account's open grants each pass cost 17 % of a per-user
    // relay's CPU in issue 23's profile.
    var open: Set<String>?
    for (digest, entry) in account.credentials
    where !rechecking.contains(digest)
      && verdicts.recheckDue(
        checkedAt: entry.checkedAt, now: now, pollsWithIt: polls && entry.credential == account.activeCredential)
    {
      if open == nil { open = account.feed.assumeIsolated { $0.openGrants } }
      guard open?.contains(digest.hex) == true else { continue }
      rechecking.insert(digest)
      let credential = entry.credential
      Task { await self.recheck(credential, digest: digest, of: account) }
    }
  }

  func recheck(_ credential: String, digest: CredentialDigest, of account: Account) async {
    defer { rechecking.remove(digest) }
    let adapter = upstream.makeAdapter(credential)
    do throws(UpstreamError) {
      _ = try await adapter.identify(makeClient(credential), isolation: self)
      account.credentials[digest]?.checkedAt = MonotonicClock.seconds()
    } catch {
      // Only the upstream's own refusal counts; when it could not tell (down, timeout) the key stays.
      if case .status(let code) = error.kind, code == 401 || code == 403 { secondaryKeyRefused(digest, of: account) }
    }
  }

  func secondaryKeyRefused(_ digest: CredentialDigest, of account: Account) {
    stats.revocations += 1
    account.credentials[digest] = nil
    verdicts.forget(digest, of: account.key)
    remember(refusal: digest)
    let data = JSONText.object([
      "reason": JSONText.quoted("credential_revoked"),
      "message": JSONText.quoted("the upstream refused this key: reconnect with a valid one"),
    ])
    let ended = account.feed.assumeIsolated { $0.endAll(type: "credential-revoked", data: data, grant: digest.hex) }
    logger.warning(
      "a key of an account was refused by the upstream on its re-check: its streams ended",
      metadata: ["account": account.label, "streams": String(ended)])
  }

  // MARK: Credentials

  /// The answer known without asking the upstream: a refused key within its cache time, or an accepted key of an
  /// active account. Nil when the upstream must be asked (`resolve`).
  public func cached(_ credential: String) -> Outcome? {
    let digest = CredentialDigest(credential, salt: digestSalt)
    let now = MonotonicClock.seconds()
    if verdicts.isRefused(digest, now: now) {
      stats.credentialChecks["refused_cached", default: 0] += 1
      return .refused(reason: "invalid_credential")
    }
    // The key the account's loop polls with is checked by every poll (a refusal stops the loop and forgets it), so
    // it needs no legacy call of its own: a second subscriber of an account used to open a second legacy session.
    guard let key = verdicts.account(of: digest), let account = accounts[key], account.isActive,
      let entry = account.credentials[digest], entry.credential == credential,
      verdicts.trusts(
        checkedAt: entry.checkedAt, now: now,
        pollsWithIt: credential == account.activeCredential && account.pollsHere)
    else { return nil }
    stats.credentialChecks["accepted_cached", default: 0] += 1
    account.lastUsed = now
    return .admitted(account)
  }

  /// Checks `credential` with the upstream (or joins the check already running for it), then starts or finds
  /// its account.
  public func resolve(_ credential: String, address: String? = nil) async -> Outcome {
    if let known = cached(credential) { return known }
    guard !stopped else { return .unavailable }
    let digest = CredentialDigest(credential, salt: digestSalt)
    let pending: PendingCheck
    if let running = checking[digest] {
      pending = running
    } else {
      guard checking.count < settings.maxPendingChecks else {
        stats.credentialChecks["busy", default: 0] += 1
        return .busy
      }
      pending = PendingCheck()
      checking[digest] = pending
      // Its own task, so no waiter's cancellation cancels it; only the last waiter leaving does (`leave`).
      pending.task = Task { [weak pending] in
        let outcome = await self.check(credential, digest: digest, address: address)
        guard let pending, self.checking[digest] === pending else { return }
        self.checking[digest] = nil
        for waiter in pending.waiters.values { waiter.resume(returning: outcome) }
        pending.waiters.removeAll()
      }
    }
    nextWaiter += 1
    let waiter = nextWaiter
    let loop = loop
    return await withTaskCancellationHandler {
      await withCheckedContinuation { continuation in
        pending.waiters[waiter] = continuation
        if Task.isCancelled { leave(digest, waiter: waiter) }
      }
    } onCancel: {
      loop.execute { [weak self] in
        self?.assumeIsolated { $0.leave(digest, waiter: waiter) }
      }
    }
  }

  /// A waiter's client went away: its wait ends, and with the last one the check is cancelled.
  func leave(_ digest: CredentialDigest, waiter: Int) {
    guard let pending = checking[digest], let continuation = pending.waiters.removeValue(forKey: waiter) else { return }
    continuation.resume(returning: .unavailable)
    guard pending.waiters.isEmpty else { return }
    checking[digest] = nil
    pending.task?.cancel()
    stats.credentialChecks["abandoned", default: 0] += 1
  }

  func check(_ credential: String, digest: CredentialDigest, address: String?) async -> Outcome {
    let adapter = upstream.makeAdapter(credential)
    let client = makeClient(credential)
    let identity: UpstreamIdentity?
    do {
      identity = try await adapter.identify(client, isolation: self)
    } catch {
      switch error.kind {
      case .cancelled:
        return .unavailable  // every waiter left: nobody is told, and the upstream is not judged by it
      case _ where error.refusesKey(stopWhenRefused: true):
        lastReached = MonotonicClock.seconds()
        stats.credentialChecks["refused", default: 0] += 1
        remember(refusal: digest)
        return .refused(reason: "invalid_credential")
      default:
        lastUnreachable = MonotonicClock.seconds()
        stats.credentialChecks["unavailable", default: 0] += 1
        logger.limited(
          .warning, "could not check a subscriber's credential with the upstream",
          metadata: ["error": error.description], limiter: &logLimiter)
        return .unavailable
      }
    }
    stats.credentialChecks["accepted", default: 0] += 1
    lastReached = MonotonicClock.seconds()
    let key = identity.map { "user:\($0.user)" } ?? upstream.accountKeys.key(for: credential)
    var restored: StoredFeed?
    if accounts[key] == nil && upstream.store.isDurable {
      // An account not in memory may be in the store (it was here before a restart): read off the loop.
      switch await load(key) {
      case .success(let stored): restored = stored
      case .failure(let error):
        stats.credentialChecks["unavailable", default: 0] += 1
        logger.limited(
          .error, "cannot read an account from the store", metadata: ["error": error.description],
          limiter: &logLimiter)
        return .unavailable
      }
    }
    let outcome = activate(
      key: key, label: identity?.user, streams: identity?.streams ?? adapter.defaultStreams, credential: credential,
      digest: digest, adapter: adapter, client: client, restored: restored)
    if identity == nil, case .admitted(let account) = outcome {
      // Identified by nothing, and the session (if any) not run yet: with `hasSession` already true the adapter has
      // no session step, so no request has carried the key before its first poll.
      markUnverified(account, from: address, keyNeverSent: adapter.hasSession)
    }
    return outcome
  }

  /// Remembers who brought the key of an account whose loop has not completed a poll yet; `keyNeverSent`: no session
  /// step sent the key either, so a client error on the first poll refuses it (`UpstreamWorker.keyUnverified`).
  func markUnverified(_ account: Account, from address: String?, keyNeverSent: Bool = false) {
    guard account.unverifiedFrom == nil,
      account.worker?.assumeIsolated({ $0.statistics.lastPollCompleted }) == nil
    else { return }
    account.unverifiedFrom = address
    if keyNeverSent { account.worker?.assumeIsolated { $0.keyUnverified = true } }
  }

  /// Called (on the loop) with the address that brought a key an API without a session step refused on its first
  /// poll: the server counts it as a failed check, so random keys cannot buy upstream calls without limit.
  public func onUnverifiedKeyRefused(_ handler: @escaping @Sendable (String) -> Void) {
    unverifiedRefusal = handler
  }

  func makeClient(_ credential: String) -> UpstreamClient {
    UpstreamClient(
      transport: transports.transport(),
      interceptors: [
        AuthInterceptor(apiKey: credential), LoggingInterceptor(logger: logger, secrets: [credential]),
      ])
  }

  func remember(refusal digest: CredentialDigest) {
    verdicts.refuse(digest, now: MonotonicClock.seconds())
  }
}
