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
  /// Whether a JSON pointer has a `*` segment (`/*`), found by bytes: it is asked on every answer.
  var hasWildcardSegment: Bool {
    var previousWasSlash = false
    for byte in utf8 {
      if previousWasSlash && byte == UInt8(ascii: "*") { return true }
      previousWasSlash = byte == UInt8(ascii: "/")
    }
    return false
  }
}
