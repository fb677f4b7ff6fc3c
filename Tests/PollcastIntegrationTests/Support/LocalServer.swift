import Foundation
import PollcastCore

/// A real server (etcd, nginx, chromedriver) that a test starts on free loopback ports, with its output in a log file.
///
/// A port picked by binding port 0 and closing it can be taken again before the server binds it, and a server on a
/// fresh machine can fail to come up once (CI saw etcd not answer for 20 s, with nothing to say why). So a start is
/// tried up to three times, each with new ports, and a server that still does not answer fails the test with the
/// end of its log.
final class LocalServer {
  let process: Process
  /// The ports handed to `arguments` for the attempt that came up.
  let ports: [Int]

  /// Starts `executable` with `arguments(ports)`, `portCount` free ports each attempt, until `ready(ports)` holds.
  /// `prepare(ports)` runs before each attempt (a config file naming the ports, say).
  init(
    _ name: String, executable: String, portCount: Int, directory: URL, timeout: Double,
    prepare: ([Int]) throws -> Void = { _ in }, arguments: ([Int]) -> [String], ready: ([Int]) -> Bool
  ) throws {
    guard FileManager.default.isExecutableFile(atPath: executable) else {
      throw TestSSEClient.Failure(description: "\(executable) is missing: run scripts/install-deps.sh")
    }
    var lastLog = ""
    for attempt in 1...3 {
      let ports = try LocalServer.freePorts(portCount)
      let log = directory.appendingPathComponent("\(name)-\(attempt).log")
      FileManager.default.createFile(atPath: log.path, contents: nil)
      try prepare(ports)
      let process = Process()
      process.executableURL = URL(fileURLWithPath: executable)
      process.arguments = arguments(ports)
      let output = try FileHandle(forWritingTo: log)
      process.standardOutput = output
      process.standardError = output
      try process.run()
      try? output.close()
      let deadline = MonotonicClock.seconds() + timeout
      while MonotonicClock.seconds() < deadline && process.isRunning {
        if ready(ports) {
          self.process = process
          self.ports = ports
          return
        }
        usleep(100_000)
      }
      if process.isRunning { kill(process.processIdentifier, SIGKILL) }
      process.waitUntilExit()
      let text = (try? String(contentsOf: log, encoding: .utf8)) ?? ""
      lastLog = "attempt \(attempt), exit status \(process.terminationStatus): " + String(text.suffix(2000))
    }
    throw TestSSEClient.Failure(
      description: "\(name) did not start in 3 attempts; the last log ended with:\n\(lastLog)")
  }

  /// `count` distinct loopback ports that were free a moment ago.
  static func freePorts(_ count: Int) throws -> [Int] {
    var sockets: [ListeningSocket] = []
    defer { for socket in sockets { close(socket.fd) } }
    for _ in 0..<count { sockets.append(try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)) }
    return sockets.map(\.port)
  }

  /// Kills the server (SIGKILL) unless it has exited, and reaps it.
  func stop() {
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
  }

  deinit { stop() }
}
