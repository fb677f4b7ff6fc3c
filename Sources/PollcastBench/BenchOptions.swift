import Foundation
import PollcastCore

/// `pollcast-bench` options.
public struct BenchOptions: Sendable {
  public enum Mode: String, Sendable { case fanout, storm, idle, store }
  public enum Injector: Sendable {
    /// The reference fixture's control API: POST {"user_id":"101","text":"bench …"}.
    case fixture(String)
    /// A plain publish URL (nchan): POST the text as the body.
    case publish(String)
  }

  public var target = "http://127.0.0.1:8080/events"
  public var injector: Injector = .fixture("http://127.0.0.1:8081")
  public var mode = Mode.fanout
  public var subscribers = 1000
  public var messages = 200
  public var rate = 20.0
  public var idleSeconds = 60.0
  public var drainSeconds = 10.0
  public var relayPIDs: [Int32] = []
  public var sources = 4
  public var label = "relay"
  public var connectBatch = 500
  /// Seconds over which the first round of connections (one subscriber per account with `--accounts`, else all) is
  /// spread evenly, as users arrive; 0: in batches of `connectBatch`, as fast as the relay takes them.
  public var connectSpread = 0.0
  /// `ALG:KEYFILE`: give every subscriber its own signed token (`Authorization: Bearer`).
  public var mintTokens: String?
  /// Per-user relaying (`auth.mode = upstream`): subscriber i presents the fixture key `key-<1000 + i % A>`, and
  /// each message goes to one account picked at random; 0 is off.
  public var accounts = 0
  /// The fixture's `--stall-fraction`: messages go only to accounts whose polls the fixture answers (the same
  /// hash of the user id picks the stalled ones), so the stalled accounts' loss is not counted as the relay's.
  public var stallFraction = 0.0
  /// Sample the relay's `pollcast_event_loop_lag_seconds` every this many ms during the idle and message phases
  /// and report each phase's largest (0: off; a scrape costs the relay CPU, so the idle figure includes it).
  public var lagSampleMilliseconds = 0.0
  /// Messages per injection (the fixture takes a list): batches of this size reach the relay as one answer.
  public var batch = 1
  /// `--mode store`: the SQLite file to commit to (created; removed afterwards) and its `synchronous` setting.
  public var storePath = ""
  public var synchronous = SQLiteEventStore.Synchronous.normal

  public static let usage = """
    USAGE: pollcast-bench --target URL [--inject fixture:URL | publish:URL] [--mode fanout|storm|idle]
                          [--subscribers N] [--messages M] [--rate R] [--relay-pid PID[,PID…]] [--label NAME]

    Opens N SSE subscribers on the project's libevent loop, injects M messages at R per second (the send time is
    inside each message), and reports connect time, delivery latency, lost/duplicated/out-of-order events,
    deliveries per second and, given the relay's pid(s), its CPU per delivery and RSS per subscriber.
    Several --target URLs, comma-separated (the nodes of a cluster), share the subscribers round-robin (with
    --accounts, an account's subscribers on different nodes); a subscriber refused by its node tries the next.
      --mode storm        every subscriber drops halfway and resumes with Last-Event-ID
      --mode idle         relay CPU over --idle-seconds (default 60) with N idle subscribers
      --sources K         spread connections over 127.0.0.1…127.0.0.K (default 4)
      --drain-seconds S   wait this long after the last message for stragglers (default 10)
      --mint-tokens ALG:KEYFILE  every subscriber sends its own JWT (HS256: secret file; RS256/ES256: private
                          key PEM), signed with libjwt before connecting; reports relay CPU per connect
      --mode store        no relay: commit --messages events in batches of --batch to a SQLiteEventStore at
                          --store-path (--synchronous normal|full), one commit at a time as the upstream loop
                          does, and report commits/s, events/s and commit latency (the store's own ceiling)
      --batch B           inject B messages per request (rate / B requests per second), so the relay gets
                          them as one poll answer: one batch, one store commit (fixture injector only)
      --accounts A        per-user relaying against a fixture run with --accounts A: subscriber i sends the key
                          key-<1000 + i mod A>, each message goes to a random account; reports polls in flight
                          per account, RSS per account and per subscriber, and relay CPU idle over --idle-seconds
                          with every account's poll hanging (before the messages)
      --stall-fraction F  the fixture's --stall-fraction: messages skip the accounts it never answers
      --connect-spread S  open the first round of connections (one per account with --accounts) evenly over S
                          seconds, as users arrive, instead of in batches as fast as the relay takes them: the
                          relay's per-account timers (heartbeats) then run out of phase, as they do in the field
      --lag-sample-ms MS  scrape the relay's /metrics every MS ms in the idle and message phases and report the
                          largest loop lag of each (the relay's probe ticks every 500 ms)
    The last line is a machine-readable summary: SUMMARY key=value …
    """

