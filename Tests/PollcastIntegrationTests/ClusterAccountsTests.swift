import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// Per-user relaying on several nodes (`auth.mode = upstream`, `store.kind = redis`; issue 21): three relay
/// processes on one real `redis-server` and the real fixture with its accounts. Each account's subscribers sit
/// on two different nodes; the node that polls some of them is killed with `kill -9`, its subscribers move on
/// with their Last-Event-ID, Redis restarts, the killed node comes back; every subscriber gets its account's
/// messages exactly once, no account ever has two polls in flight, and an account nobody reads gives up its lease.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ClusterAccountsTests {
  typealias RedisProcess = ClusterTests.RedisProcess

  static let accounts = (1000..<1006).map(String.init)

  static func arguments(_ redis: RedisProcess, node: Int) -> [String] {
    ClusterTests.redisArguments(redis, node: node) + [
      "--auth-mode", "upstream", "--upstream-idle-after-seconds", "2", "--log-level", "info",
    ]
  }

  /// Who holds `user`'s lease (`node-<n>`), read from Redis, or nil.
  static func holder(of user: String, redis: RedisProcess) -> Int? {
    guard let answer = try? RedisProcess.send("GET pollcast{account:user:\(user)}:lease", to: redis.socket),
      let range = answer.range(of: "node-")
    else { return nil }
    return answer[range.upperBound...].first?.wholeNumberValue
  }

  @Test func killAPollerMoveItsSubscribersRestartRedisLoseAndRepeatNothing() async throws {
    let nodeLogs = try NodeLogs("pollcast-accounts", nodes: 3)
    defer { nodeLogs.remove() }
    let directory = nodeLogs.directory
    let logs = nodeLogs.files
    func relayLog() -> String { nodeLogs.tails() }

    let redis = try RedisProcess(directory: directory)
    var options = LegacyFixture.Options()
    options.accounts = Self.accounts.count
    let fixture = try await LegacyFixture.start(options)
    var nodes: [RelayProcess?] = []
    for index in 0..<3 {
      nodes.append(
        try RelayProcess(fixture: fixture.address, store: Self.arguments(redis, node: index), log: logs[index]))
    }
    for node in nodes { try await waitReady(port: node!.port, timeout: 20 * timingFactor) }
    // Two subscribers per account, on two different nodes.
    var readers: [(user: String, reader: Reader, home: Int)] = []
    for (index, user) in Self.accounts.enumerated() {
      for home in [index % 3, (index + 1) % 3] {
        let reader = Reader()
        reader.headers = [("Authorization", "Bearer key-\(user)")]
        try reader.connect(port: nodes[home]!.port)
        readers.append((user, reader, home))
      }
    }
    func pump(_ seconds: Double) {
      let until = MonotonicClock.seconds() + seconds
      repeat {
        for entry in readers where entry.reader.client != nil { entry.reader.pump(for: 0.005) }
      } while MonotonicClock.seconds() < until
    }
    // Every account has a poller before messages flow.
    let settle = MonotonicClock.seconds()
    while Self.accounts.contains(where: { Self.holder(of: $0, redis: redis) == nil })
      && MonotonicClock.seconds() - settle < 15 * timingFactor
    {
      pump(0.05)
    }
    let holders = Self.accounts.map { Self.holder(of: $0, redis: redis) }
    #expect(!holders.contains(nil), "every account has a lease holder: \(holders)")
    // `/metrics`: the nodes' leases add up to one per account.
    func leasesHeld() -> [Int] {
      nodes.compactMap { node in
        guard let node, let body = try? httpGet(port: node.port, "/metrics").body,
          let line = body.split(separator: "\n").first(where: { $0.hasPrefix("pollcast_account_leases_held ") })
        else { return nil }
        return Int(line.split(separator: " ").last ?? "")
      }
    }
    var held = leasesHeld()
    while held.reduce(0, +) != Self.accounts.count && MonotonicClock.seconds() - settle < 15 * timingFactor {
      pump(0.05)
      held = leasesHeld()
    }
    #expect(held.count == 3 && held.reduce(0, +) == Self.accounts.count, "leases held per node: \(held)")

    let publisher = SteadyPublisher(fixture: fixture, users: Self.accounts)
    pump(1 * timingFactor)

    // 1. kill -9 the node that polls the first account (and whichever others it polls); its subscribers resume
    // on the next node with their Last-Event-ID.
    let victim = try #require(Self.holder(of: Self.accounts[0], redis: redis))
    let victimPolled = Self.accounts.filter { Self.holder(of: $0, redis: redis) == victim }
    let killedAt = MonotonicClock.seconds()
    nodes[victim]!.kill9()
    nodes[victim] = nil
    for index in readers.indices where readers[index].home == victim {
      let next = (victim + 1) % 3
      readers[index].home = next
      try readers[index].reader.connect(port: nodes[next]!.port)
    }
    var failover: Double?
    while failover == nil && MonotonicClock.seconds() - killedAt < 15 * timingFactor {
      pump(0.02)
      if victimPolled.allSatisfy({ user in Self.holder(of: user, redis: redis).map { $0 != victim } ?? false }) {
        failover = MonotonicClock.seconds() - killedAt
      }
    }
    #expect(failover != nil, "the killed node's accounts were taken over")
    pump(0.5 * timingFactor)

    // 2. Redis restarts (gracefully, AOF on) mid-stream, down for longer than the lease; the killed node comes
    // back, and one subscriber of each account the victim polled moves to it.
    redis.stop()
    pump(1.5 * timingFactor)
    try redis.start()
    nodes[victim] = try RelayProcess(
      fixture: fixture.address, store: Self.arguments(redis, node: victim), log: logs[victim])
    try await waitReady(port: nodes[victim]!.port, timeout: 20 * timingFactor)
    for user in victimPolled {
      guard let index = readers.firstIndex(where: { $0.user == user }) else { continue }
      readers[index].reader.client = nil
      readers[index].home = victim
      try readers[index].reader.connect(port: nodes[victim]!.port)
    }
    pump(2 * timingFactor)

    let expected = await publisher.stopByUser()
    let deadline = MonotonicClock.seconds() + 30 * timingFactor
    while MonotonicClock.seconds() < deadline
      && readers.contains(where: { ($0.reader.messages.last?.upstreamID ?? 0) < (expected[$0.user]?.last ?? 0) })
    {
      pump(0.05)
    }
    pump(0.3)
    let stats = await fixture.statistics()

    // 3. An account nobody reads any more gives up its lease once its grace (2 s) ends on the node polling it.
    let idle = Self.accounts[1]
    for entry in readers where entry.user == idle { entry.reader.client = nil }
    let released = MonotonicClock.seconds()
    while Self.holder(of: idle, redis: redis) != nil && MonotonicClock.seconds() - released < 15 * timingFactor {
      pump(0.1)
    }
    let leaseGone = Self.holder(of: idle, redis: redis) == nil
    let releasedAfter = MonotonicClock.seconds() - released

    for node in nodes { node?.kill9() }
    await fixture.shutdown()

    let perAccount = Self.accounts.map { user in
      "\(user): \(expected[user]?.count ?? 0) sent, most polls at once \(stats.users[user]?.maxPollsInFlight ?? -1)"
    }
    print(
      "cluster accounts test: 3 nodes, \(Self.accounts.count) accounts x 2 subscribers on different nodes; node-\(victim)"
        + " polled \(victimPolled) and was killed, taken over in \(String(format: "%.2f", failover ?? -1)) s (lease"
        + " 1 s); redis restarted; idle account's lease gone after \(String(format: "%.1f", releasedAfter)) s;"
        + " \(perAccount.joined(separator: "; ")); fixture sessions \(stats.sessions)")
    #expect(leaseGone, "the idle account's lease was released")
    for user in Self.accounts {
      #expect((expected[user]?.count ?? 0) > 50, "the fixture took a steady stream for \(user)")
      #expect(stats.users[user]?.maxPollsInFlight ?? 0 <= 1, "account \(user) had two polls in flight")
      let mine = readers.filter { $0.user == user }.map(\.reader)
      expectExactlyOnce(mine, expected: expected[user] ?? [], log: relayLog)
    }
  }
}
