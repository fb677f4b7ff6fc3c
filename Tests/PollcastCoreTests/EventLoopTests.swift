import Foundation
import Testing

@testable import PollcastCore

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

  /// The loop thread carries its name in the kernel (`top -H`, `perf`, `/proc/PID/task/*/comm`).
  @Test func theLoopThreadIsNamedForTheKernel() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let name = await loop.submit { try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8) }
    #expect(name == "pollcast-loop\n")
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

  /// A pass of Swift jobs that holds the loop is measured (`pollcast_event_loop_job_pass_max_seconds`): what tells a
  /// loop held by Swift work from one held in a C callback.
  @Test func aLongJobPassIsMeasured() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    #expect(await loop.submit { loop.slowJobPasses } == 0)
    await loop.submit { usleep(30_000) }
    // Read in a later pass: the pass that ran the sleep records itself as it ends.
    var (longest, slow) = (0.0, 0)
    let deadline = MonotonicClock.seconds() + 5
    while slow == 0 && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(10))
      (longest, slow) = await loop.submit { (loop.longestJobPass, loop.slowJobPasses) }
    }
    #expect(longest >= 0.030 && longest < 5)
    #expect(slow == 1)
  }

  /// A stall longer than the lag probe's interval is always counted in its lateness histogram
  /// (`pollcast_event_loop_lateness_seconds`), late by at least the stall less one interval, whatever work held the
  /// loop; and the ticks after it are measured from when they were armed, not from when the late one was due.
  @Test func aStallLongerThanTheProbeIntervalIsCounted() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let probe = await loop.submit { LoopLagProbe(loop: loop, interval: 0.005) }
    defer { loop.execute { probe.stop() } }
    try await Task.sleep(for: .milliseconds(50))
    let before = await loop.submit { probe.lateness }
    await loop.submit { usleep(80_000) }
    var after = before
    let deadline = MonotonicClock.seconds() + 5
    while after.count < before.count + 5 && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(10))
      after = await loop.submit { probe.lateness }
    }
    let bound = try #require(after.bounds.firstIndex(of: 0.05))
    // Ticks later than 50 ms: at least the one the 80-ms stall held (late by 75 ms or more).
    #expect((after.count - after.counts[bound]) - (before.count - before.counts[bound]) >= 1)
    #expect(after.count >= before.count + 5, "the probe kept ticking after the stall")
    #expect(await loop.submit { probe.maxLag } >= 0.075)
  }

  /// A pass over the job queue stops after `jobPassBudget` and leaves the jobs not yet run to the next turn: a timer
  /// already due fires between them, not after all of them. The jobs still run in the order they were queued, and
  /// end-of-pass work asked in the cut pass runs when it is cut.
  @Test func aLongPassIsCutSoTheLoopPollsBetweenItsJobs() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let recorder = PassEndRecorder()
    let log = try await logWithADueTimer(loop, recorder, until: 66) {
      #expect(loop.atPassEnd(recorder))
      // 1 ms each: the budget (5 ms) is spent well before the 64th.
      for index in 0..<64 {
        loop.execute {
          usleep(1_000)
          recorder.log.append("job \(index)")
        }
      }
    }
    let jobs = log.filter { $0.hasPrefix("job") }
    #expect(jobs == (0..<64).map { "job \($0)" })
    #expect(await loop.submit { loop.cutJobPasses } >= 2, "cut at least twice: 64 ms of jobs with a 5-ms budget")
    let timerAt = try #require(log.firstIndex(of: "timer"))
    let passEndAt = try #require(log.firstIndex(of: "pass end"))
    #expect(passEndAt < timerAt, "the cut pass's end-of-pass work runs before the loop polls")
    #expect(timerAt > 5 && timerAt < log.count - 1, "the timer fired between the jobs: \(log)")
  }

  /// The budget counts a pass's jobs across its batches: a chain of jobs that each queue the next (a batch of one
  /// job each, what a wave of resumed cycles can look like) is cut too, and a due timer fires between its links.
  @Test func aChainOfJobsQueuingTheNextIsCutToo() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let recorder = PassEndRecorder()
    let log = try await logWithADueTimer(loop, recorder, until: 65) {
      JobChain(loop: loop, recorder: recorder, links: 64).link()
    }
    #expect(log.filter { $0.hasPrefix("job") } == (0..<64).map { "job \($0)" })
    let timerAt = try #require(log.firstIndex(of: "timer"))
    #expect(timerAt > 5 && timerAt < log.count - 1, "the timer fired between the links: \(log)")
  }

  /// Arms a timer due at once and runs `queue` in the same job on the loop; returns the recorder's log once it holds
  /// `count` entries (or after 10 s).
  private func logWithADueTimer(
    _ loop: EventLoop, _ recorder: PassEndRecorder, until count: Int, _ queue: @escaping @Sendable () -> Void
  ) async throws -> [String] {
    let timer = await loop.submit {
      let timer = LoopTimer(loop: loop) { recorder.log.append("timer") }
      timer.schedule(after: 0)
      queue()
      return LoopTimerBox(timer)
    }
    let deadline = MonotonicClock.seconds() + 10
    while await loop.submit({ recorder.log.count }) < count && MonotonicClock.seconds() < deadline {
      try await Task.sleep(for: .milliseconds(10))
    }
    let log = await loop.submit { recorder.log }
    withExtendedLifetime(timer) {}
    return log
  }

  /// Work asked with `atPassEnd` runs once the pass over the job queue has run every job, the jobs the pass itself
  /// made included, and before the loop polls again (a timer already due fires after it). Code outside a pass (a C
  /// callback: the timer's) is refused, and nothing runs for it: the kept connection then leaves its request to
  /// libevent's write watch.
  @Test func passEndWorkRunsAfterThePassJobsAndBeforeTheNextTurn() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let probe = PassEndProbe(loop: loop)
    #expect(await probe.run() == ["job", "asked: true", "later job", "pass end", "timer asked: false"])
    // Outside any pass (before the loop runs jobs, on this thread) nothing is asked either.
    let idle = try EventLoop()
    #expect(!idle.atPassEnd(PassEndRecorder()))
  }

  /// Timers armed with a common duration (libevent's queue per duration instead of its heap) fire in the order
  /// they were armed, a re-armed one moving behind the others; a repeating one keeps its period; one duration is
  /// one common timeout; and past `commonTimeoutLimit` durations a timer gets the heap and still fires.
  @Test func commonTimeoutsFireInOrderAndPastTheLimit() async throws {
    let loop = try EventLoop()
    loop.start()
    defer { loop.stop() }
    let (order, ticks) = await CommonTimeoutProbe(loop: loop).run()
    #expect(order == ["b", "c", "a", "past the limit"])
    // A 0.02-s period over the ~0.3 s the probe waits: about 15 ticks (the bounds allow a loaded machine's lateness).
    #expect(ticks >= 5 && ticks <= 20)
    // A loop never started: its base takes common timeouts all the same (a listener's, made before the loop runs).
    let fresh = try EventLoop()
    let quarter = fresh.commonTimeout(seconds: 0.25)
    #expect(quarter.tv_sec == 0 && quarter.tv_usec >= 1_000_000, "libevent's magic marks a common timeout")
    #expect(fresh.commonTimeout(seconds: 0.125).tv_usec != quarter.tv_usec)
    #expect(fresh.commonTimeout(seconds: 0.25).tv_usec == quarter.tv_usec)
    for index in 0..<EventLoop.commonTimeoutLimit { _ = fresh.commonTimeout(seconds: 10 + Double(index)) }
    let past = fresh.commonTimeout(seconds: 99.5)
    #expect(past.tv_sec == 99 && past.tv_usec == 500_000, "the plain duration once the limit is reached")
    #expect(fresh.commonTimeout(seconds: 0.25).tv_usec == quarter.tv_usec, "a known one stays common")
  }

  /// A duration from configuration can be anything validation lets through: huge ones are clamped (`1e19` seconds
  /// trapped converting to whole seconds; `1e16` trapped keying the common timeouts), negative ones and NaN are 0.
  @Test func hugeAndInvalidDurationsAreClamped() throws {
    #expect(timeval(seconds: 1e19).tv_sec == Int(timeval.maxSeconds))
    #expect(timeval(seconds: .infinity).tv_sec == Int(timeval.maxSeconds))
    #expect(timeval(seconds: .nan).tv_sec == 0 && timeval(seconds: .nan).tv_usec == 0)
    #expect(timeval(seconds: -5).tv_sec == 0)
    let loop = try EventLoop()
    let huge = loop.commonTimeout(seconds: 1e16)
    #expect(huge.tv_sec == Int(timeval.maxSeconds) && huge.tv_usec >= 1_000_000)
    #expect(loop.commonTimeout(seconds: 1e19).tv_usec == huge.tv_usec, "both clamp to one duration")
  }
}

