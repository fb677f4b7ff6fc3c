import Foundation

/// Builds a `Configuration` from defaults, a JSON file, `POLLCAST_*` variables and flag values, in that order of
/// precedence, collecting every problem instead of stopping at the first.
public struct ConfigurationLoader {
  public init() {}

  /// - Parameters:
  ///   - fileText: the JSON file's contents, if a file is used.
  ///   - fileName: for messages.
  ///   - environment: the process environment (only `POLLCAST_*` keys are read).
  ///   - overrides: setting key → text value from flags.
  public func load(
    fileText: String?, fileName: String = "config", environment: [String: String], overrides: [(String, String)]
  ) throws(ConfigurationError) -> Configuration {
    var config = Configuration()
    var problems: [String] = []
    if let fileText {
      problems += applyFile(fileText, name: fileName, to: &config)
    }
    var byEnvironmentName = Dictionary(uniqueKeysWithValues: Configuration.settings.map { ($0.environmentName, $0) })
    let byKey = Dictionary(uniqueKeysWithValues: Configuration.settings.map { ($0.key, $0) })
    for (alias, key) in Self.environmentAliases { byEnvironmentName[alias] = byKey[key] }
    for (name, value) in environment.sorted(by: { $0.key < $1.key }) where name.hasPrefix("POLLCAST_") {
      if name == "POLLCAST_UPSTREAM_CLIENT", !["auto", "curl"].contains(value.lowercased()) {
        problems.append("\(name): \(Setting.shown(value)) is not auto or curl")
        continue
      }
      if Self.nonSettingVariables.contains(name) { continue }
      guard let setting = byEnvironmentName[name] else {
        problems.append("\(Setting.printable(name)): unknown POLLCAST_ variable")
        continue
      }
      if let problem = setting.applyText(&config, value) { problems.append("\(name): \(problem)") }
    }
    for (key, value) in overrides {
      guard let setting = byKey[key] else {
        problems.append("\(Setting.printable(key)): unknown setting")
        continue
      }
      if let problem = setting.applyText(&config, value) { problems.append("\(setting.flag): \(problem)") }
    }
    if config.adapterKind == .recipe { config.loadRecipe(environment: environment) }
    problems += config.problems()
    if !problems.isEmpty { throw ConfigurationError(problems: problems) }
    return config
  }

  /// Short variable names for the most used settings (the long form works too).
  static let environmentAliases: [String: String] = ["POLLCAST_LISTEN": "server.listen"]

  /// Variables with the prefix that are not settings (read by the CLI itself).
  /// `POLLCAST_UPSTREAM_CLIENT=curl` sends every upstream request through libcurl, none over the kept-alive
  /// connection (`KeepAliveConnection`): a way back if a legacy API misbehaves with it, and the benches' A/B.
  static let nonSettingVariables: Set<String> = ["POLLCAST_CONFIG", "POLLCAST_UPSTREAM_CLIENT"]

  private func applyFile(_ text: String, name: String, to config: inout Configuration) -> [String] {
    let value: JSONValue
    do {
      value = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
    } catch {
      return ["\(name): not valid JSON (\(Self.describe(error)))"]
    }
    guard case .object(let root) = value else { return ["\(name): the top level must be an object"] }
    var problems: [String] = []
    let byKey = Dictionary(uniqueKeysWithValues: Configuration.settings.map { ($0.key, $0) })
    let sections = Set(Configuration.settings.map { String($0.key.split(separator: ".")[0]) })
    for sectionName in root.keys.sorted() {
      guard sections.contains(sectionName) else {
        problems.append("\(name): unknown section \(Setting.shown(sectionName))")
        continue
      }
      guard case .object(let section) = root[sectionName]! else {
        problems.append("\(name): \(Setting.shown(sectionName)) must be an object")
        continue
      }
      apply(section, prefix: sectionName)
    }
    // Sections may nest (`auth.jwt.key_file`): an object whose path prefixes settings is walked into.
    func apply(_ object: [String: JSONValue], prefix: String) {
      for key in object.keys.sorted() {
        let path = "\(prefix).\(key)"
        if let setting = byKey[path] {
          if let problem = setting.applyJSON(&config, object[key]!) { problems.append("\(path): \(problem)") }
        } else if case .object(let nested) = object[key]!, byKey.keys.contains(where: { $0.hasPrefix(path + ".") }) {
          apply(nested, prefix: path)
        } else {
          problems.append("\(name): unknown key \(Setting.shown(path))")
        }
      }
    }
    return problems
  }

  private static func describe(_ error: Error) -> String {
    switch error {
    case DecodingError.dataCorrupted(let context):
      context.underlyingError.map { "\($0)" } ?? context.debugDescription
    default:
      "\(error)"
    }
  }
}
