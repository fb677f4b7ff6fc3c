import Foundation

/// An immutable block of encoded SSE bytes, shared by the replay ring and every subscriber's output buffer.
///
/// Subscribers receive the bytes as libevent *references* (`evbuffer_add_reference`), each of which holds one
/// retain on the block, so a batch is encoded and stored once however many clients it reaches.
public final class SharedBytes: @unchecked Sendable {
  public let base: UnsafeMutableRawPointer
  public let count: Int

  public init(_ bytes: [UInt8]) {
    count = bytes.count
    base = UnsafeMutableRawPointer.allocate(byteCount: max(1, bytes.count), alignment: 16)
    bytes.withUnsafeBytes { source in
      if let source = source.baseAddress { base.copyMemory(from: source, byteCount: bytes.count) }
    }
  }

  deinit { base.deallocate() }
}

/// A contiguous part of a `SharedBytes` block.
public struct ByteSlice: Sendable {
  public let block: SharedBytes
  public let offset: Int
  public let count: Int

  public init(block: SharedBytes, offset: Int, count: Int) {
    self.block = block
    self.offset = offset
    self.count = count
  }

  public init(_ bytes: [UInt8]) {
    self.init(block: SharedBytes(bytes), offset: 0, count: bytes.count)
  }

  /// A copy of the bytes.
  public var bytes: [UInt8] { Array(UnsafeRawBufferPointer(start: block.base + offset, count: count)) }

  /// Whether `next` continues this slice in the same block, so both can go out as one reference.
  func isFollowed(by next: ByteSlice) -> Bool {
    next.block === block && next.offset == offset + count
  }
}

/// Bytes every live subscriber receives alike (a batch of events, a heartbeat, a status event), encoded once
/// with the HTTP/1.1 chunk framing around them, so a chunked reply takes `framed` and an HTTP/1.0 reply takes
/// `payload` — both one reference into the same block, no per-subscriber framing or copying.
public struct BroadcastBytes: Sendable {
  /// `<hex length>\r\n<payload>\r\n`.
  public let framed: ByteSlice
  public let payload: ByteSlice

  /// Frames `payload` bytes; `build` appends the payload to the array it is given.
  public init(building build: (inout [UInt8]) -> Void) {
    var bytes: [UInt8] = Array(repeating: 0x30, count: BroadcastBytes.headerWidth + 2)
    let start = bytes.count
    build(&bytes)
    let length = bytes.count - start
    bytes.append(contentsOf: [13, 10])
    // The header is right-aligned in its fixed-width slot: "  1f4\r\n" is not valid, so skip the leading part.
    // Written digit by digit (lowercase hex): `String(_:radix:)` and a replaced subrange cost two allocations and a
    // generic conversion for every batch.
    var headerStart = start - 2
    var rest = length
    repeat {
      headerStart -= 1
      let digit = UInt8(truncatingIfNeeded: rest & 0xF)
      bytes[headerStart] = digit < 10 ? 0x30 + digit : 0x57 + digit
      rest >>= 4
    } while rest > 0
    bytes[start - 2] = 13
    bytes[start - 1] = 10
    let block = SharedBytes(bytes)
    framed = ByteSlice(block: block, offset: headerStart, count: bytes.count - headerStart)
    payload = ByteSlice(block: block, offset: start, count: length)
  }

  public init(_ payload: [UInt8]) {
    self.init { $0.append(contentsOf: payload) }
  }

  /// Room for the hex length of any payload up to 2⁶⁴ bytes.
  static let headerWidth = 16
}
