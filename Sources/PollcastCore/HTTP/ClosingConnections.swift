import CLibevent
import Foundation

/// Connections that must close after the answer in flight, although evhttp would keep them (it keeps every
/// connection that carried a CONNECT). A mark lasts exactly as long as its connection: evhttp's close callback,
/// called once when the connection is freed, removes it, so a later connection at the same address is never
/// taken for a marked one. Loop-confined in use; the set is behind a lock only because it is global.
enum ClosingConnections {
  private static let marked = Locked<Set<UInt>>([])

  static func mark(_ connection: OpaquePointer) {
    let key = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
    let inserted = marked.withLock { $0.insert(key).inserted }
    // Only connections that are not streams get here (a stream's close callback is its SSEConnection's).
    if inserted { evhttp_connection_set_closecb(connection, closingConnectionClosed, nil) }
  }

  static func isMarked(_ connection: OpaquePointer) -> Bool {
    let key = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
    return marked.withLock { $0.contains(key) }
  }

  static func forget(_ connection: OpaquePointer) {
    let key = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection)))
    _ = marked.withLock { $0.remove(key) }
  }
}

private let closingConnectionClosed: @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void = {
  connection, _ in
  guard let connection else { return }
  ClosingConnections.forget(connection)
}
