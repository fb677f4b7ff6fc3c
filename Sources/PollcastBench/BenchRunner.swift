import CLibevent
import Foundation
import LegacyFixture
import PollcastCore

/// Drives one benchmark run. Loop-confined state; `run()` orchestrates from outside the loop with `submit`.
public final class BenchRunner: BenchRecorder, @unchecked Sendable {
  let options: BenchOptions
  let loop: EventLoop
  private var transport: CurlTransport!
  private var subscribers: [BenchSubscriber] = []
  /// Where subscribers connect: subscriber i uses `targets[i % count]` (several nodes of a cluster).
  private var targets: [(address: sockaddr_in, host: String, path: String)] = []
  // Per subscriber: a bitset of received sequence numbers, the count of distinct ones, the largest seen.
  private var received: [[UInt64]] = []
  private var distinct: [Int] = []
  private var highest: [Int] = []
  private var latencies: [UInt32] = []
  private var duplicates = 0
  private var outOfOrder = 0
  private var foreign = 0
  private var connectedCount = 0
  /// Per-subscriber tokens (`--mint-tokens`), by index.
  private var tokens: [String] = []
  private var failedConnects = 0
  private var unexpectedDrops = 0
  private var reconnecting = false
  private var statusErrors = 0
  private var injected = 0
  private var injectFailures = 0
  private var firstSend = 0.0
  private var lastDelivery = 0.0
  private var lastInjectCompleted = 0.0
  private var injectTimer: LoopTimer?
  /// The offered load must not depend on how fast the server answers a publish (a closed loop would slow the
  /// injection, and so flatter the latency, of whichever server is busier). Fixture injections go one request at
  /// a time, but what queued up behind it goes together in the next request (the fixture takes a list), so the
  /// rate holds and the source order is the sequence order. Plain publish URLs take one message per request, so
  /// up to `publishConcurrency` go in parallel; any reordering that causes at the source shows as out-of-order.
  private var injectInFlight = 0
  private var injectBacklog = 0
  private let publishConcurrency = 32
  private var sequence = 0
  private var stormAt: Int?
  private var stormStarted = 0.0
  private var stormRecovered = 0.0
  private var stormReconnected = 0
  private var retries: [Int: Int] = [:]
  private var retryTimers: [Int: LoopTimer] = [:]
  /// Nodes a subscriber moved on by after its node refused it (a cluster node killed): it tries the next one.
  private var targetShift: [Int: Int] = [:]
  private var retryCount = 0
  /// `--accounts`: the account each message went to (by sequence), and messages sent per account.
  private var messageAccount: [Int] = []
  private var sentPerAccount: [Int] = []
  /// The accounts messages may go to: all but those the fixture stalls (`--stall-fraction`).
  private var answeringAccounts: [Int] = []
  /// `--lag-sample-ms`: the largest `pollcast_event_loop_lag_seconds` seen since the phase began, and the scrape.
  private var lagMax = 0.0
  private var lagSamples = 0
  private var lagTimer: LoopTimer?
  private var lagScrapeInFlight = false
  /// Bumped when a phase ends: a scrape answered after it counts for no phase.
  private var lagPhase = 0
  /// The relay's longest Swift job pass since it started (`pollcast_event_loop_job_pass_max_seconds`) at the first
  /// and last sample of the phase, and its passes over 10 ms then: a phase whose lag is well above its job passes
  /// was held in C callbacks.
  private var jobPassMax: (first: Double?, last: Double) = (nil, 0)
  private var slowPasses: (first: Int?, last: Int) = (nil, 0)
  private var cutPasses: (first: Int?, last: Int) = (nil, 0)
  /// The relay's probe-lateness histogram (`pollcast_event_loop_lateness_seconds`) at the first and last sample of
  /// the phase, by bucket bound ("+Inf": every tick): the ticks late by over a bound in the phase are the
  /// difference, where the lag above is only what the scrapes happened to see.
  private var lateness: (first: [String: Int]?, last: [String: Int]) = (nil, [:])
  private var random = SystemRandomNumberGenerator()

  public init(options: BenchOptions, loop: EventLoop) {
    self.options = options
    self.loop = loop
  }

  // MARK: Orchestration (off the loop)

