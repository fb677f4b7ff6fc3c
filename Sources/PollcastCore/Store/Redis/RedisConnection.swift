import CHiredis
import CLibevent
import Foundation

/// One Redis reply, copied out of hiredis's reply object (which hiredis frees when the callback returns).
public enum RedisReply: Sendable, Equatable {
  case string([UInt8])
  case status(String)
  case integer(Int64)
  case array([RedisReply])
  case null
  case error(String)

  init(_ reply: UnsafePointer<redisReply>) {
    let value = reply.pointee
    switch value.type {
    case REDIS_REPLY_STRING:
      self = .string(value.str.map { Array(UnsafeRawBufferPointer(start: $0, count: Int(value.len))) } ?? [])
    case REDIS_REPLY_STATUS:
      self = .status(value.str.map { String(cString: $0) } ?? "")
    case REDIS_REPLY_ERROR:
      self = .error(value.str.map { String(cString: $0) } ?? "error")
    case REDIS_REPLY_INTEGER:
      self = .integer(value.integer)
    case REDIS_REPLY_ARRAY:
      var elements: [RedisReply] = []
      elements.reserveCapacity(Int(value.elements))
      for index in 0..<Int(value.elements) {
        if let element = value.element[index] { elements.append(RedisReply(element)) } else { elements.append(.null) }
      }
      self = .array(elements)
    default:
      self = .null
    }
  }

  /// A bulk or status string as text.
  public var text: String? {
    switch self {
    case .string(let bytes): String(decoding: bytes, as: UTF8.self)
    case .status(let text): text
    case .integer(let value): String(value)
    default: nil
    }
  }

  public var elements: [RedisReply]? {
    if case .array(let elements) = self { return elements }
    return nil
  }
}

/// Where Redis is: `redis://[:password@]host[:port][/db]` or `unix:///path/to/redis.sock` (`?db=N`).
public struct RedisAddress: Sendable, Equatable, CustomStringConvertible {
  public var host = "127.0.0.1"
  public var port = 6379
  public var socketPath: String?
  public var password: String?
  public var database = 0

  public init() {}

  public static func parse(_ text: String) -> Result<RedisAddress, ConfigurationProblem> {
    var address = RedisAddress()
    let shown = redactURL(text)  // errors name the URL without its password
    if text.hasPrefix("unix://") {
      var path = String(text.dropFirst("unix://".count))
      if let query = path.firstIndex(of: "?") {
        let parameters = path[path.index(after: query)...]
        path = String(path[..<query])
        for pair in parameters.split(separator: "&") where pair.hasPrefix("db=") {
          guard let database = Int(pair.dropFirst(3)), database >= 0 else {
            return .failure(ConfigurationProblem("\"\(shown)\": db is not a number"))
          }
          address.database = database
        }
      }
      guard path.hasPrefix("/") else {
        return .failure(ConfigurationProblem("\"\(shown)\": a unix socket URL needs an absolute path (unix:///…)"))
      }
      address.socketPath = path
      return .success(address)
    }
    guard text.hasPrefix("redis://") else {
      return .failure(ConfigurationProblem("\"\(shown)\" is not a redis://host:port or unix:///path URL"))
    }
    var rest = Substring(text.dropFirst("redis://".count))
    if let at = rest.lastIndex(of: "@") {
      let credentials = rest[..<at]
      rest = rest[rest.index(after: at)...]
      // redis://:password@host or redis://user:password@host (Redis 6 ACL users are not supported: AUTH password).
      let password = credentials.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false).last ?? ""
      address.password = password.removingPercentEncoding ?? String(password)
    }
    if let slash = rest.firstIndex(of: "/") {
      let database = rest[rest.index(after: slash)...]
      rest = rest[..<slash]
      if !database.isEmpty {
        guard let number = Int(database), number >= 0 else {
          return .failure(ConfigurationProblem("\"\(shown)\": the database \"\(database)\" is not a number"))
        }
        address.database = number
      }
    }
    var host = rest
    if rest.hasPrefix("[") {
      guard let close = rest.firstIndex(of: "]") else {
        return .failure(ConfigurationProblem("\"\(shown)\": unclosed [ in the host"))
      }
      host = rest[rest.index(after: rest.startIndex)..<close]
      rest = rest[rest.index(after: close)...]
      if let colon = rest.firstIndex(of: ":") {
        guard let port = Int(rest[rest.index(after: colon)...]), (1...65535).contains(port) else {
          return .failure(ConfigurationProblem("\"\(shown)\": the port is not 1-65535"))
        }
        address.port = port
      }
    } else if let colon = rest.lastIndex(of: ":") {
      host = rest[..<colon]
      guard let port = Int(rest[rest.index(after: colon)...]), (1...65535).contains(port) else {
        return .failure(ConfigurationProblem("\"\(shown)\": the port is not 1-65535"))
      }
      address.port = port
    }
    guard !host.isEmpty else { return .failure(ConfigurationProblem("\"\(shown)\" names no host")) }
    address.host = String(host)
    return .success(address)
  }

  public var description: String {
    let location = socketPath.map { "unix://\($0)" } ?? "redis://\(host.contains(":") ? "[\(host)]" : host):\(port)"
    return database == 0 ? location : "\(location)/\(database)"
  }

  /// The commands a new connection sends first (`AUTH`, `SELECT`), before anything else it is given.
  var handshake: [[String]] {
    var commands: [[String]] = []
    if let password { commands.append(["AUTH", password]) }
    if database != 0 { commands.append(["SELECT", String(database)]) }
    return commands
  }
}

