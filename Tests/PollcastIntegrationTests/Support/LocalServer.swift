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

  /// `count` distinct loopback ports that were free a moment ago, on 127.0.0.1 and (when this machine has it) on ::1.
  ///
  /// chromedriver listens on both loopbacks at one port and exits when the IPv6 one is taken ("IPv6 port not
  /// available"). A port free on 127.0.0.1 can still be taken on ::1 (by a client socket there, say; which one was
  /// not found): a local run saw all three attempts fail that way in 0.4 s. A port is handed out only
  /// when both binds succeed; the sockets of refused ports stay open until the end, so none is offered twice.
  static func freePorts(_ count: Int) throws -> [Int] {
    var sockets: [ListeningSocket] = []
    defer { for socket in sockets { close(socket.fd) } }
    var ports: [Int] = []
    for _ in 0..<(count + 64) where ports.count < count {
      let socket = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
      sockets.append(socket)
      guard hasIPv6Loopback else {
        ports.append(socket.port)
        continue
      }
      if let twin = try? ListeningSocket.bind(host: "::1", port: socket.port, backlog: 1) {
        sockets.append(twin)
        ports.append(socket.port)
      }
    }
    guard ports.count == count else {
      throw TestSSEClient.Failure(description: "no \(count) loopback ports free on both 127.0.0.1 and ::1")
    }
    return ports
  }

  /// True when this machine can listen on ::1 (some CI machines have IPv6 turned off).
  static let hasIPv6Loopback: Bool = {
    guard let socket = try? ListeningSocket.bind(host: "::1", port: 0, backlog: 1) else { return false }
    close(socket.fd)
    return true
  }()

  /// Kills the server (SIGKILL) unless it has exited, and reaps it.
  func stop() {
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
  }

  deinit { stop() }
}
