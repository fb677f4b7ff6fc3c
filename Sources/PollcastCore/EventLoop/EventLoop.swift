import CLibevent
import Foundation
import Synchronization

/// One libevent base driven by one dedicated thread, exposed to Swift as a `SerialExecutor` and a `TaskExecutor`.
///
/// Every actor that owns relay state (`Feed`, `SSEServer`, the upstream worker) returns this loop as its
/// `unownedExecutor`, so their code runs on the loop thread and the compiler checks the isolation. C callbacks
/// arrive on the same thread and enter those actors with `assumeIsolated`.
///
/// Tasks that live on the loop (the upstream worker's cycle, `execute`) prefer it as their task executor too: a
/// continuation resumed by a curl callback would otherwise resume on the global pool (a thread wake) only to hop
/// straight back to the loop (a second wake, through libevent's notify pipe). With the preference it is one job
/// queued on the loop's own thread.
public final class EventLoop: SerialExecutor, TaskExecutor, @unchecked Sendable {
  /// The libevent base. Touch it only on the loop thread (or before `start()`).
  public let base: OpaquePointer
  private let pending = Locked<[UnownedJob]>([])
  /// The last drained batch's buffer, emptied and kept for the next pass (loop thread only): swapped with `pending`,
  /// it takes the queued jobs without allocating. Taking them as a copy and emptying `pending` in place allocated a
  /// new buffer on every pass, several times a poll cycle.
  private var spare: [UnownedJob] = []
  /// Work asked for the end of the running pass over the job queue (`atPassEnd`), and its emptied buffer (loop
  /// thread only).
  private var passEnd: [any LoopPassEndWork] = []
  private var passEndSpare: [any LoopPassEndWork] = []
  /// True while `drainJobs` runs (loop thread only).
  private var draining = false
  private var wakeEvent: OpaquePointer?
  /// A zero timeout that continues a pass cut at `jobPassBudget` in the loop's next turn (`drainJobs`).
  private var continueEvent: OpaquePointer?
  private let loopThreadID = Atomic<UInt>(0)
  /// libevent's common timeouts made so far, by duration (whole seconds, microseconds: `commonTimeout(seconds:)`).
  private let commonTimeouts = Locked<[SIMD2<Int>: timeval]>([:])
  private let state = Locked<State>(.idle)
  private let finished = DispatchSemaphore(value: 0)

  private enum State { case idle, running, stopping, stopped }

  /// The longest pass that ran Swift jobs (tasks resumed on the loop), in seconds, and how many passes took longer
  /// than `slowJobPass`: with the lag probe, they tell a loop held by Swift work from one held in C callbacks
  /// (libcurl, libevent I/O). Loop-confined: written by the loop thread, read there (`/metrics`).
  public private(set) var longestJobPass = 0.0
  public private(set) var slowJobPasses = 0
  /// Passes cut at `jobPassBudget`, their jobs left to the next turn (loop-confined, like the two above).
  public private(set) var cutJobPasses = 0
  public static let slowJobPass = 0.010
  /// A pass over the job queue runs jobs for about this long at most; the jobs left then run in the loop's next
  /// turn, after the sockets and timers that became ready meanwhile. A burst of thousands of resumed poll cycles
  /// (a wave of held polls answered or timed out together) otherwise held every stream for as long as it took.
  public static let jobPassBudget = 0.005

  public init() throws(EventLoopError) {
    _ = EventLoop.enableThreads
    let base = try EventLoop.makeBase()
    self.base = base
    let context = Unmanaged.passUnretained(self).toOpaque()
    // Released never: the wake event lives exactly as long as the loop and is freed in deinit.
    guard let wake = event_new(base, -1, 0, eventLoopWakeCallback, context) else {
      event_base_free(base)
      throw EventLoopError(operation: "event_new(wake)")
    }
    wakeEvent = wake
    guard let again = event_new(base, -1, 0, eventLoopWakeCallback, context) else {
      event_free(wake)
      event_base_free(base)
      throw EventLoopError(operation: "event_new(continue)")
    }
    continueEvent = again
  }

  deinit {
    if let wakeEvent { event_free(wakeEvent) }
    if let continueEvent { event_free(continueEvent) }
    event_base_free(base)
  }