  public func run() async throws -> String {
    checkDescriptorLimit()
    try parseTarget()
    let loop = self.loop
    let made = try await loop.submit { () throws(UpstreamError) -> CurlTransport in try CurlTransport(loop: loop) }
    await loop.submit { [self] in
      transport = made
      received = Array(
        repeating: Array(repeating: 0, count: (options.messages + 63) / 64 + 1), count: options.subscribers)
      distinct = Array(repeating: 0, count: options.subscribers)
      highest = Array(repeating: -1, count: options.subscribers)
      latencies.reserveCapacity(options.subscribers * options.messages)
    }
    let benchAffinity = ProcessSample.affinity(getpid())
    let relayAffinity = options.relayPIDs.map { ProcessSample.affinity($0) }.joined(separator: ",")
    print(
      "pollcast-bench: \(options.label) \(options.mode.rawValue) N=\(options.subscribers) M=\(options.messages) rate=\(options.rate)/s"
    )
    print(
      "pinned: bench on CPUs \(benchAffinity); relay on CPUs \(relayAffinity.isEmpty ? "unknown (no --relay-pid)" : relayAffinity)"
    )
    if options.accounts > 0 {
      let keys = (0..<options.subscribers).map { "key-\(1000 + $0 % options.accounts)" }
      var stallRule = LegacyFixture.Options()
      stallRule.stallFraction = options.stallFraction
      let answering = (0..<options.accounts).filter { !stallRule.stalls(String(1000 + $0)) }
      guard !answering.isEmpty else { throw BenchError("--stall-fraction leaves no account that answers") }
      await loop.submit { [self] in
        tokens = keys
        sentPerAccount = Array(repeating: 0, count: options.accounts)
        answeringAccounts = answering
      }
      if options.stallFraction > 0 {
        print(
          "accounts the fixture stalls: \(options.accounts - answering.count) of \(options.accounts) (no messages go to them)"
        )
      }
    }
    if let spec = options.mintTokens {
      let minted = try BenchTokens.mint(spec: spec, count: options.subscribers)
      await loop.submit { [self] in tokens = minted }
      print("minted \(minted.count) tokens (\(spec.split(separator: ":").first ?? ""))")
    }
    let baseline = ProcessSample.take(options.relayPIDs)

    // Connect everyone, in batches so the listen backlog is not flooded. With accounts, the first round opens one
    // subscriber per account (and so every account's loop), sampled apart: RSS per account, then per subscriber.
    let connectStart = MonotonicClock.seconds()
    var started = 0
    var afterAccounts: ProcessSample?
    let firstRound = options.accounts > 0 ? min(options.accounts, options.subscribers) : options.subscribers
    while started < options.subscribers {
      if started == firstRound && options.accounts > 0 {
        try await waitUntil(timeout: 60) { [self] in connectedCount + failedConnects >= firstRound }
        try await Task.sleep(for: .seconds(1))
        afterAccounts = ProcessSample.take(options.relayPIDs)
        if let baseline, let afterAccounts {
          let perAccount = Double(afterAccounts.rssBytes - baseline.rssBytes) / Double(firstRound)
          print(String(format: "relay RSS per active account (with its first subscriber): %.2f KB", perAccount / 1024))
        }
      }
      let from = started
      // Spread: a small batch every `spreadStep` seconds, so the first round takes `connectSpread` seconds.
      let spreading = options.connectSpread > 0 && started < firstRound
      let spreadStep = 0.02
      let batch =
        spreading
        ? max(1, Int((Double(firstRound) * spreadStep / options.connectSpread).rounded(.up))) : options.connectBatch
      let to = min(started < firstRound ? firstRound : options.subscribers, started + batch)
      await loop.submit { [self] in
        for index in from..<to {
          let subscriber = BenchSubscriber(index: index, runner: self)
          subscribers.append(subscriber)
          connect(subscriber, lastEventID: nil)
        }
      }
      started = to
      if spreading {
        try await Task.sleep(for: .milliseconds(Int(spreadStep * 1000)))
        continue
      }
      let settled = to - options.connectBatch / 2
      try await waitUntil(timeout: 30) { [self] in connectedCount + failedConnects >= settled }
    }
    try await waitUntil(timeout: 60) { [self] in connectedCount + failedConnects >= options.subscribers }
    let connectSeconds = MonotonicClock.seconds() - connectStart
    let connected = await loop.submit { [self] in connectedCount }
    print(
      String(
        format: "connected %d of %d in %.2f s (%d failed)", connected, options.subscribers, connectSeconds,
        await loop.submit { [self] in failedConnects }))
    try await Task.sleep(for: .seconds(1))
    let afterConnect = ProcessSample.take(options.relayPIDs)
    var summary: [(String, String)] = [
      ("target", options.label), ("mode", options.mode.rawValue), ("n", String(options.subscribers)),
      ("connected", String(connected)), ("connect_s", String(format: "%.3f", connectSeconds)),
    ]
    if connectSeconds > 0 {
      summary.append(("connects_per_s", String(format: "%.0f", Double(connected) / connectSeconds)))
    }
    if let baseline, let afterConnect {
      let perConnect = (afterConnect.cpuSeconds - baseline.cpuSeconds) / Double(max(1, connected)) * 1e6
      summary.append(("cpu_us_per_connect", String(format: "%.1f", perConnect)))
      print(
        String(
          format: "relay CPU per connect: %.1f µs (%.0f connects/s)", perConnect, Double(connected) / connectSeconds))
      let perSubscriber = Double(afterConnect.rssBytes - baseline.rssBytes) / Double(max(1, connected))
      summary.append(("rss_kb_per_sub", String(format: "%.2f", perSubscriber / 1024)))
      print(String(format: "relay RSS per subscriber: %.2f KB", perSubscriber / 1024))
      if let afterAccounts, options.subscribers > firstRound {
        let perAccount = Double(afterAccounts.rssBytes - baseline.rssBytes) / Double(firstRound)
        let perExtra =
          Double(afterConnect.rssBytes - afterAccounts.rssBytes) / Double(options.subscribers - firstRound)
        summary.append(("rss_kb_per_account", String(format: "%.2f", perAccount / 1024)))
        summary.append(("rss_kb_per_extra_sub", String(format: "%.2f", perExtra / 1024)))
        print(String(format: "relay RSS per further subscriber of an active account: %.2f KB", perExtra / 1024))
      }
    }
    if options.accounts > 0, case .fixture(let base) = options.injector {
      // Every account's loop must be polling before messages go in (start_from latest skips earlier ones).
      let want = options.accounts
      var parked = 0
      let deadline = MonotonicClock.seconds() + 60
      while parked < want && MonotonicClock.seconds() < deadline {
        parked = await fixtureStats(base)?.pollsInFlight ?? 0
        if parked < want { try await Task.sleep(for: .milliseconds(200)) }
      }
      print("fixture polls hanging: \(parked) for \(want) accounts")
      await loop.submit { [self] in startLagPhase() }
      let before = ProcessSample.take(options.relayPIDs)
      try await Task.sleep(for: .seconds(options.idleSeconds))
      let after = ProcessSample.take(options.relayPIDs)
      if let lag = await loop.submit({ [self] in endLagPhase() }) {
        print(
          String(
            format: "relay loop lag, largest sampled while idle: %.1f ms (%d samples); ", lag.max * 1000, lag.samples)
            + lag.jobPass)
        summary.append(("lag_max_idle_ms", String(format: "%.1f", lag.max * 1000)))
        if let over15 = lag.over15 { summary.append(("probe_late_over_15ms_idle", String(over15))) }
      }
      if let before, let after {
        let share = (after.cpuSeconds - before.cpuSeconds) / options.idleSeconds * 100
        print(
          String(
            format: "relay CPU idle over %.0f s with %d polls hanging: %.3f%% of one core", options.idleSeconds,
            parked, share))
        summary.append(("idle_cpu_pct", String(format: "%.4f", share)))
      }
    }

    if options.mode == .idle {
      let before = ProcessSample.take(options.relayPIDs)
      try await Task.sleep(for: .seconds(options.idleSeconds))
      let after = ProcessSample.take(options.relayPIDs)
      if let before, let after {
        let share = (after.cpuSeconds - before.cpuSeconds) / options.idleSeconds * 100
        print(String(format: "relay CPU idle over %.0f s: %.3f%% of one core", options.idleSeconds, share))
        summary.append(("idle_cpu_pct", String(format: "%.4f", share)))
      }
      await loop.submit { [self] in for subscriber in subscribers { subscriber.close() } }
      return summaryLine(summary)
    }

    await loop.submit { [self] in startLagPhase() }
    let cpuBefore = ProcessSample.take(options.relayPIDs)
    if options.mode == .storm { await loop.submit { [self] in stormAt = options.messages / 2 } }
    await loop.submit { [self] in startInjecting() }
    let sendSeconds = Double(options.messages) / options.rate
    try await Task.sleep(for: .seconds(sendSeconds))
    try? await waitUntil(timeout: 30) { [self] in
      sequence >= options.messages && injected + injectFailures >= options.messages
    }
    // Drain: until every connected subscriber has every message, or the drain window passes.
    try? await waitUntil(timeout: options.drainSeconds) { [self] in
      distinct.indices.allSatisfy { distinct[$0] >= expected(for: $0) }
    }
    let cpuAfter = ProcessSample.take(options.relayPIDs)
    if let lag = await loop.submit({ [self] in endLagPhase() }) {
      print(
        String(
          format: "relay loop lag, largest sampled with messages: %.1f ms (%d samples); ", lag.max * 1000,
          lag.samples) + lag.jobPass)
      summary.append(("lag_max_messages_ms", String(format: "%.1f", lag.max * 1000)))
      if let over15 = lag.over15 { summary.append(("probe_late_over_15ms_messages", String(over15))) }
    }
    let report = await loop.submit { [self] in measure() }
    await loop.submit { [self] in
      injectTimer = nil
      lagTimer = nil
      for subscriber in subscribers { subscriber.close() }
    }
    print(report.text)
    summary += report.fields
    if options.accounts > 0, case .fixture(let base) = options.injector, let stats = await fixtureStats(base) {
      print(
        "fixture: most polls in flight for one account \(stats.maxPerUser) (of \(stats.users) accounts), sessions \(stats.sessions),"
          + " polls \(stats.polls), cursor syncs \(stats.syncs) (whole run)"
      )
      summary.append(("max_polls_per_account", String(stats.maxPerUser)))
      summary.append(("sessions", String(stats.sessions)))
      summary.append(("fixture_polls", String(stats.polls)))
      summary.append(("fixture_syncs", String(stats.syncs)))
    }
    if let cpuBefore, let cpuAfter, report.deliveries > 0 {
      let perDelivery = (cpuAfter.cpuSeconds - cpuBefore.cpuSeconds) / Double(report.deliveries) * 1e6
      let userShare =
        (cpuAfter.userSeconds - cpuBefore.userSeconds) / max(1e-9, cpuAfter.cpuSeconds - cpuBefore.cpuSeconds)
      print(
        String(format: "relay CPU per delivery: %.3f µs (%.0f%% user, the rest kernel)", perDelivery, userShare * 100))
      summary.append(("cpu_us_per_delivery", String(format: "%.3f", perDelivery)))
      summary.append(("cpu_user_share", String(format: "%.2f", userShare)))
    }
    return summaryLine(summary)
  }

