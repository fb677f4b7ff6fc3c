/// What the command line asked for.
public struct CommandLineOptions: Equatable, Sendable {
  public var configPath: String?
  /// Setting key → value, in command-line order (later wins).
  public var overrides: [Override] = []
  public var demo = false
  public var help = false
  public var helpConfig = false
  public var version = false
  public var printConfig = false

  public struct Override: Equatable, Sendable {
    public var key: String
    public var value: String
  }

  /// Short names for the most used settings, as DESIGN names them.
  static let aliases: [String: String] = [
    "--listen": "server.listen",
    "--heartbeat": "sse.heartbeat_seconds",
  ]

  public static let usage = """
    USAGE: pollcast [--config FILE] [--listen HOST:PORT] [--upstream-url URL] [--upstream-api-key KEY] [options]
           pollcast --demo [options]

    Relays a long-poll API as a Server-Sent Events stream at /events.

    OPTIONS:
      --config FILE           JSON configuration file (default: none; POLLCAST_CONFIG also names one)
      --listen HOST:PORT      where the SSE server listens (port 0 picks a free one)
      --demo                  run against a built-in demo source
      --print-config          print the effective configuration as JSON and exit
      --help-config           list every setting with its file key, variable, flag and default
      -h, --help              show this help
      --version               show the version
      --<section>-<key> VALUE any setting by its flag (see --help-config), e.g. --sse-heartbeat-seconds 10

    On start the first line on stdout is `listening on HOST:PORT`.
    """

  /// Parses `arguments` (without the program name). Accepts `--opt value` and `--opt=value`.
  public static func parse(_ arguments: [String]) throws(UsageError) -> CommandLineOptions {
    var options = CommandLineOptions()
    let flags = Dictionary(uniqueKeysWithValues: Configuration.settings.map { ($0.flag, $0.key) })
    var index = 0
    while index < arguments.count {
      let argument = arguments[index]
      index += 1
      var name = argument
      var inlineValue: String?
      if argument.hasPrefix("--"), let equals = argument.firstIndex(of: "=") {
        name = String(argument[..<equals])
        inlineValue = String(argument[argument.index(after: equals)...])
      }
      func value() throws(UsageError) -> String {
        if let inlineValue { return inlineValue }
        guard index < arguments.count else { throw UsageError("\(name) needs a value") }
        index += 1
        return arguments[index - 1]
      }
      func noValue() throws(UsageError) {
        if inlineValue != nil { throw UsageError("\(name) takes no value") }
      }
      switch name {
      case "-h", "--help":
        try noValue()
        options.help = true
      case "--version":
        try noValue()
        options.version = true
      case "--demo":
        try noValue()
        options.demo = true
      case "--print-config":
        try noValue()
        options.printConfig = true
      case "--help-config":
        try noValue()
        options.helpConfig = true
      case "--config":
        options.configPath = try value()
      default:
        guard let key = aliases[name] ?? flags[name] else {
          throw UsageError(
            argument.hasPrefix("-")
              ? "unknown option \(Setting.printable(name))" : "unexpected argument \(Setting.shown(argument))")
        }
        options.overrides.append(Override(key: key, value: try value()))
      }
    }
    return options
  }

  /// The settings reference as a Markdown table (README and `--help-config`).
  public static func settingsReference() -> String {
    var lines = ["| key | environment | flag | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for setting in Configuration.settings {
      lines.append(
        "| `\(setting.key)` | `\(setting.environmentName)` | `\(setting.flag)` | `\(setting.defaultText)` | \(setting.summary) |"
      )
    }
    return lines.joined(separator: "\n")
  }
}

/// The command line is wrong: print `Error: …` and the usage, exit 64.
public struct UsageError: Error, CustomStringConvertible, Sendable, Equatable {
  public var message: String
  public init(_ message: String) { self.message = message }
  public var description: String { message }
}
