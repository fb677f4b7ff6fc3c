import PollcastCore
import Testing

@Suite struct EventLoopTests {
  /// `event_base_loop` clears a break asked before it began: a stop right after `start()` used to wait forever
  /// (found by a unit test that built a feed on a fresh loop and stopped it at once).
  @Test func aStopRightAfterStartReturns() throws {
    for _ in 0..<200 {
      let loop = try EventLoop()
      loop.start()
      loop.stop()
      #expect(!loop.isRunning)
    }
  }
}