/// A configuration value that cannot be used, with the reason.
public struct ConfigurationProblem: Error, Sendable, CustomStringConvertible {
  public var description: String
  public init(_ description: String) { self.description = description }
}

/// One asynchronous hiredis connection driven by the relay's event loop (hiredis's libevent adapter).
///
/// Confined to the loop: every method runs on the loop thread, and so do hiredis's callbacks. Lifetime: while a
/// hiredis context exists, it holds one retain on this object (its `data`), released by the callback that ends
/// the context (a failed connect or the disconnect), so the object outlives every callback hiredis makes. Each
/// command's reply handler is retained the same way and released by its (exactly once) callback; a context
/// that ends calls the pending ones with no reply.
final class RedisConnection: @unchecked Sendable {
  let loop: EventLoop
  let address: RedisAddress
  let name: String
  private var context: UnsafeMutablePointer<redisAsyncContext>?
  /// True once Redis answered on this connection (a `PING` sent right after connecting), until the context ends.
  /// A TCP connect alone proves nothing: a stopped (SIGSTOPped) Redis still has the kernel accept connections, and
  /// counting those as up made `/readyz` say ready for most of the hang.
  private(set) var isConnected = false
  /// True from the connect callback's success until the context ends (hiredis's own notion).
  private var linked = false
  /// When each command without a reply yet was sent (replies come back in order): the watchdog's clock.
  private var sentTimes: [Double] = []
  private var sentHead = 0
  /// Called on the loop when a connection attempt succeeds, and when the connection is lost or fails (with why).
  var onConnected: (() -> Void)?
  var onDown: ((String) -> Void)?

  /// Seconds a name lookup or a TCP connect may take before the attempt is given up.
  let connectTimeout: Double

  init(loop: EventLoop, address: RedisAddress, name: String, connectTimeout: Double = 5) {
    self.loop = loop
    self.address = address
    self.name = name
    self.connectTimeout = connectTimeout
  }

  /// Whether a context exists (connecting or connected), or the host's name is being looked up.
  var isOpen: Bool { context != nil || lookup != nil }
  /// When the current context started connecting (the watchdog gives up on one that takes too long).
  private(set) var connectStarted = 0.0
  /// The name lookup under way (its number, so a late answer of an abandoned one is ignored), and its deadline.
  private var lookup: (number: Int, timer: LoopTimer)?
  private var lookups = 0
  /// A lookup thread still blocked in `getaddrinfo` (one that timed out may go on for as long as the resolver's own
  /// timeout): no second one starts meanwhile, so a name that never answers costs one thread, not one per retry.
  private var lookupThreadBusy = false

  /// Starts connecting; `onConnected` or `onDown` follows. Returns the error when it fails at once.
  ///
  /// A host name is looked up on another thread, never on the loop: `getaddrinfo` blocks, and with Redis stopped
  /// in a container network a lookup took 20 s to fail, which held `/healthz` and the shutdown. The lookup has
  /// `connectTimeout` to answer; then the attempt fails and is retried with backoff.
  @discardableResult
  func connect() -> String? {
    loop.checkIsolated()
    guard context == nil, lookup == nil else { return nil }
    if address.socketPath != nil || AddressBlock.parse(address.host) != nil { return open(host: address.host) }
    guard !lookupThreadBusy else { return "the last lookup of \(address.host) has not answered yet" }
    lookupThreadBusy = true
    lookups += 1
    let number = lookups
    let host = address.host
    let port = address.port
    let timer = LoopTimer(loop: loop) { [weak self] in
      guard let self, self.lookup?.number == number else { return }
      self.lookup = nil
      self.onDown?("cannot resolve \(host) within \(self.connectTimeout) s")
    }
    timer.schedule(after: connectTimeout)
    lookup = (number, timer)
    // A thread of its own, not a shared pool's: a lookup that blocks for the resolver's whole timeout must not hold
    // a worker that other work (or the shutdown) waits for.
    let loop = loop
    Thread.detachNewThread { [weak self] in
      let resolved = RedisConnection.resolve(host, port: port)
      loop.execute { [weak self] in
        guard let self else { return }
        self.lookupThreadBusy = false
        guard self.lookup?.number == number else { return }
        self.lookup = nil
        switch resolved {
        case .success(let numeric):
          if let error = self.open(host: numeric) { self.onDown?(error) }
        case .failure(let error):
          self.onDown?("\(error)")
        }
      }
    }
    return nil
  }