/// Arms a repeating timer and three one-shot ones (a, b, c) with common durations, re-arms a, then (past the limit
/// of common durations) a plain one. Loop-confined.
private actor CommonTimeoutProbe {
  let loop: EventLoop
  var order: [String] = []
  var ticks = 0
  var timers: [LoopTimer] = []
  init(loop: EventLoop) { self.loop = loop }
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  func run() async -> (order: [String], ticks: Int) {
    let ticking = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.assumeIsolated { $0.ticks += 1 } }
    ticking.schedule(after: 0.02, common: true)
    timers.append(ticking)
    let named = ["a", "b", "c"].map { name in
      let timer = LoopTimer(loop: loop) { [weak self] in self?.assumeIsolated { $0.order.append(name) } }
      timer.schedule(after: 0.1, common: true)
      return timer
    }
    named[0].schedule(after: 0.1, common: true)
    timers += named
    for index in 0..<EventLoop.commonTimeoutLimit { _ = loop.commonTimeout(seconds: 20 + Double(index)) }
    let late = LoopTimer(loop: loop) { [weak self] in self?.assumeIsolated { $0.order.append("past the limit") } }
    late.schedule(after: 0.15, common: true)
    timers.append(late)
    try? await Task.sleep(for: .milliseconds(300))
    ticking.cancel()
    return (order, ticks)
  }
}

