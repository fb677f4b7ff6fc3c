import Foundation
import PollcastCore

/// A harness that owns servers: `run` stops them on every path, a failing expectation or a thrown error included.
protocol StoppableHarness {
  func stop() async
}

extension StoppableHarness {
  func run(_ body: (Self) async throws -> Void) async throws {
    do {
      try await body(self)
    } catch {
      await stop()
      throw error
    }
    await stop()
  }
}

/// curl streaming a URL into a file: a client that reads as fast as the kernel delivers. Stopped and its file
/// removed when released.
final class CurlReader {
  let output: URL
  private let process = Process()

  init(url: String, maxTime: Int = 180) throws {
    output = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-curl-\(UUID().uuidString).txt")
    process.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
    process.arguments = ["-sS", "-N", "--max-time", String(maxTime), "-o", output.path, url]
    try process.run()
  }

  deinit {
    if process.isRunning { process.terminate() }
    try? FileManager.default.removeItem(at: output)
  }

  /// What arrived so far.
  var text: String { (try? String(contentsOf: output, encoding: .utf8)) ?? "" }

  /// Waits until what arrived contains `needle`; returns it all.
  func waitFor(_ needle: String, timeout: Double) async throws -> String {
    let deadline = MonotonicClock.seconds() + timeout
    var received = text
    while !received.contains(needle) && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(100))
      received = text
    }
    return received
  }
}

/// Reads a started program's stdout until its first line (`listening on HOST:PORT`) and returns the port.
func listeningPort(of output: Pipe, timeout: Double = 15) -> Int? {
  var text = ""
  let deadline = Date().addingTimeInterval(timeout)
  while !text.contains("\n") && Date() < deadline {
    text += String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
  }
  guard let line = text.split(separator: "\n").first, line.hasPrefix("listening on ") else { return nil }
  return Int(line.split(separator: ":").last ?? "")
}
