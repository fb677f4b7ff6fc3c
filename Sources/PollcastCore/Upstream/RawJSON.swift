/// A strict JSON parser that keeps, for every value, the exact bytes it was written with, so that upstream
/// messages can be relayed verbatim (no re-encoding, no key reordering, numbers untouched).
public struct RawJSON: Sendable {
  public indirect enum Value: Sendable {
    case null
    case bool(Bool)
    /// The number's text, as written.
    case number(String)
    case string(String)
    case array([RawJSON])
    case object([(key: String, value: RawJSON)])
    /// A value nested deeper than `RawJSON.maxDepth`: checked to be well-formed, kept only as text. Whatever
    /// contains one is `poisoned`, so that one hostile message can be skipped without losing its neighbours.
    case tooDeep
  }

  /// Containers nested deeper than this are not materialised (`Value.tooDeep`).
  public static let maxDepth = 256

  public let value: Value
  /// The value's bytes, as they appeared in the document.
  public let text: Substring.UTF8View
  /// True when this value is, or contains, a `tooDeep` value.
  public let poisoned: Bool

  init(value: Value, text: Substring.UTF8View, poisoned: Bool = false) {
    self.value = value
    self.text = text
    self.poisoned = poisoned
  }

  /// Byte offset of this value in the document it was parsed from.
  public var offset: Int {
    let substring = Substring(text)
    return substring.base.utf8.distance(from: substring.base.utf8.startIndex, to: text.startIndex)
  }

  public var rawText: String { String(Substring(text)) }

  /// Parses a whole document; trailing non-space bytes are an error.
  public static func parse(_ document: String) throws(RawJSONError) -> RawJSON {
    var parser = Parser(document: document)
    parser.skipSpace()
    let value = try parser.parseValue(depth: 0)
    parser.skipSpace()
    guard parser.index == parser.bytes.endIndex else { throw parser.error("unexpected bytes after the document") }
    return value
  }

  /// Follows an RFC 6901 JSON pointer (`""` is the whole document, `/a/0/b`, with `~0` and `~1` escapes).
  public func resolve(pointer: String) -> RawJSON? {
    guard !pointer.isEmpty else { return self }
    guard pointer.hasPrefix("/") else { return nil }
    var current = self
    let utf8 = pointer.utf8
    var start = utf8.index(after: utf8.startIndex)
    while true {
      // Token by token without splitting into an array, and unescaped only when it has a `~`: this runs for every
      // event's id on every poll.
      let end = utf8[start...].firstIndex(of: UInt8(ascii: "/")) ?? utf8.endIndex
      var key = String(Substring(utf8[start..<end]))
      if key.containsASCII(UInt8(ascii: "~")) {
        key = key.replacingEvery("~1", with: "/").replacingEvery("~0", with: "~")
      }
      switch current.value {
      case .object(let members):
        guard let member = members.last(where: { $0.key == key }) else { return nil }
        current = member.value
      case .array(let elements):
        guard let index = Int(key), index >= 0, index < elements.count, key == String(index) else { return nil }
        current = elements[index]
      default:
        return nil
      }
      guard end < utf8.endIndex else { return current }
      start = utf8.index(after: end)
    }
  }

  /// The member `key` of an object.
  public subscript(key: String) -> RawJSON? {
    guard case .object(let members) = value else { return nil }
    return members.last(where: { $0.key == key })?.value
  }

  /// An id as an unsigned integer: a JSON integer, or a string of digits.
  public var unsignedID: UInt64? {
    switch value {
    case .number(let text): UInt64(text)
    case .string(let text): ResumeDecision.parseEventID(text)
    default: nil
    }
  }

  public var stringValue: String? {
    if case .string(let text) = value { return text }
    return nil
  }

  private struct Parser {
    let document: String
    let bytes: String.UTF8View
    var index: String.UTF8View.Index

    init(document: String) {
      self.document = document
      self.bytes = document.utf8
      self.index = bytes.startIndex
    }

    func error(_ message: String) -> RawJSONError {
      RawJSONError(message: message, offset: bytes.distance(from: bytes.startIndex, to: index))
    }