  // MARK: Loop lag (`--lag-sample-ms`)

  /// Starts sampling the relay's loop lag anew (on the loop); nothing when sampling is off.
  private func startLagPhase() {
    guard options.lagSampleMilliseconds > 0, let target = targets.first else { return }
    lagMax = 0
    lagSamples = 0
    jobPassMax = (nil, 0)
    slowPasses = (nil, 0)
    cutPasses = (nil, 0)
    lateness = (nil, [:])
    guard lagTimer == nil else { return }
    let url = "http://\(target.host)/metrics"
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.scrapeLag(url) }
    timer.schedule(after: options.lagSampleMilliseconds / 1000)
    lagTimer = timer
  }

  /// The phase's largest sampled lag (on the loop); nil when sampling is off. Sampling stops until the next phase:
  /// scrapes between phases (connecting, draining) would load the relay outside what is measured, and a scrape still
  /// in flight counts for no phase.
  private func endLagPhase() -> (max: Double, samples: Int, jobPass: String, over15: Int?)? {
    guard lagTimer != nil else { return nil }
    lagTimer = nil
    lagPhase += 1
    var jobPass = String(
      format: "longest Swift job pass since start %.1f -> %.1f ms, passes over 10 ms in the phase: %d, cut at 5 ms: %d",
      (jobPassMax.first ?? 0) * 1000, jobPassMax.last * 1000, slowPasses.last - (slowPasses.first ?? 0),
      cutPasses.last - (cutPasses.first ?? 0))
    // Ticks in the phase, and those late by over a bound: (all - at most the bound) at the end less at the start.
    func ticks(over bound: String?) -> Int? {
      guard let first = lateness.first, let all = lateness.last["+Inf"], let firstAll = first["+Inf"] else {
        return nil
      }
      guard let bound else { return all - firstAll }
      guard let under = lateness.last[bound], let firstUnder = first[bound] else { return nil }
      return (all - under) - (firstAll - firstUnder)
    }
    // With the relay's probe 5 ms apart (`LOOP_PROBE_MS=5`), none late by over 15 ms means no stall over 20 ms.
    let over = ["0.01", "0.015", "0.02", "0.05"].map { ticks(over: $0) }
    let counts = over.compactMap { $0 }
    if let total = ticks(over: nil), counts.count == over.count {
      jobPass +=
        "; probe ticks in the phase \(total), late by over 10 / 15 / 20 / 50 ms: "
        + counts.map(String.init).joined(separator: " / ")
    }
    return (lagMax, lagSamples, jobPass, over[1])
  }

  private func scrapeLag(_ url: String) {
    guard !lagScrapeInFlight else { return }
    lagScrapeInFlight = true
    let phase = lagPhase
    transport.start(UpstreamRequest(url: url, timeout: 5, label: "metrics")) { [self] outcome in
      lagScrapeInFlight = false
      guard phase == lagPhase, case .success(let response) = outcome, response.status == 200 else { return }
      let prefix = "pollcast_event_loop_lag_seconds "
      let passPrefix = "pollcast_event_loop_job_pass_max_seconds "
      let slowPrefix = "pollcast_event_loop_slow_job_passes_total "
      let cutPrefix = "pollcast_event_loop_cut_job_passes_total "
      let latenessPrefix = "pollcast_event_loop_lateness_seconds_bucket{le=\""
      var buckets: [String: Int] = [:]
      let text = String(decoding: response.body, as: UTF8.self)
      for line in text.split(separator: "\n") {
        if line.hasPrefix(prefix), let lag = Double(line.dropFirst(prefix.count)) {
          lagMax = max(lagMax, lag)
          lagSamples += 1
        } else if line.hasPrefix(passPrefix), let pass = Double(line.dropFirst(passPrefix.count)) {
          jobPassMax = (jobPassMax.first ?? pass, pass)
        } else if line.hasPrefix(slowPrefix), let slow = Int(line.dropFirst(slowPrefix.count)) {
          slowPasses = (slowPasses.first ?? slow, slow)
        } else if line.hasPrefix(cutPrefix), let cut = Int(line.dropFirst(cutPrefix.count)) {
          cutPasses = (cutPasses.first ?? cut, cut)
        } else if line.hasPrefix(latenessPrefix) {
          let labelAndCount = line.dropFirst(latenessPrefix.count).split(separator: "\"} ")
          if labelAndCount.count == 2, let count = Int(labelAndCount[1]) { buckets[String(labelAndCount[0])] = count }
        }
      }
      if !buckets.isEmpty { lateness = (lateness.first ?? buckets, buckets) }
    }
  }

  /// GET `/_control/stats` through the bench's own transport.
  private func fixtureStats(_ base: String) async -> FixtureStats? {
    let request = UpstreamRequest(url: base + "/_control/stats", timeout: 10, label: "stats")
    let text: String? = await withCheckedContinuation { continuation in
      loop.execute { [self] in
        transport.start(request) { outcome in
          guard case .success(let response) = outcome, response.status == 200 else {
            continuation.resume(returning: nil)
            return
          }
          continuation.resume(returning: String(decoding: response.body, as: UTF8.self))
        }
      }
    }
    return text.flatMap(FixtureStats.parse)
  }

  private func summaryLine(_ fields: [(String, String)]) -> String {
    "SUMMARY " + fields.map { "\($0.0)=\($0.1)" }.joined(separator: " ")
  }

  private func waitUntil(timeout: Double, _ condition: @escaping @Sendable () -> Bool) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while !(await loop.submit(condition)) {
      guard MonotonicClock.seconds() < deadline else { throw BenchError("timed out") }
      try await Task.sleep(for: .milliseconds(20))
    }
  }

  private func checkDescriptorLimit() {
    let limit = raiseDescriptorLimit()
    if options.subscribers + 64 > limit {
      print("warning: \(options.subscribers) subscribers need more than the \(limit) descriptors allowed")
    }
  }

  private func parseTarget() throws {
    for text in options.target.split(separator: ",") {
      guard let url = URL(string: String(text)), let hostName = url.host, let port = url.port else {
        throw BenchError("--target must be http://IPv4:PORT/path[,http://IPv4:PORT/path…]")
      }
      var address = sockaddr_in()
      address.sin_family = sa_family_t(AF_INET)
      address.sin_port = UInt16(port).bigEndian
      guard inet_pton(AF_INET, hostName, &address.sin_addr) == 1 else {
        throw BenchError("--target needs an IPv4 address")
      }
      targets.append(
        (address, "\(hostName):\(port)", url.path.isEmpty ? "/" : url.path + (url.query.map { "?\($0)" } ?? "")))
    }
    guard !targets.isEmpty else { throw BenchError("--target names no URL") }
  }

  // MARK: On the loop

  private func connect(_ subscriber: BenchSubscriber, lastEventID: [UInt8]?) {
    let source = "127.0.0.\(1 + subscriber.index % options.sources)"
    // With accounts, subscriber i and i + A (one account's) sit on different nodes.
    let spread = options.accounts > 0 ? subscriber.index / options.accounts : 0
    let target = targets[(subscriber.index + spread + targetShift[subscriber.index, default: 0]) % targets.count]
    if !subscriber.connect(
      loop: loop, source: source, target: target.address, host: target.host, path: target.path,
      lastEventID: lastEventID,
      token: tokens.isEmpty ? nil : tokens[subscriber.index % tokens.count])
    {
      subscriberFailed(subscriber)
    }
  }

  func subscriberConnected(_ subscriber: BenchSubscriber, status: Int) {
    if status != 200 {
      statusErrors += 1
      failedConnects += 1
      subscriber.close()
      return
    }
    connectedCount += 1
    retries[subscriber.index] = nil
    if stormStarted > 0 && stormRecovered == 0 {
      stormReconnected += 1
      if stormReconnected == subscribers.count { stormRecovered = MonotonicClock.seconds() }
    }
  }

  func subscriberClosed(_ subscriber: BenchSubscriber) {
    connectedCount -= 1
    guard !reconnecting else { return }
    // The server dropped us (slow consumer, restart, connection age): resume like a browser would.
    unexpectedDrops += 1
    let lastEventID = subscriber.lastEventID
    connect(subscriber, lastEventID: lastEventID)
  }

  func subscriberFailed(_ subscriber: BenchSubscriber) {
    // Refused or reset before the response head (a full listen backlog, a server out of descriptors during a
    // storm): retry like an EventSource would, with the id it last saw, a few times before giving up.
    retries[subscriber.index, default: 0] += 1
    guard retries[subscriber.index]! <= 20 else {
      failedConnects += 1
      return
    }
    retryCount += 1
    if targets.count > 1 { targetShift[subscriber.index, default: 0] += 1 }
    let lastEventID = subscriber.lastEventID
    let timer = LoopTimer(loop: loop) { [weak self] in
      guard let self else { return }
      self.retryTimers[subscriber.index] = nil
      self.connect(subscriber, lastEventID: lastEventID)
    }
    timer.schedule(after: 0.1 + Double.random(in: 0...0.1))
    retryTimers[subscriber.index] = timer
  }

  /// Messages subscriber `index` should get: all of them, or (accounts) those sent to its account.
  private func expected(for index: Int) -> Int {
    options.accounts > 0 ? sentPerAccount[index % options.accounts] : options.messages
  }

  func delivered(_ event: StreamScanner.Event, to subscriber: Int, at micros: UInt64) {
    let sequence = event.sequence
    guard sequence >= 0 && sequence < options.messages else {
      foreign += 1
      return
    }
    if options.accounts > 0
      && (sequence >= messageAccount.count || messageAccount[sequence] != subscriber % options.accounts)
    {
      foreign += 1  // another account's message: an isolation failure
      return
    }
    let word = sequence / 64
    let bit = UInt64(1) << UInt64(sequence % 64)
    if received[subscriber][word] & bit != 0 {
      duplicates += 1
      return
    }
    received[subscriber][word] |= bit
    distinct[subscriber] += 1
    if sequence < highest[subscriber] { outOfOrder += 1 }
    highest[subscriber] = max(highest[subscriber], sequence)
    latencies.append(UInt32(clamping: micros > event.sentMicros ? micros - event.sentMicros : 0))
    lastDelivery = MonotonicClock.seconds()
  }

  private func startInjecting() {
    firstSend = MonotonicClock.seconds()
    let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.injectNext() }
    timer.schedule(after: Double(options.batch) / options.rate)
    injectTimer = timer
    injectNext()
  }

  private func injectNext() {
    guard sequence + injectBacklog < options.messages else {
      injectTimer = nil
      return
    }
    let limit: Int
    if case .fixture = options.injector { limit = 1 } else { limit = publishConcurrency }
    let due = min(options.batch, options.messages - sequence - injectBacklog)
    if injectInFlight >= limit {
      injectBacklog += due
      return
    }
    sendInjection(due)
  }

  private func sendInjection(_ due: Int) {
    // Messages that queued up behind the previous request go together (the fixture takes a list), each with
    // its own send time, so the injector keeps up with high rates without reordering anything.
    // `--batch B`: B messages per request at rate / B requests per second (one upstream answer, one commit).
    var count = due
    if case .fixture = options.injector, options.accounts == 0 {
      let extra = min(injectBacklog, 200)
      count += extra
      injectBacklog -= extra
    }
    var texts: [String] = []
    for _ in 0..<count {
      if let stormAt, sequence == stormAt { storm() }
      texts.append("bench \(sequence) \(EventIDAllocator.nowMicroseconds())")
      sequence += 1
    }
    let request: UpstreamRequest
    switch options.injector {
    case .fixture(let base):
      let list = texts.map { "\"\($0)\"" }.joined(separator: ",")
      var user = "101"
      if options.accounts > 0 {
        let account = answeringAccounts.randomElement(using: &random) ?? 0
        messageAccount.append(account)
        sentPerAccount[account] += 1
        user = String(1000 + account)
      }
      request = UpstreamRequest(
        method: "POST", url: base + "/_control/messages", headers: [("Content-Type", "application/json")],
        body: Array("{\"user_id\":\"\(user)\",\"texts\":[\(list)]}".utf8), timeout: 10, label: "inject")
    case .publish(let url):
      request = UpstreamRequest(
        method: "POST", url: url, headers: [("Content-Type", "text/plain")], body: Array(texts[0].utf8),
        timeout: 10, label: "inject")
    }
    injectInFlight += 1
    transport.start(request) { [self] outcome in  // the transport (ours) ends the cycle when the transfer ends
      switch outcome {
      case .success(let response) where (200..<300).contains(response.status): injected += count
      default: injectFailures += count
      }
      injectInFlight -= 1
      lastInjectCompleted = MonotonicClock.seconds()
      if injectBacklog > 0 {
        let next = min(injectBacklog, options.batch)
        injectBacklog -= next
        sendInjection(next)
      }
    }
  }

  /// Every subscriber drops at once and resumes with the last id it saw.
  private func storm() {
    reconnecting = true
    stormStarted = MonotonicClock.seconds()
    var resumeFrom: [[UInt8]] = []
    for subscriber in subscribers {
      resumeFrom.append(subscriber.lastEventID)
      subscriber.close()
    }
    reconnecting = false
    for (index, subscriber) in subscribers.enumerated() { connect(subscriber, lastEventID: resumeFrom[index]) }
  }

  private func measure() -> (text: String, fields: [(String, String)], deliveries: Int) {
    // Only what the injector actually got accepted can be lost; what it never sent (it fell behind the rate)
    // is reported apart, so an overloaded injector is not mistaken for a relay that drops events.
    let notInjected = options.messages - injected
    var expected = options.subscribers * injected
    if options.accounts > 0 {
      var perAccount = Array(repeating: 0, count: options.accounts)
      for index in 0..<options.subscribers { perAccount[index % options.accounts] += 1 }
      expected = messageAccount.prefix(injected).reduce(0) { $0 + perAccount[$1] }
    }
    let deliveries = distinct.reduce(0, +)
    let lost = max(0, expected - deliveries)
    latencies.sort()
    func percentile(_ p: Double) -> Double {
      guard !latencies.isEmpty else { return .nan }
      let index = min(latencies.count - 1, Int((Double(latencies.count) * p).rounded(.up)) - 1)
      return Double(latencies[max(0, index)]) / 1000
    }
    let span = max(0.001, lastDelivery - firstSend)
    let rate = Double(deliveries) / span
    var text = String(
      format: "deliveries %d of %d: lost %d, duplicated %d, out of order %d; %.0f deliveries/s\n",
      deliveries, expected, lost, duplicates, outOfOrder, rate)
    text += String(
      format: "latency inject→receive ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n", percentile(0.5), percentile(0.9),
      percentile(0.99), percentile(1.0))
    let offered = Double(injected) / max(0.001, lastInjectCompleted - firstSend)
    text += String(format: "injected %d (%.1f/s achieved), ", injected, offered)
    text += "inject failures \(injectFailures), unexpected drops \(unexpectedDrops), non-200 \(statusErrors), "
    text += "connect retries \(retryCount), gave up \(failedConnects)"
    if options.accounts > 0 { text += ", other accounts' messages received \(foreign)" }
    var fields: [(String, String)] = [
      ("messages", String(options.messages)), ("rate", String(options.rate)), ("deliveries", String(deliveries)),
      ("lost", String(lost)), ("not_injected", String(notInjected)), ("dup", String(duplicates)),
      ("ooo", String(outOfOrder)),
      ("p50_ms", String(format: "%.3f", percentile(0.5))), ("p90_ms", String(format: "%.3f", percentile(0.9))),
      ("p99_ms", String(format: "%.3f", percentile(0.99))), ("max_ms", String(format: "%.3f", percentile(1.0))),
      ("deliveries_per_s", String(format: "%.0f", rate)), ("inject_failures", String(injectFailures)),
      ("drops", String(unexpectedDrops)), ("achieved_rate", String(format: "%.1f", offered)),
      ("retries", String(retryCount)), ("gave_up", String(failedConnects)), ("foreign", String(foreign)),
    ]
    if stormStarted > 0 {
      let recovery = stormRecovered > 0 ? stormRecovered - stormStarted : .nan
      text += String(format: "\nstorm: %d resumed, all reconnected in %.3f s", stormReconnected, recovery)
      fields.append(("storm_recover_s", String(format: "%.3f", recovery)))
    }
    return (text, fields, deliveries)
  }
}

/// The fixture's `/_control/stats`.
struct FixtureStats {
  var pollsInFlight: Int
  var sessions: Int
  var users: Int
  var maxPerUser: Int
  /// Polls received and `GET /api/messages/last` calls answered, over the fixture's life.
  var polls = 0
  var syncs = 0

  static func parse(_ text: String) -> FixtureStats? {
    guard let json = try? RawJSON.parse(text) else { return nil }
    var stats = FixtureStats(
      pollsInFlight: Int(json["polls_in_flight"]?.unsignedID ?? 0), sessions: Int(json["sessions"]?.unsignedID ?? 0),
      users: 0, maxPerUser: 0)
    stats.polls = Int(json["polls"]?.unsignedID ?? 0)
    stats.syncs = Int(json["syncs"]?.unsignedID ?? 0)
    if let users = json["users"], case .object(let members) = users.value {
      stats.users = members.count
      for (_, user) in members {
        stats.maxPerUser = max(stats.maxPerUser, Int(user["max_polls_in_flight"]?.unsignedID ?? 0))
      }
    }
    return stats
  }
}
