/// An incremental Server-Sent Events parser following the WHATWG rules (lines end with CR, LF or CRLF; one
/// leading space after the colon is dropped; `id` with a NUL is ignored; an event is dispatched at a blank line
/// when its data is not empty). Used by tests and the benchmark client; the relay itself only encodes.
public struct SSEParser {
  public struct Event: Equatable, Sendable {
    public var type: String
    public var data: String
    /// The last event id in force when this event was dispatched (what a browser would send on reconnect).
    public var lastEventID: String
    /// Whether the event block itself carried an `id:` field.
    public var hadID: Bool
    public var retry: Int?
  }

  private var line: [UInt8] = []
  private var sawCR = false
  private var dataBuffer: [UInt8] = []
  private var hasData = false
  private var eventType = ""
  private var hadID = false
  private var pendingRetry: Int?
  public private(set) var lastEventID = ""
  public private(set) var retry: Int?
  public private(set) var comments: Int = 0

  public init() {}

  /// Feeds bytes; returns the events completed by them.
  public mutating func feed<Bytes: Sequence>(_ bytes: Bytes) -> [Event] where Bytes.Element == UInt8 {
    var events: [Event] = []
    for byte in bytes {
      if sawCR {
        sawCR = false
        if byte == 0x0A { continue }
      }
      switch byte {
      case 0x0D:
        sawCR = true
        if let event = endLine() { events.append(event) }
      case 0x0A:
        if let event = endLine() { events.append(event) }
      default:
        line.append(byte)
      }
    }
    return events
  }

  private mutating func endLine() -> Event? {
    defer { line.removeAll(keepingCapacity: true) }
    if line.isEmpty { return dispatch() }
    if line[0] == 0x3A {
      comments += 1
      return nil
    }
    var name = line[...]
    var value: ArraySlice<UInt8> = []
    if let colon = line.firstIndex(of: 0x3A) {
      name = line[..<colon]
      value = line[(colon + 1)...]
      if value.first == 0x20 { value = value.dropFirst() }
    }
    switch String(decoding: name, as: UTF8.self) {
    case "event":
      eventType = String(decoding: value, as: UTF8.self)
    case "data":
      dataBuffer.append(contentsOf: value)
      dataBuffer.append(0x0A)
      hasData = true
    case "id":
      if !value.contains(0) {
        lastEventID = String(decoding: value, as: UTF8.self)
        hadID = true
      }
    case "retry":
      if !value.isEmpty, value.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
        let ms = Int(String(decoding: value, as: UTF8.self))
      {
        retry = ms
        pendingRetry = ms
      }
    default:
      break
    }
    return nil
  }

  private mutating func dispatch() -> Event? {
    defer {
      dataBuffer.removeAll(keepingCapacity: true)
      hasData = false
      eventType = ""
      hadID = false
      pendingRetry = nil
    }
    guard hasData else { return nil }
    if dataBuffer.last == 0x0A { dataBuffer.removeLast() }
    return Event(
      type: eventType.isEmpty ? "message" : eventType, data: String(decoding: dataBuffer, as: UTF8.self),
      lastEventID: lastEventID, hadID: hadID, retry: pendingRetry)
  }
}
