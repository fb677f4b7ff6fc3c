/// Minimal JSON text building for the relay's own small payloads (reset notices, status), so that the hot path
/// needs no `JSONSerialization` round trip. Upstream messages are never re-encoded: they are embedded verbatim.
public enum JSONText {
  /// `"…"` with every character JSON requires escaped.
  public static func quoted(_ text: String) -> String {
    var out = ""
    out.reserveCapacity(text.utf8.count + 2)
    appendQuoted(text, to: &out)
    return out
  }

  /// Appends `"…"` with every character JSON requires escaped. A text with nothing to escape (the usual one: no
  /// quote, backslash or control character, and no U+2028 or U+2029, whose UTF-8 starts with 0xE2) is appended
  /// whole, not scalar by scalar.
  public static func appendQuoted(_ text: String, to out: inout String) {
    out += "\""
    if text.utf8.allSatisfy({ $0 >= 0x20 && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "\\") && $0 != 0xE2 }) {
      out += text
    } else {
      for scalar in text.unicodeScalars {
        switch scalar {
        case "\"": out += "\\\""
        case "\\": out += "\\\\"
        case "\n": out += "\\n"
        case "\r": out += "\\r"
        case "\t": out += "\\t"
        case let s where s.value < 0x20 || s.value == 0x2028 || s.value == 0x2029: appendUnicodeEscape(s, to: &out)
        default: out.unicodeScalars.append(scalar)
        }
      }
    }
    out += "\""
  }

  /// Appends JSON's `\uXXXX` escape of a scalar of the Basic Multilingual Plane (a control character, U+2028).
  static func appendUnicodeEscape(_ scalar: Unicode.Scalar, to out: inout String) {
    let hex = String(scalar.value, radix: 16)
    out += "\\u" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
  }

  /// An object from ordered key/value pairs whose values are already JSON text.
  public static func object(_ pairs: KeyValuePairs<String, String>) -> String {
    object(pairs.map { ($0.key, $0.value) })
  }

  /// An object from ordered key/value pairs whose values are already JSON text.
  public static func object(_ pairs: [(String, String)]) -> String {
    var out = "{"
    out.reserveCapacity(pairs.reduce(2) { $0 + $1.0.utf8.count + $1.1.utf8.count + 4 })
    var first = true
    for (key, value) in pairs {
      if !first { out += "," }
      first = false
      appendQuoted(key, to: &out)
      out += ":"
      out += value
    }
    out += "}"
    return out
  }
}
