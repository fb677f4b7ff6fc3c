import CLibevent
import Foundation

/// A bound, listening, non-blocking TCP socket, created by hand so that the backlog is ours to choose (evhttp's
/// own bind uses a small one, which drops connections when thousands of clients connect at once).
public struct ListeningSocket: Sendable {
  public let fd: Int32
  public let host: String
  public let port: Int

  /// The address as `host:port` (`[v6]:port` for IPv6).
  public var address: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

  public static func bind(host: String, port: Int, backlog: Int) throws(ServerError) -> ListeningSocket {
    var hints = addrinfo()
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV
    var results: UnsafeMutablePointer<addrinfo>?
    let status = getaddrinfo(host, String(port), &hints, &results)
    guard status == 0, let first = results else {
      throw ServerError.bind(address: "\(host):\(port)", reason: String(cString: gai_strerror(status)))
    }
    defer { freeaddrinfo(results) }
    let fd = socket(first.pointee.ai_family, first.pointee.ai_socktype | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw ServerError.bind(address: "\(host):\(port)", reason: String(cString: strerror(errno))) }
    var one: Int32 = 1
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    guard Glibc.bind(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0, listen(fd, Int32(backlog)) == 0 else {
      let reason = String(cString: strerror(errno))
      close(fd)
      throw ServerError.bind(address: "\(host):\(port)", reason: reason)
    }
    evutil_make_socket_nonblocking(fd)
    return ListeningSocket(fd: fd, host: host, port: boundPort(of: fd) ?? 0)
  }

  /// The port a bound socket `fd` holds (IPv4 or IPv6), or nil when it cannot be read.
  public static func boundPort(of fd: Int32) -> Int? {
    var storage = sockaddr_storage()
    var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
    let named = withUnsafeMutablePointer(to: &storage) { pointer in
      pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard named == 0 else { return nil }
    let family = storage.ss_family
    return withUnsafeMutablePointer(to: &storage) { pointer -> Int in
      if family == sa_family_t(AF_INET6) {
        return pointer.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) {
          Int(UInt16(bigEndian: $0.pointee.sin6_port))
        }
      }
      return pointer.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
        Int(UInt16(bigEndian: $0.pointee.sin_port))
      }
    }
  }
}

/// The downstream server could not start.
public enum ServerError: Error, CustomStringConvertible, Sendable {
  case bind(address: String, reason: String)
  case libevent(String)

  public var description: String {
    switch self {
    case .bind(let address, let reason): "cannot listen on \(address): \(reason)"
    case .libevent(let what): "libevent: \(what) failed"
    }
  }
}
