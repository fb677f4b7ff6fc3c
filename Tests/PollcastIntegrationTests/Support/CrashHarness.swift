import Foundation
import LegacyFixture
import PollcastCore
import Testing

// The crash tests' parts (durable store, cluster): the real relay binary, and subscribers that reconnect with
// their last id across kills.

/// The relay binary on a store (`--store-*` arguments), its port read from its first line, its log kept for failures.
final class RelayProcess {
  let process = Process()
  let port: Int

  /// - Parameter launcher: a command that runs the relay (its path and arguments follow), e.g. `unshare` for a
  ///   mount namespace of its own.
  convenience init(fixture: String, store: [String], log: URL, extra: [String] = [], launcher: [String] = []) throws {
    try self.init(
      arguments: [
        "--listen", "127.0.0.1:0", "--upstream-url", "http://\(fixture)", "--upstream-api-key", "dev-key",
        "--upstream-poll-timeout-seconds", "2",
        "--upstream-backoff-base-seconds", "0.05", "--upstream-backoff-cap-seconds", "0.2", "--log-level", "warning",
      ] + store + extra, log: log, launcher: launcher)
  }

  /// The relay with exactly `arguments` (and `environment` added to the test's own).
  init(arguments: [String], log: URL, launcher: [String] = [], environment: [String: String] = [:]) throws {
    if !environment.isEmpty {
      process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
    }
    if let first = launcher.first {
      process.executableURL = URL(fileURLWithPath: first)
      process.arguments = launcher.dropFirst() + [builtProduct("pollcast")] + arguments
    } else {
      process.executableURL = URL(fileURLWithPath: builtProduct("pollcast"))
      process.arguments = arguments
    }
    let out = Pipe()
    process.standardOutput = out
    let handle = try FileHandle(forWritingTo: log)
    handle.seekToEndOfFile()
    process.standardError = handle
    try process.run()
    guard let port = listeningPort(of: out, timeout: 30 * timingFactor) else {
      process.terminate()
      let tail = (try? String(contentsOf: log, encoding: .utf8))?.suffix(3000) ?? ""
      throw TestSSEClient.Failure(description: "the relay did not start; its log ends with:\n\(tail)")
    }
    self.port = port
  }

  func kill9() {
    kill(process.processIdentifier, SIGKILL)
    process.waitUntilExit()
  }

  deinit { if process.isRunning { kill9() } }
}

/// The crash tests' steady stream: one message every 2–4 ms, to user 101 or in turn to each of `users`, recorded as
/// the fixture accepts it.
final class SteadyPublisher: Sendable {
  private let accepted = Locked<[String: [UInt64]]>([:])
  private let publishing = Locked(true)
  private let task: Task<Void, Never>
  private let users: [String]

  init(fixture: LegacyFixture, users: [String] = ["101"]) {
    self.users = users
    let accepted = accepted
    let publishing = publishing
    task = Task.detached {
      var counter = 0
      while publishing.withLock({ $0 }) {
        counter += 1
        let user = users[counter % users.count]
        let ids = await fixture.append(user: user, texts: ["m\(counter)"])
        accepted.withLock { $0[user, default: []] += ids }
        try? await Task.sleep(for: .milliseconds(Int.random(in: 2...4)))
      }
    }
  }

  /// Stops the stream and returns the upstream ids of every message the fixture accepted, in order, per user.
  func stopByUser() async -> [String: [UInt64]] {
    publishing.withLock { $0 = false }
    await task.value
    return accepted.withLock { $0 }
  }

  /// Stops the stream and returns the first user's ids (the only user's, by default).
  func stop() async -> [UInt64] { await stopByUser()[users[0]] ?? [] }
}

/// One log file per relay process in a fresh temporary directory (processes writing one file would overwrite
/// each other's lines), and their tails for a failure message.
struct NodeLogs {
  let directory: URL
  let files: [URL]

  init(_ name: String, nodes: Int) throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(name)-\(UUID())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    let files = (0..<nodes).map { directory.appendingPathComponent("node-\($0).log") }
    for file in files where !FileManager.default.createFile(atPath: file.path, contents: nil) {
      throw TestSSEClient.Failure(description: "cannot create \(file.path)")
    }
    self.directory = directory
    self.files = files
  }

  /// The last 3,000 characters of each node's log.
  func tails() -> String {
    files.map { log in
      "\(log.lastPathComponent):\n" + String((try? String(contentsOf: log, encoding: .utf8))?.suffix(3000) ?? "")
    }.joined(separator: "\n")
  }

  func remove() { try? FileManager.default.removeItem(at: directory) }
}