    mutating func skipSpace() {
      while index < bytes.endIndex {
        switch bytes[index] {
        case 0x20, 0x09, 0x0A, 0x0D: index = bytes.index(after: index)
        default: return
        }
      }
    }

    var current: UInt8? { index < bytes.endIndex ? bytes[index] : nil }

    mutating func advance() { index = bytes.index(after: index) }

    mutating func parseValue(depth: Int) throws(RawJSONError) -> RawJSON {
      let start = index
      guard let byte = current else { throw error("unexpected end of document") }
      let value: Value
      var poisoned = false
      switch byte {
      case UInt8(ascii: "{") where depth >= RawJSON.maxDepth, UInt8(ascii: "[") where depth >= RawJSON.maxDepth:
        try skipContainer()
        value = .tooDeep
        poisoned = true
      case UInt8(ascii: "{"): (value, poisoned) = try parseObject(depth: depth)
      case UInt8(ascii: "["): (value, poisoned) = try parseArray(depth: depth)
      case UInt8(ascii: "\""): value = .string(try parseString())
      case UInt8(ascii: "t"):
        try literal("true")
        value = .bool(true)
      case UInt8(ascii: "f"):
        try literal("false")
        value = .bool(false)
      case UInt8(ascii: "n"):
        try literal("null")
        value = .null
      case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): value = .number(try parseNumber())
      default: throw error("unexpected character")
      }
      return RawJSON(value: value, text: Substring(document)[start..<index].utf8, poisoned: poisoned)
    }