  /// The first address of `host` (numeric text), looked up with `getaddrinfo` on the calling thread.
  static func resolve(_ host: String, port: Int) -> Result<String, ConfigurationProblem> {
    var hints = addrinfo()
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
    var results: UnsafeMutablePointer<addrinfo>?
    let status = getaddrinfo(host, String(port), &hints, &results)
    guard status == 0, let first = results else {
      return .failure(ConfigurationProblem("cannot resolve \(host): \(String(cString: gai_strerror(status)))"))
    }
    defer { freeaddrinfo(results) }
    var text = [CChar](repeating: 0, count: Int(NI_MAXHOST))
    guard
      getnameinfo(first.pointee.ai_addr, first.pointee.ai_addrlen, &text, socklen_t(text.count), nil, 0, NI_NUMERICHOST)
        == 0
    else { return .failure(ConfigurationProblem("cannot resolve \(host): no numeric address")) }
    return .success(String(cString: text))
  }

  private func open(host: String) -> String? {
    connectStarted = MonotonicClock.seconds()
    let created =
      address.socketPath.map { redisAsyncConnectUnix($0) } ?? redisAsyncConnect(host, Int32(address.port))
    guard let created else { return "cannot allocate a hiredis context" }
    if pollcast_redis_error(created) != 0 {
      let message = String(cString: pollcast_redis_error_text(created))
      redisAsyncFree(created)
      return message
    }
    guard pollcast_redis_attach(created, loop.base) == REDIS_OK else {
      redisAsyncFree(created)
      return "cannot attach the hiredis context to the event loop"
    }
    pollcast_redis_set_data(created, Unmanaged.passRetained(self).toOpaque())
    redisAsyncSetConnectCallback(created, redisConnected)
    redisAsyncSetDisconnectCallback(created, redisDisconnected)
    context = created
    for command in address.handshake {
      send(command.map { Array($0.utf8) }) { [weak self] reply in
        guard let self, case .error(let message)? = reply else { return }
        // A wrong password or database: the connection is useless; say why and drop it.
        self.disconnect(reason: "\(command[0]) refused: \(message)")
      }
    }
    return nil
  }

  private var downReason: String?

  /// Ends the connection: pending commands get no reply, then `onDown` runs.
  func disconnect(reason: String) {
    loop.checkIsolated()
    guard let context else { return }
    downReason = downReason ?? reason
    redisAsyncDisconnect(context)
  }

  /// Ends the connection now, without waiting for anything from Redis: a hung Redis (SIGSTOPped, a dead host)
  /// never answers, and `redisAsyncDisconnect` waits for the replies still due, so the connection (and `/readyz`)
  /// stayed up for the whole hang. Pending commands get no reply, then `onDown` runs.
  func drop(reason: String) {
    loop.checkIsolated()
    guard let context else { return }
    downReason = downReason ?? reason
    if linked {
      // hiredis calls the disconnect callback (now, or once the callback running returns), which ends it.
      redisAsyncFree(context)
    } else {
      // Still connecting: hiredis frees it without calling either callback, so this ends it and gives back the
      // retain the context held (taken in `open`).
      pollcast_redis_set_data(context, nil)
      redisAsyncFree(context)
      withExtendedLifetime(self) {
        Unmanaged.passUnretained(self).release()
        ended(reason: reason)
      }
    }
  }

  fileprivate func connected(status: Int32, error: String) {
    if status == REDIS_OK {
      linked = true
      // Up once Redis answers (after the handshake's commands, which were queued first).
      send([Array("PING".utf8)]) { [weak self] reply in
        guard let self, let reply, self.linked, !self.isConnected else { return }
        if case .error(let message) = reply {
          self.drop(reason: "PING refused: \(message)")
          return
        }
        self.isConnected = true
        self.onConnected?()
      }
    } else {
      // hiredis frees the context after this callback, without a disconnect callback.
      ended(reason: error)
    }
  }