  /// A base on epoll with libevent's change list: the watch changes made between two `epoll_wait`s are folded into
  /// one `epoll_ctl` per descriptor. evhttp re-arms a kept connection's events six times a poll cycle (a response
  /// ends: read off and on; the next request: read off, on, write on; written: write off); folded, that is two calls.
  ///
  /// libevent documents the change list as unsafe when a watched descriptor's open file is also open under another
  /// descriptor (`dup`, or a child's inherited copy): a deferred removal then misses the kernel's registration, which
  /// outlives the close. Nothing watched here is ever shared that way: the watched descriptors are the relay's
  /// listeners and streams, evhttp's connections, libcurl's and hiredis's sockets. Of the libraries linked, libcurl
  /// forks only for NTLM through winbind (`CURLAUTH_NTLM_WB`), which the relay never asks for (it sets no
  /// `CURLOPT_HTTPAUTH`); Foundation's `dup` and `posix_spawn` (FileHandle, Process) and the Swift runtime's crash
  /// backtracer never touch a watched descriptor; this code calls none of them.
  private static func makeBase() throws(EventLoopError) -> OpaquePointer {
    let config = try LibeventCall.check(event_config_new(), "event_config_new")
    defer { event_config_free(config) }
    // Fails only for an unknown flag: a build against the wrong libevent, not a runtime condition.
    LibeventCall.invariant(
      event_config_set_flag(config, Int32(EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST.rawValue)), "event_config_set_flag")
    return try LibeventCall.check(event_base_new_with_config(config), "event_base_new_with_config")
  }

  /// `evthread_use_pthreads()` must run once before the first base is created.
  private static let enableThreads: Void = {
    // Without it no base may be touched from two threads (enqueue activates the wake event from any thread).
    LibeventCall.invariant(evthread_use_pthreads(), "evthread_use_pthreads")
    signal(SIGPIPE, SIG_IGN)
  }()

