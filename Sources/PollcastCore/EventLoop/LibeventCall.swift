import CLibevent
import Foundation

/// The one place libevent return codes are checked. libevent reports failure as `-1` or `NULL` and leaves the
/// reason in `errno`; `check` turns that into an `EventLoopError` naming the call, so no caller can ignore one.
///
/// `invariant` is for the few calls that fail only when the program itself is wrong (adding a timer that was
/// created on this base, deleting one): there a failure is a broken invariant, not bad input or a busy system.
public enum LibeventCall {
  /// Throws when `result` is negative (libevent's `-1`).
  public static func check(_ result: Int32, _ operation: @autoclosure () -> String) throws(EventLoopError) {
    if result < 0 { throw EventLoopError(operation: operation()) }
  }

  /// Returns `pointer`, or throws when libevent gave `NULL`.
  public static func check<T>(_ pointer: T?, _ operation: @autoclosure () -> String) throws(EventLoopError) -> T {
    guard let pointer else { throw EventLoopError(operation: operation()) }
    return pointer
  }

  /// Stops the process when a call that cannot fail in a correct program failed.
  public static func invariant(_ result: Int32, _ operation: @autoclosure () -> String) {
    if result < 0 {
      let error = EventLoopError(operation: operation())
      preconditionFailure("\(error)")
    }
  }
}

extension EventLoop {
  /// A cheap check (debug builds) that the caller runs on this loop's thread, for types that are safe only
  /// there. Before the loop starts (assembly), any thread may set things up.
  @inline(__always)
  public func assertOnLoop(file: StaticString = #fileID, line: UInt = #line) {
    assert(inLoopThread || !isRunning, "loop-bound state touched off the pollcast loop thread", file: file, line: line)
  }
}
