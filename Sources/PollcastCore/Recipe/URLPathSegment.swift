/// The path segment a placed value ends up in, checked so that a value can never move the request to another path:
/// a segment that is empty, `.` or `..` (also spelled `%2E`) is removed or climbs a level when a client or server
/// normalises the path (RFC 3986 §5.2.4), so `/users/{credential}/events` with the key `..` would ask for `/events`.
enum URLPathSegment {
  /// Why the segment holding the bytes at `range` of `url` (UTF-8 offsets) is unsafe, or nil when it is a plain
  /// segment. Only the path is looked at: the caller passes ranges before any `?` or `#`.
  static func problem(in url: String, around range: Range<Int>) -> String? {
    let bytes = Array(url.utf8)
    guard range.lowerBound >= 0, range.upperBound <= bytes.count else { return "a URL it cannot be placed in" }
    // The path starts after the authority: `scheme://authority/…`.
    var pathStart = 0
    if let scheme = firstIndex(of: Array("://".utf8), in: bytes) {
      pathStart = bytes[(scheme + 3)...].firstIndex(of: UInt8(ascii: "/")) ?? bytes.count
    }
    guard range.lowerBound >= pathStart else { return nil }
    var start = range.lowerBound
    while start > pathStart, bytes[start - 1] != UInt8(ascii: "/") { start -= 1 }
    var end = range.upperBound
    while end < bytes.count, !isSegmentEnd(bytes[end]) { end += 1 }
    let segment = decoded(bytes[start..<end])
    if segment.isEmpty { return "an empty path segment" }
    if segment == [0x2E] || segment == [0x2E, 0x2E] { return "a dot segment in the URL's path" }
    return nil
  }

  private static func isSegmentEnd(_ byte: UInt8) -> Bool {
    byte == UInt8(ascii: "/") || byte == UInt8(ascii: "?") || byte == UInt8(ascii: "#")
  }

  /// The segment with `%XX` decoded once, as a server normalising the path reads it.
  private static func decoded(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
    var out: [UInt8] = []
    var index = bytes.startIndex
    while index < bytes.endIndex {
      if bytes[index] == UInt8(ascii: "%"), index + 2 < bytes.endIndex,
        let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2])
      {
        out.append(high << 4 | low)
        index += 3
      } else {
        out.append(bytes[index])
        index += 1
      }
    }
    return out
  }

  private static func hexValue(_ byte: UInt8) -> UInt8? {
    switch byte {
    case 0x30...0x39: byte - 0x30
    case 0x41...0x46: byte - 0x41 + 10
    case 0x61...0x66: byte - 0x61 + 10
    default: nil
    }
  }

  private static func firstIndex(of needle: [UInt8], in bytes: [UInt8]) -> Int? {
    guard bytes.count >= needle.count else { return nil }
    return (0...(bytes.count - needle.count)).first { bytes[$0..<$0 + needle.count].elementsEqual(needle) }
  }
}
