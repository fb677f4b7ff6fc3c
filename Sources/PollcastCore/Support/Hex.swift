import Foundation

extension Sequence<UInt8> {
  /// Lowercase hex, two digits a byte (digests, stored secrets).
  var lowercaseHex: String { map { String(format: "%02x", $0) }.joined() }
}
