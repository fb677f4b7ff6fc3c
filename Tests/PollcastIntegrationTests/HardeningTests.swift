import Foundation
import LegacyFixture
import PollcastCore
import Synchronization
import Testing

/// The defects found when the relay was tried as an attacker and as a new user would, each over real sockets.
@Suite(.serialized, .timeLimit(.minutes(5))) struct HardeningTests {
  // MARK: HTTP edges

  @Test(arguments: ["/metrics%00.css", "/events%00.js", "/healthz%00"])
  func aNulByteInTheDecodedPathIsRefused(path: String) async throws {
    try await RelayHarness.start().run { harness in
      let answer = try rawExchange(port: harness.port, "GET \(path) HTTP/1.1\r\nHost: x\r\n\r\n")
      #expect(answer.statuses == [400], "\(answer.text)")
    }
  }

  @Test func twoContentLengthHeadersAreRefusedAndNothingBehindThemIsRead() async throws {
    try await RelayHarness.start().run { harness in
      let smuggled =
        "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\nhello"
        + "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
      let answer = try rawExchange(port: harness.port, smuggled)
      #expect(answer.statuses == [400], "\(answer.text)")
      #expect(answer.closed)
      let both = try rawExchange(
        port: harness.port,
        "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
      #expect(both.statuses == [400], "\(both.text)")
    }
  }

  @Test func connectGets405WithAllowAndNoPipelinedAnswerIsAppended() async throws {
    try await RelayHarness.start().run { harness in
      let answer = try rawExchange(
        port: harness.port,
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
      // The 405 is framed (Content-Length: 0); what was pipelined behind the CONNECT is refused, never served.
      #expect(answer.statuses == [405, 400], "\(answer.text)")
      #expect(answer.text.contains("Allow: GET, HEAD, OPTIONS"))
      #expect(answer.text.contains("Content-Length: 0"))
      #expect(!answer.text.contains(#"{"status":"ok"}"#))
      #expect(answer.closed)
    }
  }

  @Test(arguments: ["FOO", "PROPFIND"])
  func unknownMethodsGet405WithAllowNotLibeventsErrorPage(method: String) async throws {
    try await RelayHarness.start().run { harness in
      let answer = try rawExchange(port: harness.port, "\(method) /events HTTP/1.1\r\nHost: x\r\n\r\n")
      #expect(answer.statuses == [405], "\(answer.text)")
      #expect(answer.text.contains("Allow: GET, HEAD, OPTIONS"))
      #expect(!answer.text.contains("<HTML>") && !answer.text.contains("<html>"))
    }
  }

  @Test func aQueryKeyWithoutAValueAndUnknownParametersAreIgnored() async throws {
    try await RelayHarness.start().run { harness in
      let client = try TestSSEClient(port: harness.port, path: "/events?x=1&y&&z=%zz&stream=101")
      try client.waitForHead()
      #expect(client.status == 200)
      let ids = await harness.publish(2)
      try client.waitUntil(timeout: 5, "two events") { $0.messageIDs == ids }
    }
  }

  // MARK: SSE interop

  /// Python's httpx-sse surfaced an empty `message` on every connect: the preamble's `retry:` stood in a block of
  /// its own. No block without `data:` may be sent (heartbeats, status, retry, resets included).
  @Test func noBlockWithoutDataIsEverSent() async throws {
    try await UpstreamHarness.start(feed: FeedSettings(heartbeatInterval: 0.2, retryMilliseconds: 1500)).run {
      harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      let resumed = try TestSSEClient(port: harness.port, headers: [("Last-Event-ID", "1")])  // a reset: too old
      try resumed.waitForHead()
      await harness.fixture.append(user: "101", texts: ["one", "two"])
      try client.waitUntil(timeout: 10, "two messages and heartbeats") {
        $0.relayedMessages.count == 2 && $0.bodyText.components(separatedBy: ": heartbeat").count > 4
      }
      try resumed.waitUntil(timeout: 10, "the reset and heartbeats") {
        $0.events(ofType: "reset").count == 1 && $0.bodyText.components(separatedBy: ": heartbeat").count > 2
      }
      for stream in [client, resumed] {
        let blocks = stream.bodyText.components(separatedBy: "\n\n").dropLast()  // the last may be incomplete
        #expect(!blocks.isEmpty)
        for block in blocks {
          let lines = block.split(separator: "\n")
          #expect(lines.contains { $0.hasPrefix("data:") }, "a block without data: \(block.debugDescription)")
        }
        #expect(stream.parser.retry == 1500)
        // The retry field travels inside the first real event's block.
        let first = try #require(blocks.first)
        #expect(first.contains("retry: 1500") && first.contains("data:"))
      }
    }
  }

  // MARK: Big data

  @Test func aBatchLargerThanThePendingBoundDoesNotCutAHealthySubscriber() async throws {
    try await RelayHarness.start(
      feed: FeedSettings(maxPendingBytes: 1 << 20, heartbeatInterval: 5)
    ).run { harness in
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      let payload = String(repeating: "y", count: 11_000)
      // 100 messages of 11 kB in one batch: 1.1 MB, more than the 1 MiB bound on what a subscriber may have pending.
      let ids = await harness.relay.feed.publish((0..<100).map { _ in FeedEvent(stream: "101", data: payload) })
      try client.waitUntil(timeout: 20, "the whole batch") { $0.messageIDs.count == 100 }
      #expect(client.messageIDs == ids)
      #expect(await harness.statistics().slowConsumerDisconnects == 0)
      // A second batch of the same size, while the first may still be draining: still nobody is cut.
      let more = await harness.relay.feed.publish((0..<100).map { _ in FeedEvent(stream: "101", data: payload) })
      try client.waitUntil(timeout: 20, "the second batch") { $0.messageIDs.count == 200 }
      #expect(client.messageIDs == ids + more)
      #expect(await harness.statistics().slowConsumerDisconnects == 0)
    }
  }

  /// One answer of 60,000 messages used to hold the loop for seconds (1,000,000 held it 7.3 s). It is now decoded
  /// off the loop and relayed in slices: `/healthz` keeps answering quickly and the reader gets every message.
  @Test func aHugeAnswerNeitherBlocksTheLoopNorLosesAMessage() async throws {
    var options = LegacyFixture.Options()
    options.pageSize = 100_000
    let count = 60_000
    let texts = (0..<count).map { "h\($0)" }
    var settings = UpstreamHarness.fastSettings(startFrom: .earliest)
    settings.publishSlice = 1000
    try await UpstreamHarness.start(
      fixture: options, settings: settings,
      feed: FeedSettings(ring: .init(maxEvents: 100_000, maxBytes: 1 << 30), heartbeatInterval: 5)
    ).run { harness in
      // The reader is curl writing to a file: a client that reads at full speed.
      let reader = try CurlReader(url: "http://127.0.0.1:\(harness.port)/events")
      try await harness.waitForSubscribers(1)
      try await harness.waitForParkedPoll()
      let slowest = Locked(0.0)
      let stop = Atomic(false)
      defer { stop.store(true, ordering: .relaxed) }
      let port = harness.port
      let prober = Thread {
        while !stop.load(ordering: .relaxed) {
          let started = MonotonicClock.seconds()
          _ = try? rawExchange(port: port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
          let took = MonotonicClock.seconds() - started
          slowest.withLock { $0 = max($0, took) }
          usleep(2_000)
        }
      }
      prober.start()
      await harness.fixture.append(user: "101", texts: texts)
      let received = try await reader.waitFor("\"upstream_id\":\"\(count)\"", timeout: 150)
      stop.store(true, ordering: .relaxed)
      var parser = SSEParser()
      let ids = parser.feed(Array(received.utf8)).filter { $0.type == "message" }.compactMap {
        try? RawJSON.parse($0.data)["upstream_id"]?.unsignedID
      }
      #expect(ids.count == count)
      #expect(ids == Array(1...UInt64(count)))
      #expect(await harness.relay.feed.statistics().slowConsumerDisconnects == 0)
      let worst = slowest.withLock { $0 }
      print("huge answer: \(count) messages, slowest /healthz \(Int(worst * 1000)) ms")
      // A debug build on 2 noisy cores: one slice of 1,000 events is a few ms in release, ~20 ms in debug; the
      // whole answer in one turn (before) held the loop for over 2 s here.
      // Bounded at 0.5 s: slices that ran back to back in one loop pass (a nextTurn that did not wait for I/O)
      // measured 0.87 s here and 1.17 s in CI, and passed the old 1 s bound locally.
      #expect(worst < 0.5 * timingFactor, "a /healthz took \(worst) s while a huge answer was relayed")
    }
  }

  // MARK: Hostile upstream data

  @Test func aPoisonMessageIsIsolatedAndTheCursorMovesPastIt() async throws {
    try await UpstreamHarness.start().run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["a"])
      let deep = await harness.fixture.appendPoison(user: "101", .deep)
      await harness.fixture.appendPoison(user: "101", .invalidUTF8)
      await harness.fixture.append(user: "101", texts: ["b"])
      try client.waitUntil(timeout: 10, "three messages") { $0.relayedMessages.count == 3 }
      #expect(client.relayedMessages.map(\.text) == ["a", "bad \u{FFFD}(\u{FFFD} bytes", "b"])
      #expect(!client.relayedMessages.map(\.upstreamID).contains(deep))
      let worker = await harness.worker.snapshot()
      #expect(worker.rejectedMessages == 1)
      #expect(worker.repairedMessages == 1)
      #expect(worker.cursors["101"] == 4)
      // The stream goes on after them.
      await harness.fixture.append(user: "101", texts: ["c"])
      try client.waitUntil(timeout: 10, "the next message") { $0.relayedMessages.count == 4 }
      #expect(await harness.fixture.statistics().pollsInFlight <= 1)
    }
  }

  /// A legacy database restored from a backup honours the relay's cursor by never answering: the relay notices
  /// through its periodic check of the upstream's latest ids, says so, and follows the server.
  @Test func idsGoingBackwardsAreNoticedAnnouncedAndFollowed() async throws {
    var settings = UpstreamHarness.fastSettings()
    settings.resyncInterval = 0.5
    try await UpstreamHarness.start(settings: settings, hold: 0.5).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["1", "2", "3", "4", "5"])
      try client.waitUntil(timeout: 10, "five messages") { $0.relayedMessages.count == 5 }
      await harness.fixture.rewind(user: "101", to: 2)
      try client.waitUntil(timeout: 10, "a resync notice") { client in
        client.events(ofType: "upstream").contains { $0.data.contains(#""state":"resync""#) }
      }
      let notice = try #require(client.events(ofType: "upstream").first { $0.data.contains("resync") })
      #expect(notice.data.contains(#""stream":"101""#) && notice.data.contains(#""cursor":"5""#))
      #expect(await harness.worker.snapshot().cursors["101"] == 2)
      await harness.fixture.append(user: "101", texts: ["after restore"])
      try client.waitUntil(timeout: 10, "the message after the restore") {
        $0.relayedMessages.last?.text == "after restore"
      }
      #expect(client.relayedMessages.last?.upstreamID == 3)
      #expect(await harness.worker.snapshot().cursorRewinds >= 1)
    }
  }

  /// The periodic sync is for a stream gone silent. While every answer moves the stream's cursor, the relay does not
  /// re-read the upstream's newest ids: that was one more request for most messages at 2,000 accounts. The first
  /// poll after the interval that comes back empty is followed by a sync.
  @Test func aBusyStreamIsNotResyncedAndASilentOneIs() async throws {
    var settings = UpstreamHarness.fastSettings()
    settings.resyncInterval = 0.3
    var options = LegacyFixture.Options()
    options.linkedUserID = nil
    try await UpstreamHarness.start(fixture: options, settings: settings, hold: 1.5).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      try await harness.waitForParkedPoll()
      let syncsBefore = await harness.fixture.statistics().syncs
      #expect(syncsBefore >= 1, "the cycle's first sync")
      for index in 1...10 {
        await harness.fixture.append(user: "101", texts: ["m\(index)"])
        try client.waitUntil(timeout: 10, "message \(index)") { $0.relayedMessages.count == index }
        try await Task.sleep(for: .milliseconds(100))
      }
      // Ten answers over more than three intervals, each of them moving the only stream's cursor.
      #expect(await harness.fixture.statistics().syncs == syncsBefore)
      #expect(await harness.worker.snapshot().cursors["101"] == 10)
      let deadline = MonotonicClock.seconds() + 10
      while await harness.fixture.statistics().syncs == syncsBefore, MonotonicClock.seconds() < deadline {
        try await Task.sleep(for: .milliseconds(20))
      }
      #expect(await harness.fixture.statistics().syncs > syncsBefore, "the empty poll after the interval: a sync")
    }
  }

  // MARK: Resources

  @Test func aSlowlorisConnectionIsClosedAtTheHeaderDeadline() async throws {
    try await RelayHarness.start(
      server: ServerSettings(host: "127.0.0.1", port: 0, timeout: 30, headerTimeout: 0.6)
    ).run { harness in
      let slow = try TestSSEClient(port: harness.port, path: "/events", method: "GET", headers: [], partial: true)
      let started = MonotonicClock.seconds()
      // One header byte every 100 ms: each resets evhttp's read timeout, never completes the request.
      var closed = false
      for byte in "X-Slow: abcdefghijklmnopqrstuvwxyz".utf8 {
        if (try? slow.sendBytes([byte])) == nil || (try? slow.pump(timeout: 0.1)) == false {
          closed = true
          break
        }
      }
      if !closed { try slow.waitForEOF(timeout: 5) }
      let took = MonotonicClock.seconds() - started
      #expect(took < 3 * timingFactor, "the slowloris connection lived \(took) s")
      let counters = await harness.relay.server.protectionCounters
      #expect(counters.accept.headerTimeouts == 1)
      // An honest client still gets its stream.
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      #expect(client.status == 200)
    }
  }

  /// The deadline holds for every request on a keep-alive connection, not only the first: a client that gets
  /// one answer and then dribbles its next request (or sits idle) is closed; one that keeps sending complete
  /// requests is not; a stream is never held to it.
  @Test func aKeepAliveConnectionThatDribblesItsNextRequestIsClosed() async throws {
    try await RelayHarness.start(
      server: ServerSettings(host: "127.0.0.1", port: 0, timeout: 30, headerTimeout: 0.6)
    ).run { harness in
      let request = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
      func answered(_ client: TestSSEClient, _ count: Int) throws {
        let deadline = MonotonicClock.seconds() + 5 * timingFactor
        var text = ""
        while MonotonicClock.seconds() < deadline {
          var descriptor = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
          guard poll(&descriptor, 1, 50) > 0 else { continue }
          var chunk = [UInt8](repeating: 0, count: 4096)
          let read = recv(client.fd, &chunk, chunk.count, 0)
          guard read > 0 else { throw TestSSEClient.Failure(description: "closed after \(text)") }
          text += String(decoding: chunk[0..<read], as: UTF8.self)
          if text.components(separatedBy: "HTTP/1.1 200").count - 1 >= count { return }
        }
        throw TestSSEClient.Failure(description: "no answer: \(text)")
      }
      // Honest keep-alive: a complete request every 0.3 s for 2 s, all answered on one connection.
      let honest = try TestSSEClient(rawPort: harness.port)
      for round in 1...7 {
        try honest.send(request)
        try answered(honest, 1)
        if round < 7 { try await Task.sleep(for: .milliseconds(300)) }
      }
      // A stream is never cut by the deadline.
      let stream = try TestSSEClient(port: harness.port)
      try stream.waitForHead()
      // Dribbler: one answer, then one header byte every 100 ms.
      let slow = try TestSSEClient(rawPort: harness.port)
      try slow.send(request)
      try answered(slow, 1)
      let started = MonotonicClock.seconds()
      var closed = false
      for byte in "GET /healthz HTTP/1.1\r\nX-Slow: abcdefghijklmnopqrstuvwxyz0123456789".utf8 {
        if (try? slow.sendBytes([byte])) == nil || (try? slow.pump(timeout: 0.1)) == false {
          closed = true
          break
        }
      }
      if !closed { try slow.waitForEOF(timeout: 5) }
      let took = MonotonicClock.seconds() - started
      #expect(took < 3 * timingFactor, "the dribbling keep-alive connection lived \(took) s")
      // Idle after an answer: closed as well.
      let idle = try TestSSEClient(rawPort: harness.port)
      try idle.send(request)
      try answered(idle, 1)
      try idle.waitForEOF(timeout: 5 * timingFactor)
      let counters = await harness.relay.server.protectionCounters
      #expect(counters.accept.headerTimeouts >= 2)
      try stream.pump(timeout: 0.2)
      #expect(!stream.isEOF, "the stream was cut")
    }
  }
}

