import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// `store.kind = redis` (DESIGN, "Where events live"; issue 12): three relay processes on one real `redis-server`
/// and the real fixture, subscribers on every node, the leader killed with `kill -9`, a client moving between
/// nodes, and Redis restarted, with nothing lost, nothing repeated and never two polls in flight.
@Suite(.serialized, .timeLimit(.minutes(10))) struct ClusterTests {
  /// `redis-server` on a unix socket in `directory`, with AOF on (a restart keeps what it acknowledged).
  final class RedisProcess {
    let directory: URL
    var process: Process?
    var socket: String { directory.appendingPathComponent("redis.sock").path }
    var url: String { "unix://\(socket)" }

    /// Also listens on 127.0.0.1:`tcpPort` when given (0 or nil: the unix socket only).
    let tcpPort: Int

    init(directory: URL, tcpPort: Int = 0) throws {
      self.directory = directory
      self.tcpPort = tcpPort
      try start()
    }

    func start() throws {
      let process = Process()
      process.executableURL = URL(fileURLWithPath: "/usr/bin/redis-server")
      process.arguments = [
        "--port", String(tcpPort), "--bind", "127.0.0.1", "--unixsocket", socket, "--unixsocketperm", "700", "--save",
        "", "--appendonly", "yes",
        "--dir", directory.path, "--logfile", directory.appendingPathComponent("redis.log").path,
      ]
      try process.run()
      self.process = process
      let deadline = MonotonicClock.seconds() + 10 * timingFactor
      while MonotonicClock.seconds() < deadline {
        if FileManager.default.fileExists(atPath: socket), (try? RedisProcess.ping(socket)) == true { return }
        Thread.sleep(forTimeInterval: 0.02)
      }
      throw TestSSEClient.Failure(description: "redis-server did not start")
    }

    /// A graceful stop: `SHUTDOWN` (Redis syncs its AOF, then exits). Not SIGTERM: a test runner may start its
    /// children with termination signals blocked.
    func stop() {
      guard let process, process.isRunning else { return }
      _ = try? RedisProcess.send("SHUTDOWN", to: socket)
      let deadline = MonotonicClock.seconds() + 10
      while process.isRunning && MonotonicClock.seconds() < deadline { Thread.sleep(forTimeInterval: 0.01) }
      if process.isRunning { kill(process.processIdentifier, SIGKILL) }
      process.waitUntilExit()
      self.process = nil
    }

    static func ping(_ socket: String) throws -> Bool { try send("PING", to: socket).hasPrefix("+PONG") }

    /// Sends one inline command to Redis on `socket` and returns the first bytes of its answer (a raw exchange
    /// over a unix socket: a test probe only, the relay uses hiredis).
    static func send(_ command: String, to socket: String) throws -> String {
      let fd = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
      guard fd >= 0 else { return "" }
      defer { close(fd) }
      var address = sockaddr_un()
      address.sun_family = sa_family_t(AF_UNIX)
      withUnsafeMutableBytes(of: &address.sun_path) { path in
        for (index, byte) in socket.utf8.prefix(path.count - 1).enumerated() { path[index] = byte }
      }
      let connected = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
        }
      }
      guard connected == 0 else { return "" }
      let line = Array("\(command)\r\n".utf8)
      guard write(fd, line, line.count) == line.count else { return "" }
      var buffer = [UInt8](repeating: 0, count: 64)
      let count = read(fd, &buffer, buffer.count)
      return count > 0 ? String(decoding: buffer[0..<count], as: UTF8.self) : ""
    }

    deinit { stop() }
  }

  static func redisArguments(_ redis: RedisProcess, node: Int) -> [String] {
    [
      "--store-kind", "redis", "--store-redis-url", redis.url, "--store-lease-seconds", "1", "--store-node-id",
      "node-\(node)",
    ]
  }

  /// The node whose `/readyz` says it leads the feed, if any.
  static func leader(_ nodes: [RelayProcess?]) -> Int? {
    nodes.indices.first { index in
      guard let node = nodes[index], let answer = try? httpGet(port: node.port, "/readyz") else { return false }
      return answer.body.contains("\"reason\":\"leader")
    }
  }

  @Test func killTheLeaderMoveAClientRestartRedisLoseAndRepeatNothing() async throws {
    let nodeLogs = try NodeLogs("pollcast-cluster", nodes: 3)
    defer { nodeLogs.remove() }
    let directory = nodeLogs.directory
    let logs = nodeLogs.files
    func relayLog() -> String { nodeLogs.tails() }

    let redis = try RedisProcess(directory: directory)
    var options = LegacyFixture.Options()
    options.linkedUserID = nil
    let fixture = try await LegacyFixture.start(options)
    var nodes: [RelayProcess?] = []
    for index in 0..<3 {
      nodes.append(
        try RelayProcess(
          fixture: fixture.address, store: Self.redisArguments(redis, node: index), log: logs[index],
          extra: ["--log-level", "info"]))
    }
    for node in nodes { try await waitReady(port: node!.port, timeout: 20 * timingFactor) }
    // Two subscribers per node.
    let readers = (0..<6).map { _ in Reader() }
    var home = readers.indices.map { $0 % 3 }
    for (index, reader) in readers.enumerated() { try reader.connect(port: nodes[home[index]]!.port) }
    func pump(_ seconds: Double) {
      let until = MonotonicClock.seconds() + seconds
      repeat {
        for reader in readers where reader.client != nil { reader.pump(for: 0.005) }
      } while MonotonicClock.seconds() < until
    }
    pump(0.2)

    let publisher = SteadyPublisher(fixture: fixture)
    pump(1 * timingFactor)

    // 1. kill -9 the leader mid-stream; its subscribers resume on the next node.
    let first = try #require(Self.leader(nodes), "a node leads the feed")
    let killedAt = MonotonicClock.seconds()
    nodes[first]!.kill9()
    nodes[first] = nil
    for index in readers.indices where home[index] == first {
      home[index] = (first + 1) % 3
      try readers[index].connect(port: nodes[home[index]]!.port)
    }
    var second: Int?
    while second == nil && MonotonicClock.seconds() - killedAt < 15 * timingFactor {
      pump(0.02)
      second = Self.leader(nodes)
    }
    let failover = MonotonicClock.seconds() - killedAt
    let newLeader = try #require(second, "another node took over")
    pump(0.5 * timingFactor)

    // 2. A client moves from node A to node C with its Last-Event-ID, after a while away.
    let mover = try #require(readers.indices.first { home[$0] != newLeader })
    let target = try #require(nodes.indices.first { nodes[$0] != nil && $0 != home[mover] })
    readers[mover].client = nil
    pump(0.5 * timingFactor)
    let movedFrom = home[mover]
    home[mover] = target
    let missedBefore = readers[mover].messages.count
    try readers[mover].connect(port: nodes[target]!.port)
    pump(0.5 * timingFactor)
    #expect(readers[mover].messages.count > missedBefore, "the moved client got what it missed")

    // 3. Redis restarts (gracefully, AOF on) mid-stream, down for longer than the lease: the leader stops polling
    // before its lease can expire, and a node takes the feed again once Redis is back. The killed node comes back.
    redis.stop()
    pump(1.5 * timingFactor)
    try redis.start()
    nodes[first] = try RelayProcess(
      fixture: fixture.address, store: Self.redisArguments(redis, node: first), log: logs[first],
      extra: ["--log-level", "info"])
    pump(2 * timingFactor)

    let expected = await publisher.stop()
    let deadline = MonotonicClock.seconds() + 30 * timingFactor
    while MonotonicClock.seconds() < deadline
      && readers.contains(where: { ($0.messages.last?.upstreamID ?? 0) < (expected.last ?? 0) })
    {
      pump(0.05)
    }
    pump(0.3)
    let stats = await fixture.statistics()
    for node in nodes { node?.kill9() }
    await fixture.shutdown()

    print(
      "cluster test: 3 nodes, leader node-\(first) killed, failover to node-\(newLeader) in "
        + "\(String(format: "%.2f", failover)) s (lease 1 s); client moved node-\(movedFrom) -> node-\(target);"
        + " redis restarted; \(expected.count) messages accepted; received per subscriber: "
        + readers.map { String($0.messages.count) }.joined(separator: ", ")
        + "; fixture max concurrent polls \(stats.maxConcurrentPolls), sessions \(stats.sessions)")
    #expect(expected.count > 300, "the fixture took a steady stream")
    #expect(failover < 5 * timingFactor, "failover took \(failover) s with a 1 s lease")
    #expect(stats.maxConcurrentPolls <= 1, "two polls were in flight at once")
    expectExactlyOnce(readers, expected: expected, log: relayLog)
  }
}
