import Foundation
import PollcastCore

/// A minimal W3C WebDriver client for Debian's chromedriver + headless Chromium, over curl.
final class WebDriver {
  let process: Process
  let port: Int
  private(set) var sessionID = ""

  struct Failure: Error, CustomStringConvertible { var description: String }

  init(chromedriver: String = "/usr/bin/chromedriver", chromium: String = "/usr/bin/chromium") throws {
    guard FileManager.default.isExecutableFile(atPath: chromedriver),
      FileManager.default.isExecutableFile(atPath: chromium)
    else {
      throw Failure(description: "chromium and chromium-driver are required (scripts/install-deps.sh installs them)")
    }
    // A free port: bind 0, read it back, release it for chromedriver. Another socket can take it in between, so
    // a chromedriver that does not come up is retried on a fresh port.
    var attempt = 0
    var started: (Process, Int)?
    var lastLog = ""
    while started == nil && attempt < 3 {
      attempt += 1
      let probe = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
      let candidate = probe.port
      close(probe.fd)
      let logPath = FileManager.default.temporaryDirectory.appendingPathComponent("chromedriver-\(candidate).log").path
      let process = Process()
      process.executableURL = URL(fileURLWithPath: chromedriver)
      process.arguments = ["--port=\(candidate)", "--allowed-ips=127.0.0.1", "--log-path=\(logPath)"]
      process.standardOutput = FileHandle.nullDevice
      process.standardError = FileHandle.nullDevice
      try process.run()
      let deadline = MonotonicClock.seconds() + 15
      while MonotonicClock.seconds() < deadline && process.isRunning {
        if (try? WebDriver.call(port: candidate, "GET", "/status"))?["value"]?["ready"]?.rawText == "true" {
          started = (process, candidate)
          break
        }
        usleep(100_000)
      }
      if started == nil {
        lastLog = (try? String(contentsOfFile: logPath, encoding: .utf8)).map { String($0.suffix(600)) } ?? ""
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
      }
      try? FileManager.default.removeItem(atPath: logPath)
    }
    guard let (process, port) = started else {
      throw Failure(description: "chromedriver did not start in 3 attempts; its log ended with: \(lastLog)")
    }
    self.process = process
    self.port = port
    let capabilities = """
      {"capabilities":{"alwaysMatch":{"browserName":"chrome","goog:chromeOptions":{"binary":"\(chromium)",
      "args":["--headless=new","--no-sandbox","--disable-gpu","--disable-dev-shm-usage","--window-size=1200,800"]}}}}
      """
    let answer = try call("POST", "/session", body: capabilities)
    guard let id = answer["value"]?["sessionId"]?.stringValue else {
      throw Failure(description: "no session: \(answer.rawText.prefix(300))")
    }
    sessionID = id
  }

  func navigate(to url: String) throws {
    _ = try call("POST", "/session/\(sessionID)/url", body: "{\"url\":\(JSONText.quoted(url))}")
  }

  /// Runs `script` (a function body that returns a value) in the page; returns the value as JSON.
  func evaluate(_ script: String) throws -> RawJSON {
    let answer = try call(
      "POST", "/session/\(sessionID)/execute/sync", body: "{\"script\":\(JSONText.quoted(script)),\"args\":[]}")
    guard let value = answer["value"] else { throw Failure(description: "no value: \(answer.rawText.prefix(300))") }
    return value
  }

  func screenshot(to path: String) throws {
    guard let base64 = try call("GET", "/session/\(sessionID)/screenshot")["value"]?.stringValue,
      let data = Data(base64Encoded: base64)
    else { throw Failure(description: "no screenshot") }
    try data.write(to: URL(fileURLWithPath: path))
  }

  /// Ends the browser session and chromedriver (which ignores SIGTERM: it is asked to shut down, then killed).
  func quit() {
    if !sessionID.isEmpty { _ = try? call("DELETE", "/session/\(sessionID)") }
    sessionID = ""
    _ = try? run("/usr/bin/curl", ["-s", "--max-time", "2", "http://127.0.0.1:\(port)/shutdown"], timeout: 3)
    let deadline = MonotonicClock.seconds() + 3
    while process.isRunning && MonotonicClock.seconds() < deadline { usleep(20_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
  }

  private func call(_ method: String, _ path: String, body: String? = nil) throws -> RawJSON {
    try WebDriver.call(port: port, method, path, body: body)
  }

  private static func call(port: Int, _ method: String, _ path: String, body: String? = nil) throws -> RawJSON {
    var arguments = ["-sS", "--max-time", "30", "-X", method, "http://127.0.0.1:\(port)\(path)"]
    if let body { arguments += ["-H", "Content-Type: application/json", "--data-binary", body] }
    let result = try run("/usr/bin/curl", arguments, timeout: 40)
    guard result.code == 0 else { throw Failure(description: "curl \(path): \(result.stderr)") }
    do {
      return try RawJSON.parse(result.stdout)
    } catch {
      throw Failure(description: "\(path): not JSON: \(result.stdout.prefix(200))")
    }
  }
}
