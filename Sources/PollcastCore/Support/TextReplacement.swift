extension String {
  /// This text with every occurrence of `target` replaced by `replacement`, matched as UTF-8 bytes, left to right,
  /// without overlaps. An empty `target` changes nothing.
  ///
  /// Used where either side can come from outside (an upstream answer, a session value, a subscriber's key):
  /// Foundation's `replacingOccurrences(of:with:)` traps on Linux for some such strings (the recipe fuzzer found one
  /// with NUL bytes in both the answer and the secret being redacted), and a redaction must never crash the relay.
  /// Byte matching is also what redaction means: a secret is hidden where its exact bytes stand. A match of a
  /// valid UTF-8 `target` starts and ends on character boundaries, so the result is valid UTF-8.
  func replacingEvery(_ target: String, with replacement: String) -> String {
    let searched = utf8.withContiguousStorageIfAvailable { text in
      target.utf8.withContiguousStorageIfAvailable { needle in Self.replace(text, needle, replacement) }
    }
    if let searched, let bytes = searched {
      return bytes.map { String(decoding: $0, as: UTF8.self) } ?? self
    }
    // Non-contiguous (bridged) storage: the same search over copies.
    let replaced = Array(utf8).withUnsafeBufferPointer { text in
      Array(target.utf8).withUnsafeBufferPointer { needle in Self.replace(text, needle, replacement) }
    }
    return replaced.map { String(decoding: $0, as: UTF8.self) } ?? self
  }

  /// The bytes of `text` with `needle` replaced, or nil when it does not occur (or is empty).
  private static func replace(
    _ text: UnsafeBufferPointer<UInt8>, _ needle: UnsafeBufferPointer<UInt8>, _ replacement: String
  ) -> [UInt8]? {
    guard let first = needle.first, needle.count <= text.count else { return nil }
    var output: [UInt8] = []
    var copied = 0
    var index = 0
    let last = text.count - needle.count
    while index <= last {
      if text[index] == first && (1..<needle.count).allSatisfy({ text[index + $0] == needle[$0] }) {
        if output.isEmpty { output.reserveCapacity(text.count) }
        output.append(contentsOf: text[copied..<index])
        output.append(contentsOf: replacement.utf8)
        index += needle.count
        copied = index
      } else {
        index += 1
      }
    }
    guard copied > 0 else { return nil }
    output.append(contentsOf: text[copied...])
    return output
  }
}
