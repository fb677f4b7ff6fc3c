import CHiredis
import Foundation

/// hiredis's blocking API, for the load at start (before the loop serves anyone).
final class RedisSyncClient {
  private let context: UnsafeMutablePointer<redisContext>
  let address: RedisAddress

  init(address: RedisAddress, timeout: Double) throws(StoreError) {
    self.address = address
    let limit = timeval(tv_sec: Int(timeout), tv_usec: Int((timeout - timeout.rounded(.down)) * 1_000_000))
    // The name is looked up with a bound too (hiredis's own lookup has none): a lookup that never answers fails
    // the start with exit 74 after `timeout` instead of hanging it.
    var host = address.host
    if address.socketPath == nil {
      switch RedisSyncClient.resolve(address.host, port: address.port, timeout: timeout) {
      case .success(let numeric): host = numeric
      case .failure(let problem): throw address.unavailable(problem.description)
      }
    }
    let made =
      address.socketPath.map { redisConnectUnixWithTimeout($0, limit) }
      ?? redisConnectWithTimeout(host, Int32(address.port), limit)
    guard let made else { throw address.unavailable("cannot allocate a context") }
    if made.pointee.err != 0 {
      let message = withUnsafeBytes(of: made.pointee.errstr) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
      redisFree(made)
      throw address.unavailable("cannot connect: \(message)")
    }
    redisSetTimeout(made, limit)
    context = made
    for command in address.handshake {
      let reply = try run(command)
      if case .error(let message) = reply {
        redisFree(made)
        throw address.unavailable("\(command[0]) refused: \(message)")
      }
    }
  }

  /// `host` as a numeric address, looked up on another thread and waited for at most `timeout` seconds.
  static func resolve(_ host: String, port: Int, timeout: Double) -> Result<String, ConfigurationProblem> {
    if AddressBlock.parse(host) != nil { return .success(host) }
    let answer = Locked<Result<String, ConfigurationProblem>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Thread.detachNewThread {
      let resolved = RedisConnection.resolve(host, port: port)
      answer.withLock { $0 = resolved }
      done.signal()
    }
    guard done.wait(timeout: .now() + timeout) == .success, let resolved = answer.withLock({ $0 }) else {
      return .failure(ConfigurationProblem("cannot resolve \(host) within \(timeout) s"))
    }
    return resolved
  }

  func run(_ command: [String]) throws(StoreError) -> RedisReply {
    let joined = Array(command.joined().utf8)
    let lengths = command.map { $0.utf8.count }
    let raw = joined.withUnsafeBufferPointer { buffer -> UnsafeMutableRawPointer? in
      let base = UnsafeRawPointer(buffer.baseAddress ?? UnsafePointer(bitPattern: 1)!)
      var offset = 0
      var pointers: [UnsafePointer<CChar>?] = lengths.map { length in
        defer { offset += length }
        return (base + offset).assumingMemoryBound(to: CChar.self)
      }
      return pointers.withUnsafeMutableBufferPointer { argv in
        lengths.withUnsafeBufferPointer {
          redisCommandArgv(context, Int32(command.count), argv.baseAddress, $0.baseAddress)
        }
      }
    }
    guard let raw else {
      let message = withUnsafeBytes(of: context.pointee.errstr) {
        String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
      }
      throw address.unavailable("\(command[0]): \(message)")
    }
    defer { freeReplyObject(raw) }
    return RedisReply(raw.assumingMemoryBound(to: redisReply.self))
  }

  func close() { redisFree(context) }
}
