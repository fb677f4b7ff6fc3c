import Foundation

/// A recipe string with placeholders: `{NAME}` (a var or a session step's extracted value), `{cursor}`, `{next}` (the
/// cursor + 1), `{cursors}` (every stream's cursor, as `recipe.cursor.list` joins them), `{env:NAME}` (or
/// `{env:NAME:-default}`), `{credential}`, `{now}` (Unix milliseconds) and `{nonce}` (random, per request). A `{` that
/// does not open a placeholder (not followed by a letter and a closing `}` with only name characters between) is
/// literal, so inline JSON needs no escaping.
public struct RecipeTemplate: Sendable, Equatable {
  public enum Placeholder: Sendable, Equatable, Hashable {
    case name(String)
    case cursor
    case next
    case cursors
    case env(String, default: String? = nil)
    case credential
    /// The time the request is built, in milliseconds since the Unix epoch.
    case now
    /// 16 random hex digits, new for every request (an API that answers identical requests from a cache).
    case nonce

    var spelled: String {
      switch self {
      case .name(let name): "{\(name)}"
      case .cursor: "{cursor}"
      case .next: "{next}"
      case .cursors: "{cursors}"
      case .env(let name, let fallback): fallback.map { "{env:\(name):-\($0)}" } ?? "{env:\(name)}"
      case .credential: "{credential}"
      case .now: "{now}"
      case .nonce: "{nonce}"
      }
    }
  }

  public enum Part: Sendable, Equatable {
    case literal(String)
    case placeholder(Placeholder)
  }

  public let parts: [Part]
  public let source: String

  public init(_ text: String) {
    source = text
    var parts: [Part] = []
    var literal = ""
    var index = text.startIndex
    while index < text.endIndex {
      if text[index] == "{", let (placeholder, end) = RecipeTemplate.placeholder(in: text, at: index) {
        if !literal.isEmpty { parts.append(.literal(literal)) }
        literal = ""
        parts.append(.placeholder(placeholder))
        index = end
      } else {
        literal.append(text[index])
        index = text.index(after: index)
      }
    }
    if !literal.isEmpty { parts.append(.literal(literal)) }
    self.parts = parts
  }

  /// A template that is its text as written, with no placeholder (a query value given as JSON).
  public init(literal text: String) {
    source = text
    parts = text.isEmpty ? [] : [.literal(text)]
  }

  private static func isNameCharacter(_ c: Character) -> Bool {
    c.isASCII && (c.isLetter || c.isNumber || c == "_" || c == "-" || c == ".")
  }

  /// The placeholder opening at `start` (a `{`) and the index after its `}`, or nil when the brace is literal.
  private static func placeholder(in text: String, at start: String.Index) -> (Placeholder, String.Index)? {
    let afterBrace = text.index(after: start)
    guard afterBrace < text.endIndex, text[afterBrace].isASCII, text[afterBrace].isLetter,
      let close = text[afterBrace...].firstIndex(of: "}")
    else { return nil }
    let inner = text[afterBrace..<close]
    let end = text.index(after: close)
    if inner.hasPrefix("env:") {
      var name = inner.dropFirst(4)
      var fallback: String?
      if let split = name.range(of: ":-") {
        fallback = String(name[split.upperBound...])
        name = name[..<split.lowerBound]
      }
      guard !name.isEmpty, name.allSatisfy(isNameCharacter) else { return nil }
      return (.env(String(name), default: fallback), end)
    }
    guard inner.allSatisfy(isNameCharacter) else { return nil }
    switch inner {
    case "cursor": return (.cursor, end)
    case "next": return (.next, end)
    case "cursors": return (.cursors, end)
    case "credential": return (.credential, end)
    case "now": return (.now, end)
    case "nonce": return (.nonce, end)
    default: return (.name(String(inner)), end)
    }
  }

  public var placeholders: [Placeholder] {
    parts.compactMap { if case .placeholder(let p) = $0 { p } else { nil } }
  }

  /// The template is exactly one placeholder (a JSON body member then takes that value's own type).
  public var single: Placeholder? {
    if parts.count == 1, case .placeholder(let p) = parts[0] { p } else { nil }
  }
}

