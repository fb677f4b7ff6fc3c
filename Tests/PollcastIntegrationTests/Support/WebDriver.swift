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
    // A free port: bind 0, read it back, release it for chromedriver.
    let probe = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 1)
    port = probe.port
    close(probe.fd)
    process = Process()
    process.executableURL = URL(fileURLWithPath: chromedriver)
    process.arguments = ["--port=\(port)", "--allowed-ips=127.0.0.1"]
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    let deadline = MonotonicClock.seconds() + 20
    while (try? call("GET", "/status"))?["value"]?["ready"]?.rawText != "true" {
      guard MonotonicClock.seconds() < deadline else { throw Failure(description: "chromedriver did not start") }
      usleep(100_000)
    }
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
