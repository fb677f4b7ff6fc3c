import Foundation
import PollcastCore
import Testing

/// An actor on the transport's loop, from which `perform` may be called.
private actor TransportDriver {
  let loop: EventLoop
  let transport: CurlTransport
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  init(loop: EventLoop, transport: CurlTransport) {
    self.loop = loop
    self.transport = transport
  }

  func get(_ url: String, timeout: Double = 5) async -> Result<UpstreamResponse, UpstreamError> {
    do {
      return .success(try await transport.perform(UpstreamRequest(url: url, timeout: timeout, label: "test")))
    } catch {
      return .failure(error)
    }
  }

  func inFlight() -> Int { transport.inFlight }
}

@Suite(.serialized, .timeLimit(.minutes(5))) struct TransportTests {
  private func driver() async throws -> TransportDriver {
    let loop = try EventLoop()
    loop.start()
    let transport = try await loop.submit { () throws(UpstreamError) -> CurlTransport in try CurlTransport(loop: loop) }
    return TransportDriver(loop: loop, transport: transport)
  }

  @Test func tlsCertificatesAreVerifiedByDefault() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-tls-\(getpid())")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let cert = directory.appendingPathComponent("cert.pem").path
    let key = directory.appendingPathComponent("key.pem").path
    let made = try run(
      "/usr/bin/openssl",
      [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj",
        "/CN=127.0.0.1",
      ])
    #expect(made.code == 0, "openssl: \(made.stderr)")
    let probe = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
    let port = probe.port
    close(probe.fd)
    let server = Process()
    server.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
    server.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", cert, "-key", key, "-www", "-quiet"]
    server.standardOutput = FileHandle.nullDevice
    server.standardError = FileHandle.nullDevice
    try server.run()
    defer {
      // SIGKILL: children of the test process inherit its blocked SIGTERM.
      kill(server.processIdentifier, SIGKILL)
      server.waitUntilExit()
    }
    let driver = try await driver()
    // Wait for the TLS server to listen (a refused connection is a transport error without a certificate cause).
    var outcome = await driver.get("https://127.0.0.1:\(port)/")
    let deadline = MonotonicClock.seconds() + 10
    while case .failure(let error) = outcome, !(error.cause ?? "").lowercased().contains("certificate"),
      MonotonicClock.seconds() < deadline
    {
      try await Task.sleep(for: .milliseconds(100))
      outcome = await driver.get("https://127.0.0.1:\(port)/")
    }
    guard case .failure(let error) = outcome else {
      Issue.record("a self-signed certificate was accepted")
      return
    }
    #expect(error.kind == .transport)
    #expect((error.cause ?? "").lowercased().contains("certificate"), "\(error)")
    driver.loop.stop()
  }

  @Test func timeoutsAndRefusedConnectionsAreTypedErrors() async throws {
    let driver = try await driver()
    let probe = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
    // A listening socket that never accepts: the request times out.
    guard case .failure(let timeout) = await driver.get("http://127.0.0.1:\(probe.port)/", timeout: 0.5) else {
      Issue.record("expected a timeout")
      return
    }
    #expect(timeout.kind == .timeout)
    close(probe.fd)
    guard case .failure(let refused) = await driver.get("http://127.0.0.1:\(probe.port)/", timeout: 2) else {
      Issue.record("expected a refused connection")
      return
    }
    #expect(refused.kind == .transport)
    #expect(await driver.inFlight() == 0)
    driver.loop.stop()
  }
}