  fileprivate func ended(reason: String) {
    context = nil
    isConnected = false
    linked = false
    sentTimes.removeAll()
    sentHead = 0
    let why = downReason ?? reason
    downReason = nil
    onDown?(why)
  }

  /// Sends one command (its arguments as bytes: binary-safe). `reply` runs on the loop with the reply, or nil when
  /// the connection ends before the reply; when there is no connection, or it is closing, `reply(nil)` runs at once
  /// (before `send` returns).
  func send(_ arguments: [[UInt8]], reply: @escaping (RedisReply?) -> Void) {
    loop.checkIsolated()
    guard let context else {
      reply(nil)
      return
    }
    let handler = Unmanaged.passRetained(ReplyHandler(reply)).toOpaque()
    var joined: [UInt8] = []
    joined.reserveCapacity(arguments.reduce(0) { $0 + $1.count })
    for argument in arguments { joined.append(contentsOf: argument) }
    // A closure, not `\.count`: a key path to a computed property is built at run time on every command.
    let lengths = arguments.map { $0.count }
    let status = joined.withUnsafeBufferPointer { buffer -> Int32 in
      let base = UnsafeRawPointer(buffer.baseAddress ?? UnsafePointer(bitPattern: 1)!)
      var offset = 0
      var pointers: [UnsafePointer<CChar>?] = []
      pointers.reserveCapacity(arguments.count)
      for length in lengths {
        pointers.append((base + offset).assumingMemoryBound(to: CChar.self))
        offset += length
      }
      return pointers.withUnsafeMutableBufferPointer { argv in
        lengths.withUnsafeBufferPointer { argvlen in
          // hiredis formats the command into its output buffer before returning: the arguments may go.
          redisAsyncCommandArgv(
            context, redisReplied, handler, Int32(arguments.count), argv.baseAddress, argvlen.baseAddress)
        }
      }
    }
    guard status == REDIS_OK else {
      // Refused (the context is disconnecting): no callback will come.
      Unmanaged<ReplyHandler>.fromOpaque(handler).release()
      reply(nil)
      return
    }
    sentTimes.append(MonotonicClock.seconds())
  }

  fileprivate func replied() {
    guard sentHead < sentTimes.count else { return }
    sentHead += 1
    if sentHead > 1024 && sentHead * 2 > sentTimes.count {
      sentTimes.removeFirst(sentHead)
      sentHead = 0
    }
  }

  /// Seconds the oldest command still waiting for its reply has waited (0 when none waits).
  var oldestWait: Double {
    sentHead < sentTimes.count ? MonotonicClock.seconds() - sentTimes[sentHead] : 0
  }
}

/// A command's reply handler, retained while hiredis holds it.
private final class ReplyHandler {
  let body: (RedisReply?) -> Void
  init(_ body: @escaping (RedisReply?) -> Void) { self.body = body }
}

private func redisReplied(
  _ context: UnsafeMutablePointer<redisAsyncContext>?, _ reply: UnsafeMutableRawPointer?,
  _ privdata: UnsafeMutableRawPointer?
) {
  guard let privdata else { return }
  let handler = Unmanaged<ReplyHandler>.fromOpaque(privdata).takeRetainedValue()
  if let context, let data = pollcast_redis_data(context) {
    Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue().replied()
  }
  handler.body(reply.map { RedisReply($0.assumingMemoryBound(to: redisReply.self)) })
}

private func redisConnected(_ context: UnsafePointer<redisAsyncContext>?, _ status: Int32) {
  guard let context, let data = pollcast_redis_data(context) else { return }
  let error =
    pollcast_redis_error(context) != 0 ? String(cString: pollcast_redis_error_text(context)) : "connect failed"
  if status == REDIS_OK {
    Unmanaged<RedisConnection>.fromOpaque(data).takeUnretainedValue().connected(status: status, error: error)
  } else {
    // hiredis frees the context after this callback, calling the pending commands' callbacks (which reach the
    // connection through `data`): the context's retain is released only in a later turn of the loop.
    let connection = Unmanaged<RedisConnection>.fromOpaque(data).takeRetainedValue()
    connection.connected(status: status, error: error)
    connection.loop.execute { withExtendedLifetime(connection) {} }
  }
}

private func redisDisconnected(_ context: UnsafePointer<redisAsyncContext>?, _ status: Int32) {
  guard let context, let data = pollcast_redis_data(context) else { return }
  let error =
    pollcast_redis_error(context) != 0 ? String(cString: pollcast_redis_error_text(context)) : "connection closed"
  Unmanaged<RedisConnection>.fromOpaque(data).takeRetainedValue().ended(reason: error)
}