  public static func parse(_ arguments: [String]) throws -> BenchOptions {
    var options = BenchOptions()
    var index = 0
    func value(_ name: String) throws -> String {
      guard index < arguments.count else { throw BenchError("\(name) needs a value") }
      index += 1
      return arguments[index - 1]
    }
    func number(_ name: String) throws -> Double {
      let text = try value(name)
      guard let number = Double(text), number >= 0 else { throw BenchError("\(name): not a number: \(text)") }
      return number
    }
    while index < arguments.count {
      let name = arguments[index]
      index += 1
      switch name {
      case "--target": options.target = try value(name)
      case "--inject":
        let text = try value(name)
        if text.hasPrefix("fixture:") {
          options.injector = .fixture(String(text.dropFirst("fixture:".count)))
        } else if text.hasPrefix("publish:") {
          options.injector = .publish(String(text.dropFirst("publish:".count)))
        } else {
          throw BenchError("--inject takes fixture:URL or publish:URL")
        }
      case "--mode":
        let text = try value(name)
        guard let mode = Mode(rawValue: text) else { throw BenchError("--mode: fanout, storm, idle or store") }
        options.mode = mode
      case "--subscribers": options.subscribers = Int(try number(name))
      case "--messages": options.messages = Int(try number(name))
      case "--rate": options.rate = try number(name)
      case "--idle-seconds": options.idleSeconds = try number(name)
      case "--drain-seconds": options.drainSeconds = try number(name)
      case "--sources": options.sources = max(1, min(250, Int(try number(name))))
      case "--connect-batch": options.connectBatch = max(1, Int(try number(name)))
      case "--connect-spread": options.connectSpread = min(3600, max(0, try number(name)))
      case "--batch": options.batch = max(1, Int(try number(name)))
      case "--store-path": options.storePath = try value(name)
      case "--synchronous":
        let text = try value(name)
        guard let synchronous = SQLiteEventStore.Synchronous(rawValue: text) else {
          throw BenchError("--synchronous: normal or full")
        }
        options.synchronous = synchronous
      case "--label": options.label = try value(name)
      case "--mint-tokens": options.mintTokens = try value(name)
      case "--accounts": options.accounts = Int(try number(name))
      case "--stall-fraction":
        options.stallFraction = try number(name)
        guard options.stallFraction < 1 else {
          throw BenchError("--stall-fraction: below 1 (some account must answer)")
        }
      case "--lag-sample-ms": options.lagSampleMilliseconds = try number(name)
      case "--relay-pid":
        options.relayPIDs = try value(name).split(separator: ",").map {
          guard let pid = Int32($0) else { throw BenchError("--relay-pid: not a pid: \($0)") }
          return pid
        }
      case "-h", "--help": throw BenchError.help
      default: throw BenchError("unknown option \(name)")
      }
    }
    if options.mode == .store && options.storePath.isEmpty { throw BenchError("--mode store needs --store-path") }
    guard options.rate > 0 || options.mode == .idle || options.mode == .store else {
      throw BenchError("--rate must be above 0")
    }
    return options
  }
}

public struct BenchError: Error, CustomStringConvertible {
  public var description: String
  public init(_ description: String) { self.description = description }
  public static let help = BenchError("help")
}

/// CPU time and memory of the relay process(es), from /proc.
struct ProcessSample {
  var cpuSeconds: Double
  var rssBytes: Int
  var userSeconds = 0.0

  static func take(_ pids: [Int32]) -> ProcessSample? {
    guard !pids.isEmpty else { return nil }
    var cpu = 0.0
    var userTotal = 0.0
    var rss = 0
    let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
    for pid in pids {
      guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
      else { return nil }
      let fields = stat[stat.index(after: close)...].split(separator: " ")
      // After the command: state is field 3; utime and stime are fields 14 and 15 (1-based).
      guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
      cpu += (user + system) / ticks
      userTotal += user / ticks
      if let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
        let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
        let kilobytes = Int(line.split(separator: " ").dropFirst().first ?? "")
      {
        rss += kilobytes * 1024
      }
    }
    return ProcessSample(cpuSeconds: cpu, rssBytes: rss, userSeconds: userTotal)
  }

  static func affinity(_ pid: Int32) -> String {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
      let line = status.split(separator: "\n").first(where: { $0.hasPrefix("Cpus_allowed_list:") })
    else { return "?" }
    return line.split(separator: "\t").last.map(String.init) ?? "?"
  }
}
