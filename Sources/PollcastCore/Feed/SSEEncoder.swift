/// Encodes Server-Sent Events to their wire bytes.
///
/// The encoder guarantees a well-formed stream whatever the payload holds: every CR, LF and CRLF in the data
/// starts a new `data:` line (so a payload can never end an event early or inject a field), an event type is
/// stripped of line breaks, and an id is always a plain decimal number.
public enum SSEEncoder {
  /// Appends one event to `out`.
  public static func appendEvent(id: UInt64?, type: String?, data: String, to out: inout [UInt8]) {
    if let type, type != "message" {
      out.append(contentsOf: "event: ".utf8)
      for byte in type.utf8 where byte != 0x0A && byte != 0x0D { out.append(byte) }
      out.append(0x0A)
    }
    if let id {
      out.append(contentsOf: "id: ".utf8)
      appendDecimal(id, to: &out)
      out.append(0x0A)
    }
    appendData(data, to: &out)
    out.append(0x0A)
  }

  /// One event as its own byte array.
  public static func event(id: UInt64?, type: String?, data: String) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(data.utf8.count + 48)
    appendEvent(id: id, type: type, data: data, to: &out)
    return out
  }

  /// A comment line (`: text`), for the opening line and heartbeats; line breaks in `text` are dropped.
  ///
  /// No blank line follows it: a blank line ends a block, and a block with no `data:` must never be sent. Browsers
  /// dispatch nothing for one, but popular client libraries (Python's httpx-sse) surface an empty `message` event
  /// for a block that set only `retry:`. A lone comment line is ignored by every parser wherever it stands.
  public static func comment(_ text: String) -> [UInt8] {
    var out: [UInt8] = [0x3A]
    if !text.isEmpty { out.append(0x20) }
    for byte in text.utf8 where byte != 0x0A && byte != 0x0D { out.append(byte) }
    out.append(0x0A)
    return out
  }

  /// The `retry:` field line, which tells clients how long to wait before reconnecting. No blank line follows: it
  /// becomes part of the first real event's block (which always has `data:`), never a block of its own.
  public static func retry(milliseconds: Int) -> [UInt8] {
    var out = Array("retry: ".utf8)
    appendDecimal(UInt64(max(0, milliseconds)), to: &out)
    out.append(0x0A)
    return out
  }

  static func appendData(_ data: String, to out: inout [UInt8]) {
    var utf8 = data.utf8.makeIterator()
    appendLinePrefix(to: &out)
    var previousWasCR = false
    while let byte = utf8.next() {
      switch byte {
      case 0x0D:
        out.append(0x0A)
        appendLinePrefix(to: &out)
        previousWasCR = true
        continue
      case 0x0A:
        if !previousWasCR {
          out.append(0x0A)
          appendLinePrefix(to: &out)
        }
      default:
        out.append(byte)
      }
      previousWasCR = false
    }
    out.append(0x0A)
  }

  /// `data: ` — the space is always written, so a payload starting with a space keeps it (parsers strip one).
  private static func appendLinePrefix(to out: inout [UInt8]) {
    out.append(contentsOf: [0x64, 0x61, 0x74, 0x61, 0x3A, 0x20])
  }

  static func appendDecimal(_ value: UInt64, to out: inout [UInt8]) {
    if value == 0 {
      out.append(0x30)
      return
    }
    let start = out.count
    var rest = value
    while rest > 0 {
      out.append(UInt8(truncatingIfNeeded: rest % 10) + 0x30)
      rest /= 10
    }
    out[start...].reverse()
  }
}
