import Foundation
import PollcastCore

/// A minimal W3C WebDriver client for Debian's chromedriver + headless Chromium, over curl.
final class WebDriver {
  let server: LocalServer
  var port: Int { server.ports[0] }
  /// Where chromedriver's output goes (removed with the driver).
  private let directory: URL
  private(set) var sessionID = ""

  struct Failure: Error, CustomStringConvertible { var description: String }

  init(chromedriver: String = "/usr/bin/chromedriver", chromium: String = "/usr/bin/chromium") throws {
    guard FileManager.default.isExecutableFile(atPath: chromium) else {
      throw Failure(description: "chromium and chromium-driver are required (scripts/install-deps.sh installs them)")
    }
    directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-webdriver-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    do {
      server = try LocalServer(
        "chromedriver", executable: chromedriver, portCount: 1, directory: directory, timeout: 15,
        arguments: { ports in ["--port=\(ports[0])", "--allowed-ips=127.0.0.1"] },
        ready: { ports in
          (try? WebDriver.call(port: ports[0], "GET", "/status"))?["value"]?["ready"]?.rawText == "true"
        })
    } catch {
      try? FileManager.default.removeItem(at: directory)
      throw error
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
    while server.process.isRunning && MonotonicClock.seconds() < deadline { usleep(20_000) }
    server.stop()
  }

  deinit { try? FileManager.default.removeItem(at: directory) }

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
