import Foundation
import PollcastCore

/// `pollcast-legacy-fixture --listen HOST:PORT [--api-key KEY] [--user-id ID] [--linked-user-id ID|none]`
public enum FixtureCommand {
  public static let usage = """
    USAGE: pollcast-legacy-fixture [--listen HOST:PORT] [--api-key KEY] [--user-id ID] [--linked-user-id ID|none]
                                 [--accounts N] [--page-size N] [--chatter SECONDS] [--max-poll-timeout SECONDS]
                                 [--answer-delay-ms MS] [--stall-fraction F]

    Serves the reference legacy long-poll API (POST /api/session, GET /api/messages/last, GET /api/messages/poll,
    GET /api/feed) and its control API (/_control/messages, /_control/link, /_control/expire-tokens,
    /_control/faults, /_control/stats). The first line on stdout is `listening on HOST:PORT`.

    OPTIONS:
      --listen HOST:PORT      default 127.0.0.1:8081; port 0 picks a free one
      --api-key KEY           the key POST /api/session accepts (default dev-key)
      --user-id ID            the primary account (default 101)
      --linked-user-id ID     the linked account at start, or none (default 202)
      --chatter SECONDS       append a demo message every SECONDS (default: off)
      --page-size N           messages per poll answer at most (default: 100)
      --accounts N            also serve users 1000 … 1000+N-1, API key key-<user_id>, no linked account
                              (per-user relaying); /_control/stats then reports them under "users"
      --max-poll-timeout S    the longest a poll is held, whatever timeout= asks (default 120)
      --answer-delay-ms MS    every poll answer goes out MS ms after it is decided, still in flight meanwhile:
                              a slow legacy API (default 0; sessions and control answers are not delayed)
      --stall-fraction F      this share (0 to 1) of accounts never get a poll answered, as if their connections
                              stalled; the same accounts on every run (a hash of the user id)
      -h, --help, --version
    """

  public static func run(arguments: [String]) async -> Int32 {
    var options = LegacyFixture.Options()
    options.port = 8081
    var chatter: Double?
    var index = 0
    func fail(_ message: String) -> Int32 {
      FileHandle.standardError.write(Data("Error: \(message)\n\n\(usage)\n".utf8))
      return 64
    }
    while index < arguments.count {
      var name = arguments[index]
      var value: String?
      if let equals = name.firstIndex(of: "="), name.hasPrefix("--") {
        value = String(name[name.index(after: equals)...])
        name = String(name[..<equals])
      }
      index += 1
      func next() -> String? {
        if let value { return value }
        guard index < arguments.count else { return nil }
        index += 1
        return arguments[index - 1]
      }
      switch name {
      case "-h", "--help":
        print(usage)
        return 0
      case "--version":
        print("pollcast-legacy-fixture \(PollcastVersion.current)")
        return 0
      case "--listen":
        guard let text = next() else { return fail("--listen needs a value") }
        do {
          let address = try ListenAddress.parse(text)
          options.host = address.host
          options.port = address.port
        } catch {
          return fail("--listen: \(error)")
        }
      case "--api-key":
        guard let key = next(), !key.isEmpty else { return fail("--api-key needs a value") }
        options.apiKey = key
      case "--user-id":
        guard let user = next(), !user.isEmpty else { return fail("--user-id needs a value") }
        options.userID = user
      case "--linked-user-id":
        guard let user = next(), !user.isEmpty else { return fail("--linked-user-id needs a value") }
        options.linkedUserID = user == "none" ? nil : user
      case "--accounts":
        guard let text = next(), let count = Int(text), count >= 0, count <= 1_000_000 else {
          return fail("--accounts needs a number of accounts (0 to 1000000)")
        }
        options.accounts = count
      case "--page-size":
        guard let text = next(), let size = Int(text), size > 0 else {
          return fail("--page-size needs a number of messages above 0")
        }
        options.pageSize = size
      case "--chatter":
        guard let text = next(), let seconds = Double(text), seconds > 0 else {
          return fail("--chatter needs a number of seconds above 0")
        }
        chatter = seconds
      case "--max-poll-timeout":
        guard let text = next(), let seconds = Double(text), seconds >= 0, seconds <= 3600 else {
          return fail("--max-poll-timeout needs a number of seconds (0 to 3600)")
        }
        options.maxPollTimeout = seconds
      case "--answer-delay-ms":
        guard let text = next(), let milliseconds = Double(text), milliseconds >= 0, milliseconds <= 600_000 else {
          return fail("--answer-delay-ms needs a number of milliseconds (0 to 600000)")
        }
        options.answerDelay = milliseconds / 1000
      case "--stall-fraction":
        guard let text = next(), let fraction = Double(text), fraction >= 0, fraction <= 1 else {
          return fail("--stall-fraction needs a share of accounts between 0 and 1")
        }
        options.stallFraction = fraction
      default:
        return fail("unknown option \(name)")
      }
    }
    let fixture: LegacyFixture
    do {
      fixture = try await LegacyFixture.start(options)
    } catch {
      FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
      return 69
    }
    if let chatter { await fixture.startChatter(every: chatter) }
    print("listening on \(fixture.address)")
    fflush(nil)
    _ = await SignalWaiter.wait(loop: fixture.loop, signals: [SIGTERM, SIGINT])
    await fixture.shutdown()
    return 0
  }
}