  /// Starts the loop thread. The loop keeps running with no events registered until `stop()`.
  public func start() {
    let shouldStart = state.withLock { state -> Bool in
      guard state == .idle else { return false }
      state = .running
      return true
    }
    guard shouldStart else { return }
    let thread = Thread { [self] in
      // A parent may start us with termination signals blocked (they are inherited); the loop thread must be
      // able to take them, or SIGTERM would stay pending forever and shutdown never begin.
      var signals = sigset_t()
      sigemptyset(&signals)
      for signum in [SIGTERM, SIGINT, SIGHUP] { sigaddset(&signals, signum) }
      pthread_sigmask(SIG_UNBLOCK, &signals, nil)
      // The kernel's name (top -H, perf, /proc/PID/task/*/comm; 15 bytes at most): Foundation's `Thread.name` does
      // not reach it, and the loop showed as the runtime's "oot.default-qos".
      _ = pollcast_name_this_thread("pollcast-loop")
      loopThreadID.store(UInt(bitPattern: Int(bitPattern: pthread_self())), ordering: .releasing)
      event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY)
      // Run whatever was enqueued before the loop broke so that no continuation is left hanging forever: all of
      // it, with no next turn to leave any to.
      drainJobs(budget: .infinity)
      loopThreadID.store(0, ordering: .releasing)
      state.withLock { $0 = .stopped }
      finished.signal()
    }
    thread.name = "pollcast-loop"
    thread.stackSize = 8 << 20
    thread.start()
  }

  /// Breaks the loop and waits for its thread to finish. Safe to call from any thread but the loop's own.
  public func stop() {
    let wasRunning = state.withLock { state -> Bool in
      guard state == .running else { return false }
      state = .stopping
      return true
    }
    guard wasRunning else { return }
    precondition(!inLoopThread, "EventLoop.stop() must not be called on the loop thread")
    // The break is asked from inside the loop, by the wake event: `event_base_loop` clears a break asked before it
    // began, so a stop right after `start()` (its thread not yet in the loop) waited forever. An activation made
    // before the loop began is run once it does.
    event_active(wakeEvent, 0, 0)
    finished.wait()
  }

  /// Durations kept as common timeouts at most (libevent allows 256 a base); a duration past them gets the heap.
  public static let commonTimeoutLimit = 64

  /// The timeout to give `event_add` (or evhttp, or a bufferevent) for an event whose duration many events on this
  /// loop share: every account feed's heartbeat tick, every kept upstream connection's read timeout and deadline.
  /// libevent keeps such events in one queue per duration, ordered by when they were added, and adds and removes
  /// them in constant time. Other timers sit in one binary heap, and with thousands of them (three per account in
  /// per-user relaying) each add and removal walks a dozen of the heap's levels, a cache miss each: that walk was
  /// ~6 % of the relay's CPU idle at 2,000 accounts. The returned value is libevent's own encoding (a magic in
  /// `tv_usec`), valid for this loop's base only. Past `commonTimeoutLimit` distinct durations it is the plain one.
  /// Any thread.
  public func commonTimeout(seconds: Double) -> timeval {
    let plain = timeval(seconds: seconds)
    let key = SIMD2(plain.tv_sec, plain.tv_usec)
    return commonTimeouts.withLock { made in
      if let known = made[key] { return known }
      guard made.count < Self.commonTimeoutLimit,
        let common = withUnsafePointer(to: plain, { event_base_init_common_timeout(base, $0) })
      else { return plain }
      made[key] = common.pointee
      return common.pointee
    }
  }

  /// True while the loop thread runs (between `start()` and the end of `stop()`).
  public var isRunning: Bool { loopThreadID.load(ordering: .acquiring) != 0 }

  /// True when the calling thread is this loop's thread.
  public var inLoopThread: Bool {
    let id = loopThreadID.load(ordering: .acquiring)
    return id != 0 && id == UInt(bitPattern: Int(bitPattern: pthread_self()))
  }

  // MARK: SerialExecutor

  public func enqueue(_ job: consuming ExecutorJob) {
    let unowned = UnownedJob(job)
    let first = pending.withLock { jobs -> Bool in
      jobs.append(unowned)
      return jobs.count == 1
    }
    // event_active is thread-safe once evthread_use_pthreads() ran. Only the job that makes the queue non-empty
    // activates the wake event: a later one finds it active, or the pass running now takes the job (it drains until
    // it sees the queue empty, and the next job after that is a first one again). Activating takes the base's lock.
    if first { event_active(wakeEvent, 0, 0) }
  }

  public func asUnownedSerialExecutor() -> UnownedSerialExecutor {
    UnownedSerialExecutor(ordinary: self)
  }

  public func asUnownedTaskExecutor() -> UnownedTaskExecutor {
    UnownedTaskExecutor(ordinary: self)
  }

  public func checkIsolated() {
    precondition(inLoopThread, "expected to run on the pollcast event loop thread")
  }

  /// Runs `body` on the loop thread, asynchronously.
  public func execute(_ body: @escaping @Sendable () -> Void) {
    // Preferring the loop, the task starts there: no detour through the global pool.
    Task(executorPreference: self) { await LoopRunner(loop: self).run(body) }
  }

  /// Runs `body` on the loop thread and returns its result.
  public func submit<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async rethrows -> T {
    try await LoopRunner(loop: self).run(body)
  }

  /// Asks for `work.passEnded()` once the running pass over the job queue has run every job, before the loop polls
  /// for I/O again; false (and nothing asked) when no pass is running — a C callback's code, not a job's. For work
  /// that may wait for the pass's other jobs but not for a loop turn: several poll cycles' requests written back to
  /// back rather than one between each cycle's jobs. Loop thread only.
  func atPassEnd(_ work: any LoopPassEndWork) -> Bool {
    assertOnLoop()
    guard draining else { return false }
    passEnd.append(work)
    return true
  }

  fileprivate func wake() {
    drainJobs()
    if state.withLock({ $0 == .stopping }) {
      LibeventCall.invariant(event_base_loopbreak(base), "event_base_loopbreak")
    }
  }

  fileprivate func drainJobs(budget: Double = EventLoop.jobPassBudget) {
    let started = MonotonicClock.seconds()
    defer {
      let took = MonotonicClock.seconds() - started
      if took > longestJobPass { longestJobPass = took }
      if took > EventLoop.slowJobPass { slowJobPasses += 1 }
    }
    // Jobs enqueued while draining are run in the same pass; the batch is swapped out so that enqueue() from other
    // threads never waits for a job to finish. Every job runs isolated to the loop and with the loop as its task
    // executor: a job of a task that prefers the loop then enters a loop actor without a switch, and its
    // nonisolated code stays on this thread.
    let executor = asUnownedSerialExecutor()
    let taskExecutor = asUnownedTaskExecutor()
    var batch: [UnownedJob] = []
    swap(&batch, &spare)
    draining = true
    defer {
      spare = batch
      draining = false
    }
    // Jobs run in this pass, across batches: a chain of jobs that each queue the next makes batches of one.
    var ran = 0
    while true {
      pending.withLock { swap(&$0, &batch) }
      if batch.isEmpty {
        // The queue is empty: the pass's end-of-pass work, then whatever jobs it made (none, so far).
        if passEnd.isEmpty { return }
        runPassEndWork()
        continue
      }
      for index in batch.indices {
        // The budget is checked before a job, so a pass whose last job spent it ends without a cut. The clock is
        // read every 16 jobs: the budget is a coarse bound, and most jobs take microseconds.
        if ran > 0, ran & 15 == 0, MonotonicClock.seconds() - started > budget {
          leaveForNextTurn(batch[index...])
          batch.removeAll(keepingCapacity: true)
          return
        }
        batch[index].runSynchronously(isolatedTo: executor, taskExecutor: taskExecutor)
        ran += 1
      }
      batch.removeAll(keepingCapacity: true)
    }
  }

  private func runPassEndWork() {
    swap(&passEnd, &passEndSpare)
    for work in passEndSpare { work.passEnded() }
    passEndSpare.removeAll(keepingCapacity: true)
  }

  /// Cuts the running pass (`jobPassBudget`): the jobs not run yet go back to the front of the queue, ahead of any
  /// queued since, and run in the next turn, once the loop has polled; the pass's end-of-pass work runs now, as it
  /// would have at the pass's end. The queue is not empty, so `enqueue` activates nothing until it has been
  /// drained: a zero timeout brings the next pass (libevent runs it after a poll that does not wait). A job of the
  /// cut pass that queued another into the then empty queue activated the wake event again; libevent would run it
  /// right after this pass, before polling, so that activation is taken back (a chain of jobs that each queue the
  /// next was never cut otherwise). The continuing pass runs `wake`, so a stop asked meanwhile is still seen.
  private func leaveForNextTurn(_ left: ArraySlice<UnownedJob>) {
    pending.withLock { $0.insert(contentsOf: left, at: 0) }
    cutJobPasses += 1
    LibeventCall.invariant(event_del(wakeEvent), "event_del(wake)")
    runPassEndWork()
    var now = timeval(tv_sec: 0, tv_usec: 0)
    LibeventCall.invariant(event_add(continueEvent, &now), "event_add(continue)")
  }
}

