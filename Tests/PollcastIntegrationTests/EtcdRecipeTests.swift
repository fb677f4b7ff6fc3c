import Foundation
import PollcastCore
import Testing

/// `Config/recipes/etcd-v2.json` against a real etcd (Debian's `etcd-server`, v2 API on): relayed exactly once,
/// resumed across a `kill -9` with the SQLite store, and recovered from etcd's "index cleared" answer (HTTP 400,
/// `errorCode 401`) with a `resync` status event where etcd dropped history. `recipe check` shows what it would
/// relay.
@Suite(.serialized, .timeLimit(.minutes(5))) struct EtcdRecipeTests {
  /// etcd on two free loopback ports (client, peer), its data and log in `directory`.
  final class Etcd {
    let server: LocalServer
    var port: Int { server.ports[0] }
    var url: String { "http://127.0.0.1:\(port)" }

    init(directory: URL) throws {
      server = try LocalServer(
        "etcd", executable: "/usr/bin/etcd", portCount: 2, directory: directory, timeout: 20 * timingFactor,
        arguments: { ports in
          let (client, peer) = (ports[0], ports[1])
          return [
            "--enable-v2=true", "--data-dir", directory.appendingPathComponent("etcd-\(client)").path,
            "--listen-client-urls", "http://127.0.0.1:\(client)", "--advertise-client-urls",
            "http://127.0.0.1:\(client)", "--listen-peer-urls", "http://127.0.0.1:\(peer)",
            "--initial-advertise-peer-urls", "http://127.0.0.1:\(peer)", "--initial-cluster",
            "default=http://127.0.0.1:\(peer)",
          ]
        },
        ready: { ports in
          let answer = try? run("/usr/bin/curl", ["-sf", "http://127.0.0.1:\(ports[0])/version"], timeout: 2)
          return answer?.code == 0
        })
    }

    /// Sets `key` to `value`; returns the write's modifiedIndex.
    @discardableResult
    func put(_ key: String, _ value: String) throws -> UInt64 {
      let answer = try run("/usr/bin/curl", ["-sf", "-XPUT", "\(url)/v2/keys\(key)", "-d", "value=\(value)"])
      guard answer.code == 0, let json = try? RawJSON.parse(answer.stdout),
        let index = json.resolve(pointer: "/node/modifiedIndex")?.unsignedID
      else { throw TestSSEClient.Failure(description: "etcd PUT failed: \(answer.stdout) \(answer.stderr)") }
      return index
    }
  }

  static var recipePath: String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
      "../../Config/recipes/etcd-v2.json"
    )
    .standardized.path
  }

  func relay(_ etcd: Etcd, store: String, log: URL) throws -> RelayProcess {
    try RelayProcess(
      arguments: [
        "--listen", "127.0.0.1:0", "--upstream-adapter", "recipe", "--upstream-recipe", EtcdRecipeTests.recipePath,
        "--store-kind", "sqlite", "--store-path", store, "--upstream-backoff-base-seconds", "0.05",
        "--upstream-backoff-cap-seconds", "0.2", "--log-level", "info",
      ], log: log, environment: ["ETCD_URL": etcd.url])
  }

  @Test func relaysResumesAndRecoversFromAClearedIndex() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-etcd-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let etcd = try Etcd(directory: directory)
    let logs = try NodeLogs("pollcast-etcd-logs", nodes: 1)
    defer { logs.remove() }
    let store = directory.appendingPathComponent("relay.db").path
    var node = try relay(etcd, store: store, log: logs.files[0])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let reader = Reader()
    try reader.connect(port: node.port)
    reader.pump(for: 0.3)
    var expected: [UInt64] = []
    for n in 0..<20 { expected.append(try etcd.put("/config/a", "first-\(n)")) }
    let firstDeadline = MonotonicClock.seconds() + 10 * timingFactor
    while reader.messages.count < 20 && MonotonicClock.seconds() < firstDeadline { reader.pump(for: 0.1) }
    // Writes go on while the relay is killed and restarted: the stored cursor picks up where it stood.
    node.kill9()
    for n in 0..<10 { expected.append(try etcd.put("/config/b", "while-down-\(n)")) }
    _ = try etcd.put("/elsewhere", "not watched")
    node = try relay(etcd, store: store, log: logs.files[0])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    try reader.connect(port: node.port)
    for n in 0..<10 { expected.append(try etcd.put("/config/c", "after-\(n)")) }
    let deadline = MonotonicClock.seconds() + 10 * timingFactor
    while reader.messages.count < expected.count && MonotonicClock.seconds() < deadline { reader.pump(for: 0.1) }
    expectExactlyOnce([reader], expected: expected, log: { logs.tails() })

    // Down again while more than etcd's 1,000 kept events happen: the stored cursor is cleared on restart. The
    // relay jumps to etcd's index and says so (a `resync` event), then relays the next write.
    node.kill9()
    let beforeGap = reader.lastID
    let lost = try etcd.put("/config/a", "lost-while-down")
    for n in 0..<1010 { _ = try etcd.put("/other/x", String(n)) }
    node = try relay(etcd, store: store, log: logs.files[0])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let resumed = try TestSSEClient(port: node.port, headers: beforeGap.map { [("Last-Event-ID", $0)] } ?? [])
    let after = try etcd.put("/config/a", "after-the-gap")
    let gapDeadline = MonotonicClock.seconds() + 10 * timingFactor
    while MonotonicClock.seconds() < gapDeadline
      && !resumed.events.contains(where: { $0.data.contains("after-the-gap") })
    {
      _ = try? resumed.pump(timeout: 0.1)
    }
    let resync = resumed.events.first { $0.type == "upstream" && $0.data.contains("\"resync\"") }
    #expect(resync != nil, "a resync status event marks the gap: \(resumed.events.map(\.data))")
    #expect(resync?.data.contains("\"reason\":\"recipe_rules[1]\"") == true)
    let relayed = resumed.events.filter { $0.type == "message" }.map(\.data)
    #expect(relayed.count == 1 && relayed.first?.contains("\"upstream_id\":\"\(after)\"") == true, "\(relayed)")
    #expect(!relayed.contains { $0.contains("\"upstream_id\":\"\(lost)\"") }, "etcd no longer has it")
    let log = logs.tails()
    #expect(log.contains("upstream reset the cursor and dropped events"), "\(log)")
    // The gap is an event with an id, stored with the feed: a client that comes back later from before it meets
    // it in the replay, before the first message after it.
    let returning = try TestSSEClient(port: node.port, headers: beforeGap.map { [("Last-Event-ID", $0)] } ?? [])
    let returnDeadline = MonotonicClock.seconds() + 10 * timingFactor
    while MonotonicClock.seconds() < returnDeadline
      && !returning.events.contains(where: { $0.data.contains("after-the-gap") })
    {
      _ = try? returning.pump(timeout: 0.1)
    }
    let replayed = returning.events.filter { $0.type == "gap" || $0.type == "message" }
    let gapAt = try #require(replayed.firstIndex { $0.type == "gap" }, "\(returning.events.map(\.type))")
    #expect(replayed[gapAt].hadID)
    #expect(replayed[gapAt].data.contains("\"reason\":\"recipe_rules[1]\""), "\(replayed[gapAt].data)")
    #expect(replayed[gapAt].data.contains("\"stream\":"), "\(replayed[gapAt].data)")
    #expect(replayed.last?.data.contains("after-the-gap") == true && gapAt < replayed.count - 1)
    node.kill9()
  }

  @Test func recipeCheckShowsTheSessionThePollsAndTheEvents() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-etcd-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let etcd = try Etcd(directory: directory)
    let index = try etcd.put("/config/a", "before")
    let check = Process()
    check.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
    check.arguments = [
      "recipe", "check", "--upstream-adapter", "recipe", "--upstream-recipe", EtcdRecipeTests.recipePath, "--polls",
      "2", "--hold", String(4 * timingFactor),
    ]
    check.environment = ProcessInfo.processInfo.environment.merging(["ETCD_URL": etcd.url]) { _, new in new }
    let out = Pipe()
    check.standardOutput = out
    try check.run()
    try await Task.sleep(for: .milliseconds(Int(1500 * timingFactor)))
    let written = try etcd.put("/config/a", "during the check")
    check.waitUntilExit()
    let transcript = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    #expect(check.terminationStatus == 0, "\(transcript)")
    #expect(transcript.contains("session ready; cursor config=\(index)"), "\(transcript)")
    #expect(transcript.contains("waitIndex=\(index + 1)"), "\(transcript)")
    #expect(transcript.contains("event stream=config id=\(written) backlog=false"), "\(transcript)")
    #expect(transcript.contains("cursor moved to config=\(written)"), "\(transcript)")
    #expect(transcript.contains("✓"), "\(transcript)")
  }
}
