import Foundation

/// Upstream transports (libcurl multi handles) shared by many upstream loops (per-user relaying's accounts), each
/// by up to about `loopsPerTransport` of them: one multi handle for thousands of long-polls to the same host
/// spends its time scanning its connection pool on every request (perf: a quarter of the relay's CPU at 2,000
/// accounts). Made on first use and filled in order, `loopsPerTransport` loops each, before the next is made: a
/// multi handle costs about 35 KB before its first transfer (its socket hash and connection cache's closure handle,
/// heaptrack), and handing them out in turn made all of them for a pool sized for 10,000 accounts (312 multi
/// handles, 5.4 KB per account at 2,000 accounts) where 63 do. Loop-confined.
final class TransportPool: @unchecked Sendable {  // loop-confined
  static let loopsPerTransport = 32
  /// libcurl's receive buffer for these transports' handles (see `CurlTransport.receiveBufferBytes`): its smallest,
  /// 1 KiB. Every active account keeps a poll (a handle and its buffer, 4,097 bytes at 4 KiB: the largest live
  /// libcurl allocation per account under heaptrack) in flight, and most answers are one or a few messages; a
  /// backlog page takes more reads of 1 KiB, once.
  static let receiveBufferBytes = 1024

  private let loop: EventLoop
  private let maxBodyBytes: Int
  private let logger: Logger
  private var transports: [CurlTransport?]
  /// Loops handed a transport so far; loop n gets transport (n / loopsPerTransport) mod count.
  private var handedOut = 0
  private var logLimiter = LogLimiter()
  /// Where the pool's transfers reached the API's host names: one account's answer serves every account's kept
  /// connection (each transport learning alone sent nearly every account's first request through libcurl, and left
  /// each transport's idle handles behind).
  private let addresses = AddressBook()

  /// Sized for `loops` loops (1 to 512 transports). The first transport is made now, so a libcurl that cannot
  /// start fails the relay's start, not a subscriber's check.
  init(loop: EventLoop, loops: Int, maxBodyBytes: Int, logger: Logger) throws(UpstreamError) {
    loop.assertOnLoop()
    self.loop = loop
    self.maxBodyBytes = maxBodyBytes
    self.logger = logger
    transports = Array(repeating: nil, count: max(1, min(512, loops / TransportPool.loopsPerTransport)))
    transports[0] = try Self.make(loop: loop, maxBodyBytes: maxBodyBytes, addresses: addresses)
  }

  private static func make(loop: EventLoop, maxBodyBytes: Int, addresses: AddressBook) throws(UpstreamError)
    -> CurlTransport
  {
    let transport = try CurlTransport(loop: loop)
    transport.addresses = addresses
    transport.maxBodyBytes = maxBodyBytes
    // Every active account holds a handle in flight; its answers are one account's, small: 1 KiB, not 16.
    transport.receiveBufferBytes = TransportPool.receiveBufferBytes
    return transport
  }

  var count: Int { transports.count }

  /// Requests the loops sent, over kept-alive connections and through libcurl (see `CurlTransport`).
  var requests: (keptAlive: Int, libcurl: Int) {
    transports.reduce((0, 0)) { sum, transport in
      (sum.0 + (transport?.requestsKeptAlive ?? 0), sum.1 + (transport?.requestsThroughLibcurl ?? 0))
    }
  }

  /// The transport being filled (made on first use; the first one when another cannot be made).
  func transport() -> CurlTransport {
    let index = (handedOut / TransportPool.loopsPerTransport) % transports.count
    handedOut = (handedOut + 1) % (TransportPool.loopsPerTransport * transports.count)
    if let transport = transports[index] { return transport }
    do {
      let made = try Self.make(loop: loop, maxBodyBytes: maxBodyBytes, addresses: addresses)
      transports[index] = made
      return made
    } catch {
      logger.limited(
        .warning, "cannot make another upstream transport: sharing the first", metadata: ["error": error.description],
        limiter: &logLimiter)
      return transports[0]!
    }
  }
}
