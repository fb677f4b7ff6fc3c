import Foundation
import PollcastCore

/// `pollcast-bench --mode store`: the SQLite store's own ceiling, without a relay. Commits `messages` events of
/// about 300 bytes (a relayed chat message's size) in batches of `batch`, one commit at a time as the upstream
/// loop does (it waits for a batch's commit before it polls again), with the cursors and the ring's trim (the
/// newest 10,000 events kept) in each transaction. The highest sustained publish rate through the store is then
/// `batch` events per commit latency.
public enum StoreBench {
  public static func run(_ options: BenchOptions) throws -> String {
    let path = options.storePath
    for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
    defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
    let store = try SQLiteEventStore.open(path: path, synchronous: options.synchronous)
    let payload = String(repeating: "x", count: 200)
    var latencies: [Double] = []
    latencies.reserveCapacity(options.messages / options.batch + 1)
    let done = DispatchSemaphore(value: 0)
    let failures = Locked(0)
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let cpuBefore = seconds(usage.ru_utime) + seconds(usage.ru_stime)
    let started = MonotonicClock.seconds()
    var id: UInt64 = 1_000_000
    var sent = 0
    while sent < options.messages {
      let count = min(options.batch, options.messages - sent)
      var events: [StoredEvent] = []
      for _ in 0..<count {
        id += 1
        let data = "{\"stream\":\"101\",\"upstream_id\":\"\(id)\",\"backlog\":false,\"message\":\"\(payload)\"}"
        events.append(
          StoredEvent(
            id: id, stream: "101", upstreamID: id, unixTime: Date().timeIntervalSince1970,
            bytes: ByteSlice(SSEEncoder.event(id: id, type: nil, data: data))))
      }
      let batch = StoreBatch(
        feed: "shared", events: events, position: FeedPosition(streams: ["101"], cursors: ["101": id]), headID: id,
        floorID: id > 1_010_000 ? id - 10_000 : 0)
      let before = MonotonicClock.seconds()
      store.commit(batch) { result in
        if case .failure = result { failures.withLock { $0 += 1 } }
        done.signal()
      }
      done.wait()
      latencies.append(MonotonicClock.seconds() - before)
      sent += count
    }
    let elapsed = MonotonicClock.seconds() - started
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime) - cpuBefore
    let stats = store.statistics()
    store.close()
    latencies.sort()
    func percentile(_ p: Double) -> Double {
      latencies.isEmpty ? 0 : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] * 1000
    }
    let commitsPerSecond = Double(latencies.count) / elapsed
    let text = String(
      format:
        "store sqlite (synchronous %@): %d events in batches of %d: %.0f commits/s, %.0f events/s, commit p50 %.3f ms"
        + " p99 %.3f ms, %.1f µs CPU per event, file %d KB, WAL %d KB, failures %d",
      options.synchronous.rawValue, sent, options.batch, commitsPerSecond, Double(sent) / elapsed, percentile(0.5),
      percentile(0.99), cpu / Double(max(1, sent)) * 1_000_000, stats.fileBytes / 1024, stats.walBytes / 1024,
      failures.withLock { $0 })
    let fields: [(String, String)] = [
      ("mode", "store"), ("synchronous", options.synchronous.rawValue), ("batch", String(options.batch)),
      ("events", String(sent)), ("commits_per_s", String(format: "%.0f", commitsPerSecond)),
      ("events_per_s", String(format: "%.0f", Double(sent) / elapsed)),
      ("commit_p50_ms", String(format: "%.3f", percentile(0.5))),
      ("commit_p99_ms", String(format: "%.3f", percentile(0.99))),
      ("cpu_us_per_event", String(format: "%.2f", cpu / Double(max(1, sent)) * 1_000_000)),
      ("failures", String(failures.withLock { $0 })),
    ]
    return text + "\nSUMMARY " + fields.map { "\($0.0)=\($0.1)" }.joined(separator: " ")
  }

  private static func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1_000_000 }
}
