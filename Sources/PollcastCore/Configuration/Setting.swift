import Foundation

/// One configuration key: its place in the file, its environment variable and flag, its documentation, and how
/// a value is parsed into the tree. The table in `Configuration.settings` is the single source of all three.
public struct Setting: Sendable {
  /// Dotted file path, e.g. `sse.heartbeat_seconds`.
  public let key: String
  public let summary: String
  /// The default as shown in docs.
  public let defaultText: String
  let applyJSON: @Sendable (inout Configuration, JSONValue) -> String?
  let applyText: @Sendable (inout Configuration, String) -> String?

  /// `POLLCAST_SSE_HEARTBEAT_SECONDS`.
  public var environmentName: String {
    "POLLCAST_" + key.uppercased().replacingOccurrences(of: ".", with: "_")
  }

  /// `--sse-heartbeat-seconds`.
  public var flag: String {
    "--" + key.replacingOccurrences(of: ".", with: "-").replacingOccurrences(of: "_", with: "-")
  }

  /// A refused value as an error shows it: quoted, its control characters escaped (an escape sequence in a bad
  /// flag, environment value or file key must not reach a terminal or a log line raw), and cut after 64 characters.
  static func shown(_ text: String) -> String { "\"" + printable(text) + "\"" }

  /// `shown` without the quotes, for a name an error starts with (a variable's, a flag's).
  static func printable(_ text: String) -> String {
    JSONText.quoted(text.count > 64 ? text.prefix(63) + "…" : text).dropFirst().dropLast().description
  }

  static func int(
    _ key: String, _ path: WritableKeyPath<Configuration, Int> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: String(Configuration()[keyPath: path]),
      applyJSON: { config, value in
        guard case .number(let number) = value, let int = Int(exactly: number) else {
          return "expected an integer, got \(value.kind == "a number" ? "a fraction" : value.kind)"
        }
        config[keyPath: path] = int
        return nil
      },
      applyText: { config, text in
        guard let int = Int(text) else { return "expected an integer, got \(shown(text))" }
        config[keyPath: path] = int
        return nil
      })
  }

  /// Every number setting is a duration (seconds, or `sse.retry_ms`): one past a billion (31 years of seconds) is a
  /// mistake, and would overflow where it is turned into whole milliseconds or microseconds.
  static let largestNumber = 1e9

  static func outOfRange(_ number: Double) -> String? {
    abs(number) > largestNumber ? "expected a number of at most \(formatNumber(largestNumber)), got \(number)" : nil
  }

  static func double(
    _ key: String, _ path: WritableKeyPath<Configuration, Double> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: formatNumber(Configuration()[keyPath: path]),
      applyJSON: { config, value in
        guard case .number(let number) = value, number.isFinite else {
          return "expected a number, got \(value.kind)"
        }
        if let problem = outOfRange(number) { return problem }
        config[keyPath: path] = number
        return nil
      },
      applyText: { config, text in
        guard let double = Double(text), double.isFinite else { return "expected a number, got \(shown(text))" }
        if let problem = outOfRange(double) { return problem }
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
        guard case .string(let string) = value else { return "expected a string, got \(value.kind)" }
        config[keyPath: path] = string
        return nil
      },
      applyText: { config, text in
        config[keyPath: path] = text
        return nil
      })
  }

  /// A recipe: a file path (a string), or the recipe itself (an object in the file, JSON text starting with `{`
  /// in the environment and flags).
  static func recipe(
    _ key: String, _ path: WritableKeyPath<Configuration, String> & Sendable, _ summary: String
  ) -> Setting {
    Setting(
      key: key, summary: summary, defaultText: "(empty)",
      applyJSON: { config, value in
        switch value {
        case .string(let file): config[keyPath: path] = file
        case .object: config[keyPath: path] = value.text
        default: return "expected a file path or a recipe object, got \(value.kind)"
        }
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
        guard case .bool(let bool) = value else { return "expected true or false, got \(value.kind)" }
        config[keyPath: path] = bool
        return nil
      },
      applyText: { config, text in
        switch text.lowercased() {
        case "true", "1", "yes", "on": config[keyPath: path] = true
        case "false", "0", "no", "off": config[keyPath: path] = false
        default: return "expected true or false, got \(shown(text))"
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
        guard case .array(let array) = value else { return "expected an array of strings, got \(value.kind)" }
        var strings: [String] = []
        for element in array {
          guard case .string(let string) = element else {
            return "expected an array of strings, found \(element.kind) in it"
          }
          strings.append(string)
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

func formatNumber(_ value: Double) -> String {
  value == value.rounded() && abs(value) < 1e15 ? String(Int(value)) : String(value)
}
