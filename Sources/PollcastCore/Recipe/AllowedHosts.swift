/// The hosts a recipe's requests may go to: those written in the recipe (its URLs, and vars holding URLs) and those
/// configured in `upstream.allowed_hosts`. A URL that an answer chooses (a session step's server address, a cursor
/// that is a URL) can only move polls among them, since every request carries the recipe's headers, keys among them.
/// Only http and https; redirects are never followed (libcurl's default, and the kept connection never follows).
public struct AllowedHosts: Sendable, Equatable {
  /// `host:port` entries, or `host` for any port; lowercased.
  public private(set) var entries: Set<String>

  public init(_ entries: some Sequence<String>) {
    self.entries = Set(entries.map { $0.lowercased() })
  }

  /// The scheme's host and port of an `http` or `https` URL (userinfo dropped, default ports filled in), or nil.
  public static func authority(of url: String) -> (host: String, port: Int)? {
    let lowered = url.lowercased()
    let scheme: (prefix: String, port: Int)
    if lowered.hasPrefix("http://") {
      scheme = ("http://", 80)
    } else if lowered.hasPrefix("https://") {
      scheme = ("https://", 443)
    } else {
      return nil
    }
    var authority = lowered.dropFirst(scheme.prefix.count).prefix { $0 != "/" && $0 != "?" && $0 != "#" }
    if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
    var host = authority
    var port = scheme.port
    if authority.hasPrefix("[") {
      guard let close = authority.firstIndex(of: "]") else { return nil }
      host = authority[...close]
      let rest = authority[authority.index(after: close)...]
      if !rest.isEmpty {
        guard rest.hasPrefix(":"), let number = Int(rest.dropFirst()) else { return nil }
        port = number
      }
    } else if let colon = authority.lastIndex(of: ":") {
      host = authority[..<colon]
      let digits = authority[authority.index(after: colon)...]
      if !digits.isEmpty {
        guard let number = Int(digits) else { return nil }
        port = number
      }
    }
    guard !host.isEmpty, (1...65535).contains(port) else { return nil }
    return (String(host), port)
  }

  /// Why `url` may not be asked, or nil when its host is allowed.
  public func problem(for url: String) -> String? {
    guard let (host, port) = Self.authority(of: url) else {
      return "the URL is not an http:// or https:// URL with a host"
    }
    if entries.contains("\(host):\(port)") || entries.contains(host) { return nil }
    return "its host \(host):\(port) is not written in the recipe nor listed in upstream.allowed_hosts"
  }

  /// Why `entry`, a configured one, is not a host or `host:port`, or nil.
  public static func problem(inEntry entry: String) -> String? {
    guard authority(of: "http://\(entry)") != nil, !entry.contains("/"), !entry.contains("@"), !entry.contains("?")
    else {
      return "\(Setting.shown(entry)) is not a host or host:port"
    }
    return nil
  }
}

extension Recipe {
  /// Whether `step`'s URL starts with a value only known at run time (a session value, a cursor): its host is then
  /// checked against `AllowedHosts` on every request.
  static func hostMoves(_ step: Step, vars: Set<String>) -> Bool {
    switch step.url.parts.first {
    case .placeholder(.name(let name))?: !vars.contains(name)
    case .placeholder(.env)?: false
    case .placeholder?: true
    default: false
    }
  }

  /// The hosts this recipe writes (its steps' URLs with the vars in place), with those configured.
  public var allowedHosts: AllowedHosts {
    var scope = RecipeScope()
    scope.vars = vars
    var entries = configuredHosts
    for (_, step) in stepsWithPaths where !Recipe.hostMoves(step, vars: varNames) {
      if let text = try? step.url.renderKnown(scope), let (host, port) = AllowedHosts.authority(of: text) {
        entries.append("\(host):\(port)")
      }
    }
    return AllowedHosts(entries)
  }
}