/// A value a template can place: its text, and its JSON form when it came from a JSON body (a number stays a
/// number in a JSON request body).
public struct RecipeValue: Sendable, Equatable {
  public var text: String
  /// The JSON form when it is not the text quoted (a number, a JSON body's own spelling).
  private var jsonText: String?
  /// Quoted only when asked for: a value placed in a URL or a header (every poll's) never is.
  public var json: String { jsonText ?? JSONText.quoted(text) }

  public init(text: String, json: String? = nil) {
    self.text = text
    self.jsonText = json
  }

  public init(_ number: UInt64) {
    text = String(number)
    jsonText = text
  }

  public static func == (a: RecipeValue, b: RecipeValue) -> Bool { a.text == b.text && a.json == b.json }
}

/// What fills placeholders at one moment: the recipe's vars, the session's values, the cursor, the credential.
struct RecipeScope {
  /// Named values that win over `vars`: the session's (and, while it runs, its earlier steps').
  var values: [String: RecipeValue] = [:]
  /// The recipe's `vars`: held beside `values`, not merged into them, so that every account's scope shares the
  /// recipe's dictionary instead of holding a merged copy of it (456 bytes an account for the chat recipe).
  var vars: [String: RecipeValue] = [:]
  var environment: [String: String] = [:]
  var credential: String?
  /// The relay's cursor: the last event's id (integer recipes) or the count of relayed events (opaque ones).
  var cursor: UInt64?
  /// An opaque cursor's text, sent as `{cursor}`; nil before the API gave one.
  var token: String?
  /// Whether `{cursor}` is the opaque text rather than the integer.
  var opaque = false
  /// A recipe of several streams: every stream's cursor as `recipe.cursor.list` joins them (`{cursors}`).
  var cursorList: String?

  /// An opaque cursor's value: in a JSON body, `"{cursor}"` alone is a number when the API's cursor is an integer
  /// (CometD's `ext.ack`, which servers read as a number), and a string otherwise.
  static func opaqueValue(_ token: String) -> RecipeValue {
    let digits = token.utf8.drop { $0 == UInt8(ascii: "-") }
    let integer =
      !digits.isEmpty && digits.count < 19 && digits.count + 1 >= token.utf8.count
      && digits.allSatisfy { (0x30...0x39).contains($0) } && (digits.first != 0x30 || digits.count == 1)
      && token != "-0"
    return RecipeValue(text: token, json: integer ? token : nil)
  }

  /// An opaque cursor in parts (`{cursor.PART}`): the token is their JSON object.
  var cursorParts: [String: String] {
    guard let token, token.hasPrefix("{"), let json = try? RawJSON.parse(token), case .object(let members) = json.value
    else { return [:] }
    var parts: [String: String] = [:]
    for (key, value) in members { if let text = value.stringValue { parts[key] = text } }
    return parts
  }

  func value(of placeholder: RecipeTemplate.Placeholder) -> RecipeValue? {
    switch placeholder {
    case .name(let name) where name.hasPrefix("cursor."):
      cursorParts[String(name.dropFirst(7))].map { RecipeValue(text: $0) }
    case .name(let name): self[name]
    case .cursor: opaque ? token.map(RecipeScope.opaqueValue) : cursor.map(RecipeValue.init)
    case .next: cursor.map { RecipeValue($0 == .max ? $0 : $0 + 1) }
    case .cursors: cursorList.map { RecipeValue(text: $0) }
    case .env(let name, let fallback): (environment[name] ?? fallback).map { RecipeValue(text: $0) }
    case .credential: credential.map { RecipeValue(text: $0) }
    case .now: RecipeValue(UInt64(max(0, Date().timeIntervalSince1970 * 1000)))
    case .nonce: RecipeValue(text: String(UInt64.random(in: 1 << 60...UInt64.max), radix: 16))
    }
  }

  /// A named value: the session's, else the recipe's var.
  subscript(name: String) -> RecipeValue? { values[name] ?? vars[name] }