    /// Checks a container too deep to materialise without recursion: brackets balance and match, strings and
    /// scalars are well-formed where they stand. Stops after its closing bracket.
    mutating func skipContainer() throws(RawJSONError) {
      var open: [UInt8] = []
      repeat {
        skipSpace()
        guard let byte = current else { throw error("unterminated nested value") }
        switch byte {
        case UInt8(ascii: "{"), UInt8(ascii: "["):
          open.append(byte == UInt8(ascii: "{") ? UInt8(ascii: "}") : UInt8(ascii: "]"))
          advance()
        case UInt8(ascii: "}"), UInt8(ascii: "]"):
          guard open.last == byte else { throw error("mismatched bracket") }
          open.removeLast()
          advance()
        case UInt8(ascii: ","), UInt8(ascii: ":"): advance()
        case UInt8(ascii: "\""): _ = try parseString()
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): _ = try parseNumber()
        default: throw error("unexpected character")
        }
      } while !open.isEmpty
    }

    mutating func literal(_ word: String) throws(RawJSONError) {
      for expected in word.utf8 {
        guard current == expected else { throw error("invalid literal") }
        advance()
      }
    }

    mutating func parseNumber() throws(RawJSONError) -> String {
      let start = index
      if current == UInt8(ascii: "-") { advance() }
      guard let first = current, first >= 0x30 && first <= 0x39 else { throw error("invalid number") }
      advance()
      if first != 0x30 { while let digit = current, digit >= 0x30 && digit <= 0x39 { advance() } }
      if current == UInt8(ascii: ".") {
        advance()
        guard let digit = current, digit >= 0x30 && digit <= 0x39 else { throw error("invalid fraction") }
        while let digit = current, digit >= 0x30 && digit <= 0x39 { advance() }
      }
      if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
        advance()
        if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { advance() }
        guard let digit = current, digit >= 0x30 && digit <= 0x39 else { throw error("invalid exponent") }
        while let digit = current, digit >= 0x30 && digit <= 0x39 { advance() }
      }
      return String(Substring(document)[start..<index])
    }

    /// A string's value. Most strings have no escape: their bytes are copied once, straight from the document
    /// (a small one not at all). With escapes, the runs between them are appended as UTF-8, not scalar by scalar.
    mutating func parseString() throws(RawJSONError) -> String {
      advance()  // opening quote
      var text = ""
      var escaped = false
      var runStart = index
      while true {
        guard let byte = current else { throw error("unterminated string") }
        switch byte {
        case UInt8(ascii: "\""):
          let run = Substring(document)[runStart..<index]
          advance()
          guard escaped else { return String(run) }
          text += run
          return text
        case UInt8(ascii: "\\"):
          text += Substring(document)[runStart..<index]
          escaped = true
          advance()
          guard let escape = current else { throw error("unterminated escape") }
          advance()
          text.unicodeScalars.append(try unescaped(escape))
          runStart = index
        case 0..<0x20:
          throw error("control character in string")
        default:
          advance()
        }
      }
    }

    /// The scalar an escape stands for, `escape` being the byte after its backslash (a `\u` escape's digits, and a
    /// surrogate pair's second half, are read here).
    mutating func unescaped(_ escape: UInt8) throws(RawJSONError) -> Unicode.Scalar {
      switch escape {
      case UInt8(ascii: "\""): return "\""
      case UInt8(ascii: "\\"): return "\\"
      case UInt8(ascii: "/"): return "/"
      case UInt8(ascii: "b"): return "\u{08}"
      case UInt8(ascii: "f"): return "\u{0C}"
      case UInt8(ascii: "n"): return "\n"
      case UInt8(ascii: "r"): return "\r"
      case UInt8(ascii: "t"): return "\t"
      case UInt8(ascii: "u"):
        var code = try hex4()
        if (0xD800..<0xDC00).contains(code) {
          guard current == UInt8(ascii: "\\") else { throw error("lone high surrogate") }
          advance()
          guard current == UInt8(ascii: "u") else { throw error("lone high surrogate") }
          advance()
          let low = try hex4()
          guard (0xDC00..<0xE000).contains(low) else { throw error("invalid low surrogate") }
          code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
        } else if (0xDC00..<0xE000).contains(code) {
          throw error("lone low surrogate")
        }
        guard let scalar = Unicode.Scalar(code) else { throw error("invalid \\u escape") }
        return scalar
      default:
        throw error("invalid escape")
      }
    }

    mutating func hex4() throws(RawJSONError) -> UInt32 {
      var value: UInt32 = 0
      for _ in 0..<4 {
        guard let byte = current else { throw error("truncated \\u escape") }
        let digit: UInt32
        switch byte {
        case 0x30...0x39: digit = UInt32(byte - 0x30)
        case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
        case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
        default: throw error("invalid hex digit")
        }
        value = value * 16 + digit
        advance()
      }
      return value
    }

    mutating func parseArray(depth: Int) throws(RawJSONError) -> (Value, poisoned: Bool) {
      advance()
      var elements: [RawJSON] = []
      var poisoned = false
      skipSpace()
      if current == UInt8(ascii: "]") {
        advance()
        return (.array(elements), false)
      }
      while true {
        skipSpace()
        let element = try parseValue(depth: depth + 1)
        poisoned = poisoned || element.poisoned
        elements.append(element)
        skipSpace()
        guard let byte = current else { throw error("unterminated array") }
        advance()
        if byte == UInt8(ascii: "]") { return (.array(elements), poisoned) }
        guard byte == UInt8(ascii: ",") else { throw error("expected , or ] in array") }
      }
    }

    mutating func parseObject(depth: Int) throws(RawJSONError) -> (Value, poisoned: Bool) {
      advance()
      var members: [(key: String, value: RawJSON)] = []
      var poisoned = false
      skipSpace()
      if current == UInt8(ascii: "}") {
        advance()
        return (.object(members), false)
      }
      while true {
        skipSpace()
        guard current == UInt8(ascii: "\"") else { throw error("expected a member name") }
        let key = try parseString()
        skipSpace()
        guard current == UInt8(ascii: ":") else { throw error("expected : after a member name") }
        advance()
        skipSpace()
        let member = try parseValue(depth: depth + 1)
        poisoned = poisoned || member.poisoned
        members.append((key, member))
        skipSpace()
        guard let byte = current else { throw error("unterminated object") }
        advance()
        if byte == UInt8(ascii: "}") { return (.object(members), poisoned) }
        guard byte == UInt8(ascii: ",") else { throw error("expected , or } in object") }
      }
    }
  }
}

/// The document is not JSON.
public struct RawJSONError: Error, CustomStringConvertible, Sendable, Equatable {
  public var message: String
  /// Byte offset where parsing stopped.
  public var offset: Int
  public var description: String { "\(message) at byte \(offset)" }
}
