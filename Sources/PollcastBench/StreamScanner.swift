/// Incremental reader of one SSE response as a benchmark needs it: the HTTP head, chunked framing, and in the
/// body only what identifies a benchmark event — the `id:` in force and a `bench <seq> <sent-µs>` marker in a
/// `data:` line (inside JSON for Pollcast, the raw body for nchan). Everything else is skipped without copying.
public struct StreamScanner {
  public struct Event: Equatable {
    public var sequence: Int
    public var sentMicros: UInt64
  }

  public private(set) var status = 0
  public private(set) var headDone = false
  public private(set) var lastEventID: [UInt8] = []
  private var head: [UInt8] = []
  private var chunked = false
  private var chunkState = ChunkState.size
  private var chunkRemaining = 0
  private var sizeDigits = 0
  private var line: [UInt8] = []
  private var pendingID: [UInt8]?

  private enum ChunkState { case size, sizeExtension, data, dataCR, dataLF, done }

  public init() { line.reserveCapacity(512) }

  /// Feeds received bytes; calls `event` for every benchmark event completed by them.
  public mutating func feed(_ bytes: UnsafeRawBufferPointer, event: (Event) -> Void) {
    var index = 0
    if !headDone {
      while index < bytes.count && !headDone {
        head.append(bytes[index])
        index += 1
        if head.count >= 4 && head[head.count - 4] == 13 && head[head.count - 3] == 10 && head[head.count - 2] == 13
          && head[head.count - 1] == 10
        {
          parseHead()
        }
      }
    }
    guard index < bytes.count else { return }
    if !chunked {
      for position in index..<bytes.count { body(bytes[position], event) }
      return
    }
    while index < bytes.count {
      let byte = bytes[index]
      switch chunkState {
      case .size:
        if let digit = hexValue(byte) {
          chunkRemaining = chunkRemaining * 16 + digit
          sizeDigits += 1
        } else if byte == 10 {
          chunkState = chunkRemaining == 0 ? .done : .data
          sizeDigits = 0
        } else if byte != 13 {
          chunkState = .sizeExtension
        }
        index += 1
      case .sizeExtension:
        if byte == 10 { chunkState = chunkRemaining == 0 ? .done : .data }
        index += 1
      case .data:
        let take = min(chunkRemaining, bytes.count - index)
        for position in index..<(index + take) { body(bytes[position], event) }
        index += take
        chunkRemaining -= take
        if chunkRemaining == 0 { chunkState = .dataCR }
      case .dataCR, .dataLF:
        if byte == 10 { chunkState = .size }
        index += 1
      case .done:
        return
      }
    }
  }

  private func hexValue(_ byte: UInt8) -> Int? {
    switch byte {
    case 0x30...0x39: Int(byte - 0x30)
    case 0x41...0x46: Int(byte - 0x41 + 10)
    case 0x61...0x66: Int(byte - 0x61 + 10)
    default: nil
    }
  }

  private mutating func parseHead() {
    headDone = true
    let text = String(decoding: head, as: UTF8.self)
    let parts = text.split(separator: " ", maxSplits: 2)
    status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
    chunked = text.lowercased().contains("transfer-encoding: chunked")
    head = []
  }

  @inline(__always)
  private mutating func body(_ byte: UInt8, _ event: (Event) -> Void) {
    if byte == 10 || byte == 13 {
      endLine(event)
    } else if line.count < 65536 {
      line.append(byte)
    }
  }

  private static let idPrefix: [UInt8] = Array("id:".utf8)
  private static let dataPrefix: [UInt8] = Array("data:".utf8)
  private static let marker: [UInt8] = Array("bench ".utf8)

  private mutating func endLine(_ event: (Event) -> Void) {
    defer { line.removeAll(keepingCapacity: true) }
    if line.isEmpty {
      if let pendingID {
        lastEventID = pendingID
        self.pendingID = nil
      }
      return
    }
    if line.starts(with: Self.idPrefix) {
      var value = line[Self.idPrefix.count...]
      if value.first == 0x20 { value = value.dropFirst() }
      pendingID = Array(value)
      return
    }
    guard line.starts(with: Self.dataPrefix), let found = find(Self.marker, in: line) else { return }
    var position = found + Self.marker.count
    var sequence = 0
    while position < line.count, line[position] >= 0x30 && line[position] <= 0x39 {
      sequence = sequence * 10 + Int(line[position] - 0x30)
      position += 1
    }
    guard position < line.count, line[position] == 0x20 else { return }
    position += 1
    var micros: UInt64 = 0
    while position < line.count, line[position] >= 0x30 && line[position] <= 0x39 {
      micros = micros * 10 + UInt64(line[position] - 0x30)
      position += 1
    }
    event(Event(sequence: sequence, sentMicros: micros))
  }

  private func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
    guard haystack.count >= needle.count else { return nil }
    let first = needle[0]
    var index = 0
    let last = haystack.count - needle.count
    while index <= last {
      if haystack[index] == first {
        var match = true
        for offset in 1..<needle.count where haystack[index + offset] != needle[offset] {
          match = false
          break
        }
        if match { return index }
      }
      index += 1
    }
    return nil
  }
}
