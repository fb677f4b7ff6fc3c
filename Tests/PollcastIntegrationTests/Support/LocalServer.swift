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

  /// `count` distinct ports that were free a moment ago on every address, IPv4 and IPv6.
  ///
  /// chromedriver given `--allowed-ips` listens on the wildcard address (`*:port`, IPv6 and IPv4 at once), without
  /// the reuse option, and exits when any socket on that port is left, even one in TIME-WAIT from a closed connection
  /// ("IPv6 port not available"). After a test that opens 15,000 connections, over half the ephemeral ports have
  /// one for a minute, and a port that was free on 127.0.0.1 and ::1 for a listener with the reuse option failed
  /// three attempts in a row (a full local run; 3 of 5 ports tried by hand with 59,626 such sockets left). So a port
  /// is reserved the way that server binds it: a socket bound to the wildcard address, port 0 (the kernel picks one
  /// no socket holds), without the reuse option, and not listening (it accepts nothing). The sockets stay bound
  /// until every port is picked, so none is offered twice.
  static func freePorts(_ count: Int) throws -> [Int] {
    var reserved: [Int32] = []
    defer { for fd in reserved { close(fd) } }
    var ports: [Int] = []
    for _ in 0..<(count + 64) where ports.count < count {
      guard let (fd, port) = bindWildcard() else { continue }
      reserved.append(fd)
      if !ports.contains(port) { ports.append(port) }
    }
    guard ports.count == count else {
      throw TestSSEClient.Failure(description: "no \(count) ports free on every address")
    }
    return ports
  }

  /// A socket bound to port 0 of the wildcard address (IPv6 with IPv4 mapped, or IPv4 alone where this machine
  /// has no IPv6), without SO_REUSEADDR, and the port the kernel gave it.
  private static func bindWildcard() -> (Int32, Int)? {
    let v6 = socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
    if v6 >= 0 {
      var off: Int32 = 0
      setsockopt(v6, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &off, socklen_t(MemoryLayout<Int32>.size))
      var address = sockaddr_in6()
      address.sin6_family = sa_family_t(AF_INET6)
      address.sin6_addr = in6addr_any
      if let port = bindAndName(v6, &address) { return (v6, port) }
      close(v6)
    }
    let v4 = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard v4 >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = INADDR_ANY
    if let port = bindAndName(v4, &address) { return (v4, port) }
    close(v4)
    return nil
  }

  /// Binds `fd` to `address` (port 0) and reads back the port given.
  private static func bindAndName<Address>(_ fd: Int32, _ address: inout Address) -> Int? {
    let size = socklen_t(MemoryLayout<Address>.size)
    let bound = withUnsafePointer(to: &address) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, size) }
    }
    guard bound == 0, let port = ListeningSocket.boundPort(of: fd), port != 0 else { return nil }
    return port
  }

  /// Kills the server (SIGKILL) unless it has exited, and reaps it.
  func stop() {
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
  }

  deinit { stop() }
}
