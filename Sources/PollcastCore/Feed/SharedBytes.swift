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

  /// The bytes in `range`, copied out (tests and diagnostics only; the hot path never copies).
  public func bytes(_ range: Range<Int>) -> [UInt8] {
    precondition(range.lowerBound >= 0 && range.upperBound <= count)
    return [UInt8](UnsafeRawBufferPointer(start: base + range.lowerBound, count: range.count))
  }
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

  public var bytes: [UInt8] { block.bytes(offset..<(offset + count)) }

  /// Whether `next` continues this slice in the same block, so both can go out as one reference.
  func isFollowed(by next: ByteSlice) -> Bool {
    next.block === block && next.offset == offset + count
  }
}
