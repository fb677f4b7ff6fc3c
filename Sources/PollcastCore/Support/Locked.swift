import Foundation

/// A value behind a `pthread_mutex_t`.
///
/// Used instead of `Synchronization.Mutex` for state shared between the loop thread and others: `Mutex` locks with
/// futexes inside the toolchain's (uninstrumented) library, so ThreadSanitizer cannot see its ordering and reports
/// every access it protects as a race (seen in CI on the loop's job queue). ThreadSanitizer intercepts pthread
/// mutexes, so with this lock its reports mean what they say. The cost is the same uncontended lock.
public final class Locked<Value>: @unchecked Sendable {
  private let mutex: UnsafeMutablePointer<pthread_mutex_t>
  private var value: Value

  public init(_ value: Value) {
    self.value = value
    mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    mutex.initialize(to: pthread_mutex_t())
    let status = pthread_mutex_init(mutex, nil)
    precondition(status == 0, "pthread_mutex_init failed: \(status)")
  }

  deinit {
    pthread_mutex_destroy(mutex)
    mutex.deinitialize(count: 1)
    mutex.deallocate()
  }

  @discardableResult
  public func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return try body(&value)
  }
}
