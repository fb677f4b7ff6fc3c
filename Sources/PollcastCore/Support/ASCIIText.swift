extension StringProtocol {
  /// This text without leading and trailing spaces and tabs.
  ///
  /// For the numbers, ids and delays read from upstream answers on every poll: Foundation's
  /// `trimmingCharacters(in: .whitespaces)` goes through `NSString` and a `CharacterSet` on Linux, and cost ~3 % of
  /// the relay's samples per delivery in the chat recipe's profile. Only ASCII blanks are trimmed: no integer or
  /// delay parses with any other kind of space around it anyway.
  var trimmingSpacesAndTabs: Substring {
    let text = Substring(self)
    guard let first = text.utf8.firstIndex(where: { $0 != 0x20 && $0 != 0x09 }) else { return text[text.endIndex...] }
    let last = text.utf8.lastIndex(where: { $0 != 0x20 && $0 != 0x09 })!
    return text[first...last]
  }

  /// Whether the UTF-8 of this text holds `byte` (an ASCII character), without Foundation's `NSString` search.
  func containsASCII(_ byte: UInt8) -> Bool {
    utf8.contains(byte)
  }
}

extension String {
  /// Where the first `/*` of a JSON pointer stands, found by bytes: it is asked on every answer (events at a
  /// wildcard, conditions of rules), and Foundation's `range(of:)` goes through `NSString` on Linux. Whether the `*`
  /// is a whole segment (followed by `/` or the end) is the caller's to check.
  var firstSlashStar: Range<String.Index>? {
    var slash: String.Index?
    for index in utf8.indices {
      let byte = utf8[index]
      if let start = slash, byte == UInt8(ascii: "*") { return start..<utf8.index(after: index) }
      slash = byte == UInt8(ascii: "/") ? index : nil
    }
    return nil
  }

  /// Whether a JSON pointer holds `/*`.
  var hasWildcardSegment: Bool { firstSlashStar != nil }
}