/// Keeps a timer alive outside the loop (it is armed and fires there only).
private final class LoopTimerBox: @unchecked Sendable {
  let timer: LoopTimer
  init(_ timer: LoopTimer) { self.timer = timer }
}

/// Each link sleeps 1 ms, logs and queues the next link as a new job. Loop-confined.
private final class JobChain: @unchecked Sendable {
  let loop: EventLoop
  let recorder: PassEndRecorder
  let links: Int
  var done = 0
  init(loop: EventLoop, recorder: PassEndRecorder, links: Int) {
    (self.loop, self.recorder, self.links) = (loop, recorder, links)
  }
  func link() {
    loop.execute {
      usleep(1_000)
      self.recorder.log.append("job \(self.done)")
      self.done += 1
      if self.done < self.links { self.link() }
    }
  }
}

/// Loop-confined: touched only by jobs and callbacks on the probe's loop.
private final class PassEndRecorder: LoopPassEndWork, @unchecked Sendable {
  var log: [String] = []
  func passEnded() { log.append("pass end") }
}

private actor PassEndProbe {
  let loop: EventLoop
  let recorder = PassEndRecorder()
  var timer: LoopTimer?
  init(loop: EventLoop) { self.loop = loop }
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  func run() async -> [String] {
    let (recorder, loop) = (self.recorder, self.loop)
    recorder.log.append("job")
    recorder.log.append("asked: \(loop.atPassEnd(recorder))")
    loop.execute { recorder.log.append("later job") }
    let timer = LoopTimer(loop: loop) { recorder.log.append("timer asked: \(loop.atPassEnd(recorder))") }
    timer.schedule(after: 0)
    self.timer = timer
    await loop.nextTurn()
    return recorder.log
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
