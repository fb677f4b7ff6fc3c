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

  /// `nextTurn` returns only after the loop made a pass: a timer already due fires first (a `Task.yield` on the
  /// loop would run again in the same drain, before any socket or timer).
  @Test func nextTurnLetsDueWorkRunFirst() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let turns = TurnProbe(loop: loop)
    #expect(await turns.run() == ["timer", "after the turn"])
  }
}

private actor TurnProbe {
  let loop: EventLoop
  var order: [String] = []
  var timer: LoopTimer?
  init(loop: EventLoop) { self.loop = loop }
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  func run() async -> [String] {
    let timer = LoopTimer(loop: loop) { [weak self] in self?.assumeIsolated { $0.order.append("timer") } }
    timer.schedule(after: 0)
    self.timer = timer
    await loop.nextTurn()
    order.append("after the turn")
    return order
  }
}