/// One subscriber across reconnections: everything it received, and the last id to resume from.
final class Reader {
  var lastID: String?
  var messages: [(sseID: UInt64, upstreamID: UInt64)] = []
  var resets = 0
  var client: TestSSEClient?
  /// Sent with every connection (per-user relaying: the account's key).
  var headers: [(String, String)] = []
  private var seen = 0

  func connect(port: Int) throws {
    client = try TestSSEClient(port: port, headers: headers + (lastID.map { [("Last-Event-ID", $0)] } ?? []))
    seen = 0
  }

  /// Takes the complete events that arrived (a half-received event at a kill is not one).
  func collect() {
    guard let client else { return }
    let events = client.events
    for event in events[seen...] {
      if event.type == "reset" { resets += 1 }
      if event.hadID && !event.lastEventID.isEmpty { lastID = event.lastEventID }
      guard event.type == "message", event.hadID, let sseID = UInt64(event.lastEventID),
        let json = try? RawJSON.parse(event.data), let upstreamID = json["upstream_id"]?.unsignedID
      else { continue }
      messages.append((sseID, upstreamID))
    }
    seen = events.count
  }

  func pump(for seconds: Double) {
    let deadline = MonotonicClock.seconds() + seconds
    while MonotonicClock.seconds() < deadline, let client, !client.isEOF {
      _ = try? client.pump(timeout: 0.01)
      collect()
    }
  }
}

func waitReady(port: Int, timeout: Double) async throws {
  let deadline = MonotonicClock.seconds() + timeout
  while MonotonicClock.seconds() < deadline {
    if let answer = try? httpGet(port: port, "/readyz"), answer.status == 200 { return }
    try await Task.sleep(for: .milliseconds(20))
  }
  throw TestSSEClient.Failure(description: "the relay did not become ready")
}

/// Each reader holds every id of `expected` exactly once, in order, under strictly increasing SSE ids, and got no
/// reset. Failures name the first few ids, not two arrays of thousands; `log` is recorded when ids are wrong.
func expectExactlyOnce(
  _ readers: [Reader], expected: [UInt64], log: () -> String, sourceLocation: SourceLocation = #_sourceLocation
) {
  for (index, reader) in readers.enumerated() {
    let upstreamIDs = reader.messages.map(\.upstreamID)
    let sseIDs = reader.messages.map(\.sseID)
    var counts: [UInt64: Int] = [:]
    for id in upstreamIDs { counts[id, default: 0] += 1 }
    let duplicated = counts.filter { $0.value > 1 }.keys.sorted()
    let missing = Set(expected).subtracting(upstreamIDs).sorted()
    let firstDifference = zip(upstreamIDs, expected).enumerated().first { $0.element.0 != $0.element.1 }?.offset
    // Compact messages: a failure names the first few ids, not two arrays of thousands.
    #expect(reader.resets == 0, "subscriber \(index) got a reset", sourceLocation: sourceLocation)
    #expect(upstreamIDs.count == expected.count, "subscriber \(index): count", sourceLocation: sourceLocation)
    let duplicatedUnder = duplicated.prefix(5).map { id in
      "\(id) as " + reader.messages.filter { $0.upstreamID == id }.map { String($0.sseID) }.joined(separator: "/")
    }
    #expect(
      duplicated.isEmpty, "subscriber \(index): duplicated upstream ids \(duplicatedUnder)",
      sourceLocation: sourceLocation)
    #expect(
      missing.isEmpty, "subscriber \(index): missing upstream ids \(missing.prefix(10))", sourceLocation: sourceLocation
    )
    #expect(
      firstDifference == nil, "subscriber \(index): out of order from position \(firstDifference ?? -1)",
      sourceLocation: sourceLocation)
    let increasing = zip(sseIDs, sseIDs.dropFirst()).allSatisfy { $0 < $1 }
    #expect(increasing, "subscriber \(index): SSE ids do not strictly increase", sourceLocation: sourceLocation)
    if !duplicated.isEmpty || !missing.isEmpty { Issue.record("relay log: \(log())", sourceLocation: sourceLocation) }
  }
}
