/// Parses a query string the way browsers build and read one (WHATWG `application/x-www-form-urlencoded`):
/// pairs split on `&`, empty pairs skipped, a pair without `=` is a name with an empty value (`?x=1&y`), `+` is a
/// space, `%XX` is a byte, and a `%` not followed by two hex digits stays as it is. Bytes that are not UTF-8 after
/// decoding become U+FFFD. Never fails: unknown or odd parameters are the handler's to ignore.
public enum QueryString {
  public static func parse(_ query: Substring.UTF8View) -> [(name: String, value: String)] {
    var items: [(name: String, value: String)] = []
    var start = query.startIndex
    while start <= query.endIndex {
      let end = query[start...].firstIndex(of: UInt8(ascii: "&")) ?? query.endIndex
      let pair = query[start..<end]
      if !pair.isEmpty {
        if let equals = pair.firstIndex(of: UInt8(ascii: "=")) {
          items.append((decode(pair[..<equals]), decode(pair[pair.index(after: equals)...])))
        } else {
          items.append((decode(pair), ""))
        }
      }
      guard end < query.endIndex else { break }
      start = query.index(after: end)
    }
    return items
  }

  public static func parse(_ query: String) -> [(name: String, value: String)] {
    parse(Substring(query).utf8)
  }

  /// Percent-decodes one name or value (`+` is a space).
  public static func decode(_ text: Substring.UTF8View) -> String {
    var bytes: [UInt8] = []
    bytes.reserveCapacity(text.count)
    var index = text.startIndex
    while index < text.endIndex {
      let byte = text[index]
      if byte == UInt8(ascii: "%") {
        let first = text.index(after: index)
        if first < text.endIndex {
          let second = text.index(after: first)
          if second < text.endIndex, let high = hexDigit(text[first]), let low = hexDigit(text[second]) {
            bytes.append(high << 4 | low)
            index = text.index(after: second)
            continue
          }
        }
        bytes.append(byte)
      } else if byte == UInt8(ascii: "+") {
        bytes.append(UInt8(ascii: " "))
      } else {
        bytes.append(byte)
      }
      index = text.index(after: index)
    }
    return String(decoding: bytes, as: UTF8.self)
  }

}
