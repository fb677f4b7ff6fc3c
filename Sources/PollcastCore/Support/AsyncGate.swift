/// A FIFO lock for async code on one actor: `acquire` suspends while another holder has it.
final class AsyncGate {
  private var held = false
  private var waiters: [CheckedContinuation<Void, Never>] = []

  func acquire(isolation: isolated (any Actor)? = #isolation) async {
    guard held else {
      held = true
      return
    }
    await withCheckedContinuation { waiters.append($0) }
  }

  /// Takes the gate when it is open, without waiting; false when it is held.
  func tryAcquire() -> Bool {
    if held { return false }
    held = true
    return true
  }

  /// Hands the gate to the first waiter, or opens it.
  func release() {
    if waiters.isEmpty {
      held = false
    } else {
      waiters.removeFirst().resume()
    }
  }
}