  /// The values (by name) that are secrets: the session's, and vars read from the environment.
  var secretNames: Set<String> = []
  /// Literal text that is secret (configured header values of `generic`).
  var literalSecrets: [String] = []
  /// `secrets`, computed once for a session's scope.
  var redactions: [String]?
  /// The environment variables the recipe reads.
  var environmentNames: Set<String> = []

  /// Values that must never be shown: the credential, the session's values, and what the recipe reads from the
  /// environment (a URL excepted: `redactURL` hides its userinfo and secret query values).
  var secrets: [String] {
    var all = secretNames.compactMap { self[$0]?.text }.filter(RecipeScope.isSecretValue)
    all += environmentNames.compactMap { environment[$0] }.filter(RecipeScope.isSecretValue)
    if let credential, credential.count >= 4 { all.append(credential) }
    return all + literalSecrets
  }

  /// Whether a session's or the environment's value is redacted as a whole: not a URL (`redactURL` hides a URL's
  /// userinfo and secret query values, and its host must stay readable) and at least 4 characters (a shorter one
  /// would cut every `1` or `true` out of a log line). `recipe check` names the same values as hidden.
  static func isSecretValue(_ text: String) -> Bool {
    !(text.hasPrefix("http://") || text.hasPrefix("https://")) && text.count >= 4
  }
}

extension RecipeTemplate {
  /// How a placeholder's value is put in.
  enum Placement {
    /// The URL: vars and `{env:…}` (written by the operator) and a placeholder that starts the URL (a server
    /// address a session step returned) go in as they are; every other value is percent-encoded.
    case url
    /// A query or form value: percent-encoded as a whole, literal text and values alike.
    case encoded
    /// A header value: as it is, refused when it holds a control byte.
    case header
    /// Plain text (an event id template, a user id).
    case text
  }

  /// The rendered text, or nil naming the placeholder that has no value. Header placement refuses CR, LF and
  /// every other control byte in a value (the one CR/LF-safe builder, `OutgoingRequest`, checks the whole
  /// request again before it leaves).
  func render(_ scope: RecipeScope, _ placement: Placement, vars: Set<String> = []) throws(UpstreamError) -> String {
    var text = ""
    /// Where encoded values went in the URL's path (UTF-8 offsets), each checked once the whole URL is known.
    var placedInPath: [(range: Range<Int>, placeholder: Placeholder)] = []
    for (index, part) in parts.enumerated() {
      switch part {
      case .literal(let literal): text += placement == .encoded ? encodeQueryValue(literal) : literal
      case .placeholder(let placeholder):
        guard let value = scope.value(of: placeholder) else {
          throw UpstreamError(.decoding, "\(placeholder.spelled) has no value")
        }
        switch placement {
        case .url:
          var trusted = index == 0
          if case .env = placeholder { trusted = true }
          if case .name(let name) = placeholder, vars.contains(name) { trusted = true }
          if trusted {
            text += value.text
          } else {
            let start = text.utf8.count
            text += encodeQueryValue(value.text)
            if !text.utf8.contains(where: { $0 == UInt8(ascii: "?") || $0 == UInt8(ascii: "#") }) {
              placedInPath.append((start..<text.utf8.count, placeholder))
            }
          }
        case .encoded: text += encodeQueryValue(value.text)
        case .header:
          if let problem = OutgoingRequest.problem(inHeaderValue: value.text, "the value of \(placeholder.spelled)") {
            throw UpstreamError(.unsafeRequest, "request refused: \(problem)")
          }
          text += value.text
        case .text: text += value.text
        }
      }
    }
    for (range, placeholder) in placedInPath {
      if let problem = URLPathSegment.problem(in: text, around: range) {
        let message = "request refused: the value of \(placeholder.spelled) makes \(problem)"
        throw UpstreamError(placeholder == .credential ? .invalidCredential : .unsafeRequest, message)
      }
    }
    return text
  }

  /// The text with every placeholder that has a value in `scope` replaced as plain text, the others left as written.
  func renderKnown(_ scope: RecipeScope) throws(UpstreamError) -> String {
    parts.map { part in
      switch part {
      case .literal(let text): text
      case .placeholder(let placeholder): scope.value(of: placeholder)?.text ?? placeholder.spelled
      }
    }.joined()
  }

}
