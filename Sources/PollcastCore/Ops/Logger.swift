import Foundation

/// A small logger in swift-log's shape: `logger.info("message", metadata: [...])`, written as one logfmt (default)
/// or JSON line to stderr. Values of keys that look secret are redacted.
public struct Logger: Sendable {
  public enum Level: Int, Sendable, Comparable, CaseIterable {
    case trace, debug, info, notice, warning, error, critical
    public static func < (a: Level, b: Level) -> Bool { a.rawValue < b.rawValue }
    public var name: String { "\(self)" }
    public init?(name: String) {
      guard let level = Level.allCases.first(where: { $0.name == name.lowercased() }) else { return nil }
      self = level
    }
  }

  public enum Format: String, Sendable, CaseIterable { case logfmt, json }

  public var label: String
  public var level: Level
  public var format: Format
  private let sink: @Sendable (String) -> Void

  public init(
    label: String, level: Level = .info, format: Format = .logfmt,
    sink: @escaping @Sendable (String) -> Void = Logger.standardError
  ) {
    self.label = label
    self.level = level
    self.format = format
    self.sink = sink
  }

  public static let standardError: @Sendable (String) -> Void = { line in
    FileHandle.standardError.write(Data(line.utf8))
  }

  public func trace(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String] = [:]) {
    log(.trace, message(), metadata())
  }
  public func debug(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String] = [:]) {
    log(.debug, message(), metadata())
  }
  public func info(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String] = [:]) {
    log(.info, message(), metadata())
  }
  public func warning(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String] = [:]) {
    log(.warning, message(), metadata())
  }
  public func error(_ message: @autoclosure () -> String, metadata: @autoclosure () -> [String: String] = [:]) {
    log(.error, message(), metadata())
  }

  public func log(_ level: Level, _ message: @autoclosure () -> String, _ metadata: @autoclosure () -> [String: String])
  {
    guard level >= self.level else { return }
    sink(Logger.render(level: level, label: label, message: message(), metadata: metadata(), format: format) + "\n")
  }

  /// Keys whose values never reach a log line.
  static let secretKeyFragments = ["token", "key", "secret", "password", "authorization", "cookie"]

  static func isSecret(_ key: String) -> Bool {
    let lower = key.lowercased()
    return secretKeyFragments.contains { lower.contains($0) }
  }

  static func render(level: Level, label: String, message: String, metadata: [String: String], format: Format) -> String
  {
    let time = utcTimestamp()
    var fields: [(String, String)] = [("ts", time), ("level", level.name), ("logger", label), ("msg", message)]
    for key in metadata.keys.sorted() {
      fields.append((key, isSecret(key) ? "[redacted]" : metadata[key]!))
    }
    switch format {
    case .json:
      return "{" + fields.map { JSONText.quoted($0.0) + ":" + JSONText.quoted($0.1) }.joined(separator: ",") + "}"
    case .logfmt:
      return fields.map { "\($0.0)=\(logfmtValue($0.1))" }.joined(separator: " ")
    }
  }

  static func logfmtValue(_ value: String) -> String {
    let needsQuotes =
      value.isEmpty || value.unicodeScalars.contains { $0 == " " || $0 == "=" || $0 == "\"" || $0.value < 0x20 }
    guard needsQuotes else { return value }
    return JSONText.quoted(value)
  }
}

/// UTC time as `2026-11-29T18:01:14.123Z`, without a shared formatter (thread-safe).
public func utcTimestamp() -> String {
  var spec = timespec()
  clock_gettime(CLOCK_REALTIME, &spec)
  var parts = tm()
  var seconds = spec.tv_sec
  gmtime_r(&seconds, &parts)
  func pad(_ value: Int32, _ width: Int) -> String {
    let text = String(value)
    return String(repeating: "0", count: max(0, width - text.count)) + text
  }
  return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
    + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(spec.tv_nsec / 1_000_000), 3))Z"
}
