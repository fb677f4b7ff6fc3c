import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// Redis trouble never holds the relay's loop: a hung Redis (SIGSTOP) is dropped and `/readyz` turns 503 within
/// the lease, and a Redis host name whose lookup never answers (a DNS server that drops queries, in a mount
/// namespace of the relay's own) costs `/healthz` nothing, and SIGTERM still stops the relay cleanly.
/// It needs root: the relay runs in a mount namespace of its own (`unshare -m`) with its own /etc/hosts and
/// /etc/resolv.conf, as CI runs the suite.
@Suite(.serialized, .timeLimit(.minutes(3)), .enabled(if: getuid() == 0, "needs root for a mount namespace"))
struct RedisTroubleTests {
  /// A UDP socket on 127.0.0.99:53 that takes DNS queries and never answers them (an address of its own in
  /// 127/8, so a local resolver on 127.0.0.1 or 127.0.0.53 is never in the way).
  final class SilentDNS {
    let fd: Int32
    init?() {
      fd = socket(AF_INET, Int32(SOCK_DGRAM.rawValue), 0)
      var address = sockaddr_in()
      address.sin_family = sa_family_t(AF_INET)
      address.sin_port = UInt16(53).bigEndian
      address.sin_addr.s_addr = inet_addr("127.0.0.99")
      let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
      }
      if bound != 0 {
        close(fd)
        return nil
      }
    }
    deinit { close(fd) }
  }

  static func timed(_ port: Int, _ path: String) -> (status: Int, seconds: Double) {
    let started = MonotonicClock.seconds()
    let status =
      (try? rawExchange(port: port, "GET \(path) HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout: 5))?
      .statuses.first ?? 0
    return (status, MonotonicClock.seconds() - started)
  }

  static func waitFor(_ port: Int, _ path: String, status: Int, within seconds: Double) async -> Double? {
    let started = MonotonicClock.seconds()
    while MonotonicClock.seconds() - started < seconds {
      if timed(port, path).status == status { return MonotonicClock.seconds() - started }
      try? await Task.sleep(for: .milliseconds(50))
    }
    return nil
  }

  @Test func aHungRedisAndANameThatNeverResolvesNeverHoldTheLoop() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-trouble-\(UUID())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    guard let dns = SilentDNS() else {
      Issue.record("127.0.0.99:53 is taken: cannot stand in for a DNS server that never answers")
      return
    }
    let probe = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
    let redisPort = probe.port
    close(probe.fd)
    let redis = try ClusterTests.RedisProcess(directory: directory, tcpPort: redisPort)
    defer { redis.stop() }
    let hosts = directory.appendingPathComponent("hosts").path
    let resolv = directory.appendingPathComponent("resolv.conf").path
    try "127.0.0.1 localhost\n127.0.0.1 redis-test\n".write(toFile: hosts, atomically: false, encoding: .utf8)
    try "nameserver 127.0.0.99\noptions timeout:30 attempts:1\n".write(
      toFile: resolv, atomically: false, encoding: .utf8)
    let fixture = try await LegacyFixture.start(LegacyFixture.Options())
    let log = directory.appendingPathComponent("relay.log")
    FileManager.default.createFile(atPath: log.path, contents: nil)
    let relay = try RelayProcess(
      fixture: fixture.address,
      store: [
        "--store-kind", "redis", "--store-redis-url", "redis://redis-test:\(redisPort)", "--store-lease-seconds", "1",
      ], log: log, extra: ["--log-level", "info"],
      launcher: [
        "/usr/bin/unshare", "-m", "/bin/sh", "-c",
        "mount --bind \(hosts) /etc/hosts && mount --bind \(resolv) /etc/resolv.conf && exec \"$0\" \"$@\"",
      ])
    try await waitReady(port: relay.port, timeout: 20 * timingFactor)

    // Settled: ready three times in a row (a node that just took the lease is briefly not ready).
    var streak = 0
    let settle = MonotonicClock.seconds() + 20 * timingFactor
    while streak < 3 && MonotonicClock.seconds() < settle {
      streak = Self.timed(relay.port, "/readyz").status == 200 ? streak + 1 : 0
      try await Task.sleep(for: .milliseconds(100))
    }
    // Hung: SIGSTOP. Replies never come; the connection is dropped without waiting for them.
    let pid = try #require(redis.process?.processIdentifier)
    kill(pid, SIGSTOP)
    let unready = await Self.waitFor(relay.port, "/readyz", status: 503, within: 6 * timingFactor)
    // And it stays 503 for the rest of the hang (a reconnect the kernel accepts is not Redis answering).
    var flaps = 0
    for _ in 0..<20 where unready != nil {
      if Self.timed(relay.port, "/readyz").status == 200 { flaps += 1 }
      try await Task.sleep(for: .milliseconds(100))
    }
    kill(pid, SIGCONT)
    #expect(unready != nil, "/readyz stayed 200 while Redis hung")
    #expect(flaps == 0, "/readyz said ready \(flaps) times in 2 s of a hung Redis")
    print("redis trouble: /readyz 503 \(unready.map { String(format: "%.2f", $0) } ?? "never") s after SIGSTOP")
    #expect(await Self.waitFor(relay.port, "/readyz", status: 200, within: 10 * timingFactor) != nil)

    // The name stops resolving (its hosts entry goes, and DNS never answers), and Redis goes away.
    try "127.0.0.1 localhost\n".write(toFile: hosts, atomically: false, encoding: .utf8)
    redis.stop()
    #expect(await Self.waitFor(relay.port, "/readyz", status: 503, within: 6 * timingFactor) != nil)
    var slowest = 0.0
    for _ in 0..<30 {
      let (status, seconds) = Self.timed(relay.port, "/healthz")
      #expect(status == 200)
      slowest = max(slowest, seconds)
      try await Task.sleep(for: .milliseconds(100))
    }
    print("redis trouble: slowest /healthz over 3 s of lookups that never answer: \(Int(slowest * 1000)) ms")
    #expect(slowest < 0.5 * timingFactor, "the loop was held \(slowest) s")
    // And a graceful stop is still graceful.
    // With no stream open this takes well under a second; a lookup that held a shared worker thread once made it
    // take 12-16 s (the shutdown task waited for a thread).
    let stopping = MonotonicClock.seconds()
    kill(relay.process.processIdentifier, SIGTERM)
    let deadline = stopping + 5 * timingFactor
    while relay.process.isRunning && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(20))
    }
    #expect(
      !relay.process.isRunning,
      "SIGTERM did not stop the relay; its log ends with:\n\((try? String(contentsOf: log, encoding: .utf8))?.suffix(3000) ?? "")"
    )
    if !relay.process.isRunning {
      #expect(relay.process.terminationStatus == 0)
      print("redis trouble: SIGTERM to exit \(Int((MonotonicClock.seconds() - stopping) * 1000)) ms")
    }
    withExtendedLifetime(dns) {}
    await fixture.shutdown()
  }
}