/// Work run at the end of a pass over the loop's job queue (`EventLoop.atPassEnd`).
protocol LoopPassEndWork: AnyObject {
  func passEnded()
}

/// A throwaway actor on the loop, used to run a closure there.
private actor LoopRunner {
  let loop: EventLoop
  init(loop: EventLoop) { self.loop = loop }
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
  func run<T: Sendable>(_ body: @Sendable () throws -> T) rethrows -> T { try body() }
}

private let eventLoopWakeCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = {
  _, _, context in
  guard let context else { return }
  Unmanaged<EventLoop>.fromOpaque(context).takeUnretainedValue().wake()
}

/// A libevent call failed.
public struct EventLoopError: Error, CustomStringConvertible, Sendable {
  public var operation: String
  public var errno: Int32 = Glibc.errno
  public var description: String {
    "libevent \(operation) failed: \(String(cString: strerror(errno)))"
  }
}

extension EventLoop {
  /// Suspends the calling actor (which runs on this loop) until the loop's next turn, after the network events
  /// that are ready now have had their callbacks. Long work split with it never holds the loop for more than one
  /// slice: clients keep reading, `/healthz` keeps answering. (Task.yield() would not do: jobs enqueued while the
  /// loop drains its queue run in the same pass, before any I/O.)
  public func nextTurn(isolation: isolated (any Actor)? = #isolation) async {
    await withCheckedContinuation(isolation: isolation) { (continuation: CheckedContinuation<Void, Never>) in
      let box = ContinuationBox(continuation)
      // Released by loopTurnCallback, which libevent calls exactly once (or here, when scheduling fails).
      let context = Unmanaged.passRetained(box).toOpaque()
      // One microsecond, not zero: libevent activates a zero-timeout `event_base_once` at once, in the pass that is
      // running, and with the loop as the task executor the resumed job then runs in that same pass too, so slices
      // ran back to back with no I/O between them (HardeningTests saw a 1.2 s /healthz). A due timer fires only
      // after the next poll for I/O, whose callbacks run first.
      var now = timeval(tv_sec: 0, tv_usec: 1)
      do {
        try LibeventCall.check(
          event_base_once(base, -1, pollcast_EV_TIMEOUT, loopTurnCallback, context, &now), "event_base_once")
      } catch {
        Unmanaged<ContinuationBox>.fromOpaque(context).release()
        continuation.resume()
      }
    }
  }
}

private final class ContinuationBox {
  let continuation: CheckedContinuation<Void, Never>
  init(_ continuation: CheckedContinuation<Void, Never>) { self.continuation = continuation }
}

private let loopTurnCallback: @convention(c) (Int32, Int16, UnsafeMutableRawPointer?) -> Void = { _, _, context in
  guard let context else { return }
  // Balances the passRetained in nextTurn.
  Unmanaged<ContinuationBox>.fromOpaque(context).takeRetainedValue().continuation.resume()
}