/// What came back for raw request bytes: every status line's code, the whole text, and whether the server closed.
struct RawAnswer {
  var text: String
  var statuses: [Int]
  var closed: Bool
}

/// Sends `request` as is on a fresh connection, reads until the server closes it (or `timeout`).
func rawExchange(port: Int, _ request: String, timeout: Double = 5) throws -> RawAnswer {
  let client = try TestSSEClient(rawPort: port)
  try client.sendBytes(Array(request.utf8))
  var bytes: [UInt8] = []
  var closed = false
  let deadline = MonotonicClock.seconds() + timeout
  while MonotonicClock.seconds() < deadline {
    var descriptor = pollfd(fd: client.fd, events: Int16(POLLIN), revents: 0)
    guard poll(&descriptor, 1, 50) >= 0 else { break }
    if descriptor.revents == 0 { continue }
    var chunk = [UInt8](repeating: 0, count: 65536)
    let count = recv(client.fd, &chunk, chunk.count, 0)
    if count <= 0 {
      closed = true
      break
    }
    bytes += chunk[0..<count]
  }
  let text = String(decoding: bytes, as: UTF8.self)
  let statuses = text.components(separatedBy: "\r\n").compactMap { line -> Int? in
    guard line.hasPrefix("HTTP/1."), line.count >= 12 else { return nil }
    return Int(line.dropFirst(9).prefix(3))
  }
  return RawAnswer(text: text, statuses: statuses, closed: closed)
}

