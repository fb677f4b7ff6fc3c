import Foundation
import PollcastCore

/// An in-process relay on 127.0.0.1:0 for a test, shut down by `stop()` (call it on every path).
struct RelayHarness: StoppableHarness {
  let relay: Relay
  var port: Int { relay.port }

  static func start(
    feed: FeedSettings = FeedSettings(heartbeatInterval: 5),
    server: ServerSettings = ServerSettings(host: "127.0.0.1", port: 0),
    ids: EventIDAllocator = EventIDAllocator()
  ) async throws -> RelayHarness {
    let relay = try await Relay.start(
      server: server, feed: feed, logger: Logger(label: "test", level: .warning), ids: ids)
    return RelayHarness(relay: relay)
  }

  func stop() async { await relay.shutdown(deadline: 2) }

  /// Publishes `count` messages on `stream` with payloads `"<prefix><n>"`; returns their ids.
  @discardableResult
  func publish(_ count: Int, stream: String = "101", prefix: String = "m") async -> [UInt64] {
    let events = (0..<count).map { FeedEvent(stream: stream, data: "\(prefix)\($0)") }
    return await relay.feed.publish(events)
  }

  func statistics() async -> FeedStatistics { await relay.feed.statistics() }

  /// Waits until the feed's connected-subscriber count satisfies `predicate`.
  func waitForSubscribers(timeout: Double = 10, _ predicate: (Int) -> Bool) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while !predicate(await statistics().subscribersConnected) {
      guard MonotonicClock.seconds() < deadline else {
        throw TestSSEClient.Failure(
          description: "subscriber count stuck at \(await statistics().subscribersConnected)")
      }
      try await Task.sleep(for: .milliseconds(10))
    }
  }
}

/// Runs a process to completion and returns its exit code and output. Output goes through temporary files, not
/// pipes, so a large output cannot block the child while we wait for it to exit.
func run(_ executable: String, _ arguments: [String], timeout: Double = 30) throws -> (
  code: Int32, stdout: String, stderr: String
) {
  let directory = FileManager.default.temporaryDirectory
  let token = UUID().uuidString
  let outURL = directory.appendingPathComponent("pollcast-run-\(token).out")
  let errURL = directory.appendingPathComponent("pollcast-run-\(token).err")
  FileManager.default.createFile(atPath: outURL.path, contents: nil)
  FileManager.default.createFile(atPath: errURL.path, contents: nil)
  defer {
    try? FileManager.default.removeItem(at: outURL)
    try? FileManager.default.removeItem(at: errURL)
  }
  let out = try FileHandle(forWritingTo: outURL)
  let err = try FileHandle(forWritingTo: errURL)
  let process = Process()
  process.executableURL = URL(fileURLWithPath: executable)
  process.arguments = arguments
  process.standardOutput = out
  process.standardError = err
  try process.run()
  let deadline = Date().addingTimeInterval(timeout)
  while process.isRunning && Date() < deadline { usleep(5_000) }
  if process.isRunning { process.terminate() }
  process.waitUntilExit()
  try? out.close()
  try? err.close()
  return (
    process.terminationStatus, (try? String(contentsOf: outURL, encoding: .utf8)) ?? "",
    (try? String(contentsOf: errURL, encoding: .utf8)) ?? ""
  )
}

/// Path of a product built next to the tests (`.build/debug/NAME`).
func builtProduct(_ name: String) -> String {
  let bundle = Bundle.main.bundleURL  // .build/<triple>/debug/...
  var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
  for candidate in [directory, bundle.deletingLastPathComponent()] {
    let path = candidate.appendingPathComponent(name).path
    if FileManager.default.isExecutableFile(atPath: path) { return path }
  }
  while directory.path != "/" {
    let path = directory.appendingPathComponent(name).path
    if FileManager.default.isExecutableFile(atPath: path) { return path }
    directory.deleteLastPathComponent()
  }
  return name
}

/// Open file descriptors of this process.
func openDescriptorCount() -> Int {
  (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd").count) ?? -1
}

/// The memory a leak check measures: under a sanitizer, the bytes its allocator holds for live allocations; in a plain
/// build, the resident set. Not RSS under a sanitizer: ASan keeps freed blocks in a quarantine of up to 256 MB, so RSS
/// grows as the quarantine fills (CI saw +7.2 MB over a loop that leaks nothing, and −234 MB on another run).
func liveMemory() -> (bytes: Int, measure: String) {
  typealias Counter = @convention(c) () -> Int
  if let symbol = dlsym(nil, "__sanitizer_get_current_allocated_bytes") {
    return (unsafeBitCast(symbol, to: Counter.self)(), "live heap bytes (sanitizer allocator)")
  }
  return (residentBytes(), "RSS growth")
}

/// Resident memory of this process in bytes.
func residentBytes() -> Int {
  guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
  let fields = text.split(separator: " ")
  return (Int(fields[1]) ?? 0) * Int(sysconf(Int32(_SC_PAGESIZE)))
}

/// How much slower than a plain debug build this run is allowed to be: `.ci/run` sets TEST_TIMING_FACTOR
/// for the sanitizer passes (ASan and TSan slow the relay several times). Scales timing bounds only, never counts.
/// Not a POLLCAST_ variable: the relay processes the tests start inherit the environment and refuse unknown ones.
let timingFactor = Double(ProcessInfo.processInfo.environment["TEST_TIMING_FACTOR"] ?? "") ?? 1
