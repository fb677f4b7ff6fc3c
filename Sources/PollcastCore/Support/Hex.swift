import Foundation

private let hexDigits = Array("0123456789abcdef".utf8)

extension Sequence<UInt8> {
  /// Lowercase hex, two digits a byte (digests, stored secrets).
  /// From a table, not `String(format:)` (Foundation's formatter, once per byte): a per-user relay renders a key
  /// digest for every stream that opens (`AccountHub.grant`) and for every key due on a re-check pass, and the
  /// formatter showed in issue 23's profile.
  var lowercaseHex: String {
    let digits = hexDigits
    var text: [UInt8] = []
    text.reserveCapacity(underestimatedCount * 2)
    for byte in self {
      text.append(digits[Int(byte >> 4)])
      text.append(digits[Int(byte & 0x0f)])
    }
    return String(decoding: text, as: UTF8.self)
  }
}

extension [UInt8] {
  /// The bytes `hex` spells (two digits a byte, either case), or nil when it is not hex.
  init?(hex: String) {
    let digits = [UInt8](hex.utf8)
    guard digits.count % 2 == 0 else { return nil }
    var bytes: [UInt8] = []
    bytes.reserveCapacity(digits.count / 2)
    for index in stride(from: 0, to: digits.count, by: 2) {
      guard let high = hexDigit(digits[index]), let low = hexDigit(digits[index + 1]) else { return nil }
      bytes.append(high << 4 | low)
    }
    self = bytes
  }
}

/// The value of one hex digit, or nil.
func hexDigit(_ byte: UInt8) -> UInt8? {
  switch byte {
  case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
  case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
  case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
  default: nil
  }
}
