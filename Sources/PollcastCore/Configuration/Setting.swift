import Foundation

/// One configuration key: its place in the file, its environment variable and flag, its documentation, and how
/// a value is parsed into the tree. The table in `Configuration.settings` is the single source of all three.
public struct Setting: Sendable {
  /// Dotted file path, e.g. `sse.heartbeat_seconds`.
  public let key: String
  public let summary: String
  /// The default as shown in docs.
  public let defaultText: String
  let applyJSON: @Sendable (inout Configuration, Any) -> String?
  let applyText: @Sendable (inout Configuration, String) -> String?

  /// `POLLCAST_SSE_HEARTBEAT_SECONDS`.
  public var environmentName: String {
    "POLLCAST_" + key.uppercased().replacingOccurrences(of: ".", with: "_")
  }

  /// `--sse-heartbeat-seconds`.
  public var flag: String {
    "--" + key.replacingOccurrences(of: ".", with: "-").replacingOccurrences(of: "_", with: "-")
  }

  static func int(
    _ key: String, _ path: WritableKeyPath<Configuration, Int> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: String(Configuration()[keyPath: path]),
      applyJSON: { config, value in
        // JSONSerialization yields NSNumber; a Bool also bridges to a number, so reject it explicitly.
        guard let number = value as? NSNumber, !(value is Bool), let int = Int(exactly: number.doubleValue) else {
          return "expected an integer, got \(describe(value))"
        }
        config[keyPath: path] = int
        return nil
      },
      applyText: { config, text in
        guard let int = Int(text) else { return "expected an integer, got \"\(text)\"" }
        config[keyPath: path] = int
        return nil
      })
  }

  static func double(
    _ key: String, _ path: WritableKeyPath<Configuration, Double> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: formatNumber(Configuration()[keyPath: path]),
      applyJSON: { config, value in
        guard let number = value as? NSNumber, !(value is Bool), number.doubleValue.isFinite else {
          return "expected a number, got \(describe(value))"
        }
        config[keyPath: path] = number.doubleValue
        return nil
      },
      applyText: { config, text in
        guard let double = Double(text), double.isFinite else { return "expected a number, got \"\(text)\"" }
        config[keyPath: path] = double
        return nil
      })
  }

  static func string(
    _ key: String, _ path: WritableKeyPath<Configuration, String> & Sendable, _ summary: String
  ) -> Setting {
    let shown = Configuration()[keyPath: path]
    return Setting(
      key: key, summary: summary, defaultText: shown.isEmpty ? "(empty)" : shown,
      applyJSON: { config, value in
        guard let string = value as? String else { return "expected a string, got \(describe(value))" }
        config[keyPath: path] = string
        return nil
      },
      applyText: { config, text in
        config[keyPath: path] = text
        return nil
      })
  }

  static func bool(
    _ key: String, _ path: WritableKeyPath<Configuration, Bool> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: String(Configuration()[keyPath: path]),
      applyJSON: { config, value in
        guard let bool = value as? Bool else { return "expected true or false, got \(describe(value))" }
        config[keyPath: path] = bool
        return nil
      },
      applyText: { config, text in
        switch text.lowercased() {
        case "true", "1", "yes", "on": config[keyPath: path] = true
        case "false", "0", "no", "off": config[keyPath: path] = false
        default: return "expected true or false, got \"\(text)\""
        }
        return nil
      })
  }

  /// A list: a JSON array of strings in the file, comma-separated in the environment and flags.
  static func list(
    _ key: String, _ path: WritableKeyPath<Configuration, [String]> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: "[]",
      applyJSON: { config, value in
        guard let array = value as? [Any], let strings = array as? [String] else {
          return "expected an array of strings, got \(describe(value))"
        }
        config[keyPath: path] = strings
        return nil
      },
      applyText: { config, text in
        config[keyPath: path] = text.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter {
          !$0.isEmpty
        }
        return nil
      })
  }
}

private func describe(_ value: Any) -> String {
  switch value {
  case is Bool: "a boolean"
  case is String: "a string"
  case is NSNumber: "a number"
  case is [Any]: "an array"
  case is [String: Any]: "an object"
  case is NSNull: "null"
  default: "\(type(of: value))"
  }
}

private func formatNumber(_ value: Double) -> String {
  value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
}