/// The relay as its own process under a low descriptor limit (`ulimit -n`), so the limit is really reached.
@Suite(.serialized, .timeLimit(.minutes(5))) struct DescriptorLimitTests {
  @Test func atTheDescriptorLimitTheRelayRefusesStreamsPausesAcceptingLogsOnceAndRecovers() async throws {
    let errorLog = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-fdlimit-\(getpid()).log")
    #expect(FileManager.default.createFile(atPath: errorLog.path, contents: nil))
    defer { try? FileManager.default.removeItem(at: errorLog) }
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/bin/sh")
    // The hard limit too, so the relay cannot raise itself out of it.
    process.arguments = [
      "-c",
      "ulimit -n 128 && exec \"$0\" --demo --listen 127.0.0.1:0 --server-descriptor-reserve 24 "
        + "--server-header-timeout-seconds 120 --sse-heartbeat-seconds 5",
      builtProduct("pollcast"),
    ]
    let out = Pipe()
    process.standardOutput = out
    process.standardError = try FileHandle(forWritingTo: errorLog)
    try process.run()
    defer { if process.isRunning { process.terminate() } }
    let port = try #require(
      listeningPort(of: out), "the relay did not start: \((try? String(contentsOf: errorLog, encoding: .utf8)) ?? "")")

    // 1. Streams are refused with 503 and Retry-After once the descriptor reserve is reached, and /healthz still
    //    answers from within the reserve.
    var streams: [TestSSEClient] = []
    var refused: TestSSEClient?
    for _ in 0..<140 {
      let client = try TestSSEClient(port: port)
      try client.waitForHead(timeout: 5)
      if client.status == 503 {
        refused = client
        break
      }
      streams.append(client)
    }
    let refusal = try #require(refused, "no stream was refused below the limit")
    #expect(refusal.headers["retry-after"].flatMap { Int($0) } != nil)
    #expect(streams.count > 60)
    let health = try rawExchange(port: port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    #expect(health.statuses == [200])

    // 2. Idle connections past the limit: accepting pauses instead of spinning a core on EMFILE.
    var idle: [TestSSEClient] = []
    for _ in 0..<120 { idle.append(try TestSSEClient(rawPort: port)) }
    let cpuBefore = processCPUSeconds(process.processIdentifier)
    try await Task.sleep(for: .seconds(2))
    let cpuUsed = processCPUSeconds(process.processIdentifier) - cpuBefore
    #expect(cpuUsed < 0.4 * timingFactor, "the relay used \(cpuUsed) s of CPU in 2 s at the descriptor limit")

    // 3. Clients leave: the relay accepts again by itself and serves a new stream.
    idle.removeAll()
    streams.removeAll()
    let recovered = MonotonicClock.seconds() + 20
    var served = false
    while !served && MonotonicClock.seconds() < recovered {
      if let client = try? TestSSEClient(port: port), (try? client.waitForHead(timeout: 2)) != nil,
        client.status == 200
      {
        served = true
      } else {
        try await Task.sleep(for: .milliseconds(200))
      }
    }
    #expect(served, "no stream was served after the clients left")
    try await Task.sleep(for: .seconds(1.5))
    kill(process.processIdentifier, SIGTERM)
    process.waitUntilExit()
    let log = (try? String(contentsOf: errorLog, encoding: .utf8)) ?? ""
    let paused = log.components(separatedBy: "out of file descriptors: accepting paused").count - 1
    #expect(paused >= 1 && paused <= 3, "logged the pause \(paused) times")
    #expect(!log.contains("Error from accept() call"))
    #expect(log.contains("accepting again after running out of file descriptors"))
    #expect(log.split(separator: "\n").count < 200, "the log grew to \(log.split(separator: "\n").count) lines")
  }
}

/// User plus system CPU seconds of a process, from /proc/PID/stat.
func processCPUSeconds(_ pid: Int32) -> Double {
  guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
    let close = text.lastIndex(of: ")")
  else { return 0 }
  let fields = text[text.index(after: close)...].split(separator: " ")
  // After the command: state is field 3; utime and stime are fields 14 and 15 (1-based over the whole line).
  guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
  return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// 100,000 messages without an id in one answer wrote 100,000 error lines.
@Suite(.serialized, .timeLimit(.minutes(5))) struct LogFloodTests {
  @Test func tenThousandMessagesWithoutAnIdLogAFewLinesAndTheStreamGoesOn() async throws {
    let lines = Locked<[String]>([])
    let logger = Logger(label: "test", level: .warning) { line in lines.withLock { $0.append(line) } }
    var options = LegacyFixture.Options()
    options.pageSize = 20_000
    try await UpstreamHarness.start(fixture: options, logger: logger).run { harness in
      try await harness.waitForState(.live)
      let client = try TestSSEClient(port: harness.port)
      try client.waitForHead()
      try await harness.waitForParkedPoll()
      await harness.fixture.append(user: "101", texts: ["before"])
      try client.waitUntil(timeout: 10, "the first message") { $0.relayedMessages.count == 1 }
      await harness.fixture.appendPoison(user: "101", .noID, count: 10_000)
      await harness.fixture.append(user: "101", texts: ["after"])
      try client.waitUntil(timeout: 20, "the message after them") { $0.relayedMessages.last?.text == "after" }
      let worker = await harness.worker.snapshot()
      // Counted each time the upstream sends them (the first answer may hold them alone, and be sent again).
      #expect(worker.rejectedMessages >= 10_000 && worker.rejectedMessages % 10_000 == 0)
      let rejectedLines = lines.withLock { $0.filter { $0.contains("cannot be relayed: skipped") } }
      #expect(rejectedLines.count <= 3, "\(rejectedLines.count) lines for 10,000 rejected messages")
      #expect(rejectedLines.first.map { _ in true } ?? false)
      // The next line of that kind, if any, says how many were held back.
      if rejectedLines.count > 1 { #expect(rejectedLines[1].contains("suppressed=")) }
      #expect(client.relayedMessages.map(\.text) == ["before", "after"])
    }
  }

  /// An answer holding only messages without an id cannot move the cursor: the upstream would answer the same at
  /// once, forever. The worker backs off instead of polling in a tight loop.
  @Test func anAnswerOfOnlyUnrelayableMessagesBacksOffInsteadOfStorming() async throws {
    var settings = UpstreamHarness.fastSettings()
    settings.backoff = Backoff(base: 0.2, cap: 0.4)
    try await UpstreamHarness.start(settings: settings).run { harness in
      try await harness.waitForState(.live)
      try await harness.waitForParkedPoll()
      let pollsBefore = await harness.fixture.statistics().polls
      await harness.fixture.appendPoison(user: "101", .noID, count: 3)
      try await Task.sleep(for: .seconds(1))
      let polls = await harness.fixture.statistics().polls - pollsBefore
      // Full jitter over 0.2–0.4 s: a handful of polls in a second, not thousands.
      #expect(polls >= 1 && polls <= 12, "\(polls) polls in one second")
    }
  }
}

/// A real client library from PyPI: httpx-sse surfaced an empty `message` event on every connect while the
/// preamble's `retry:` stood in a block of its own. Needs `python3 -m pip install httpx httpx-sse`
/// (scripts/install-deps.sh and .ci/run install them).
@Suite(.serialized, .timeLimit(.minutes(5))) struct PythonSSEClientTests {
  static let script = """
    import json, sys, httpx
    from httpx_sse import connect_sse
    events = []
    with httpx.Client(timeout=20) as client:
        with connect_sse(client, "GET", sys.argv[1]) as source:
            print("connected", flush=True)
            for sse in source.iter_sse():
                events.append({"event": sse.event, "data": sse.data, "id": sse.id, "retry": sse.retry})
                if sum(1 for e in events if e["event"] == "message") >= 2:
                    break
    print(json.dumps(events), flush=True)
    """

  @Test func httpxSSESeesOnlyRealEventsAndTheRetryField() async throws {
    try await UpstreamHarness.start(feed: FeedSettings(heartbeatInterval: 0.1, retryMilliseconds: 2500)).run {
      harness in
      try await harness.waitForState(.live)
      let process = Process()
      process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
      process.arguments = ["python3", "-c", PythonSSEClientTests.script, "http://127.0.0.1:\(harness.port)/events"]
      let out = Pipe()
      let err = Pipe()
      process.standardOutput = out
      process.standardError = err
      try process.run()
      defer { if process.isRunning { process.terminate() } }
      try await harness.waitForSubscribers(1, timeout: 20)
      try await Task.sleep(for: .milliseconds(400))  // a few heartbeats go out before the first message
      await harness.fixture.append(user: "101", texts: ["one", "two"])
      let deadline = MonotonicClock.seconds() + 20
      while process.isRunning && MonotonicClock.seconds() < deadline { try await Task.sleep(for: .milliseconds(50)) }
      let output = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
      let problems = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
      #expect(process.terminationStatus == 0, "python: \(problems)")
      let line = try #require(output.split(separator: "\n").last.map(String.init))
      let events = try RawJSON.parse(line)
      guard case .array(let list) = events.value else {
        Issue.record("not a list: \(line)")
        return
      }
      // The status event (upstream) and the two messages; never an empty event.
      #expect(list.count == 3, "\(line)")
      for event in list { #expect(event["data"]?.stringValue?.isEmpty == false, "an empty event: \(event.rawText)") }
      #expect(list.first?["event"]?.stringValue == "upstream")
      #expect(list.first?["retry"]?.rawText == "2500")
      #expect(list.dropFirst().allSatisfy { $0["event"]?.stringValue == "message" })
    }
  }
}
