import Foundation

/// `pollcast recipe check [--config F] [--polls N] [--hold S] [settings…]`: runs the configured recipe against
/// the real API once — the session, then N polls — and prints each request (secrets redacted), each answer and its
/// body (cut, secrets redacted; a session answer's shape only), the rule that decided it, the SSE events the relay
/// would send, and where the cursor goes. Exit 0 when every poll was answered (or held) and no error status was
/// taken by a rule without a status; 1 otherwise; 64 and 78 as the relay itself.
public enum RecipeCheck {
  public static let usage = """
    USAGE: pollcast recipe check [--config FILE] [--polls N] [--hold SECONDS] [--<setting> VALUE …]

    Runs upstream.recipe against its API: the session steps, then N polls (default 3), each cut after
    --hold seconds (default 10; a poll still held then counts as held: no news, cursor kept). Prints every
    request with secrets redacted, every answer and its body (cut, secrets redacted), the rule that decided it
    and the SSE events it would send. Exits 1 when any call failed or a rule without a status took an error
    answer.
    """

  public static func run(arguments: [String], environment: [String: String]) async -> Int32 {
    var rest: [String] = []
    var polls = 3
    var hold = 10.0
    var index = 0
    while index < arguments.count {
      let argument = arguments[index]
      index += 1
      if argument == "-h" || argument == "--help" {
        print(usage)
        return 0
      }
      if argument == "--polls" || argument == "--hold" {
        let most = argument == "--polls" ? 1e6 : Setting.largestNumber
        guard index < arguments.count, let number = Double(arguments[index]), number > 0, number <= most else {
          PollcastCommand.printError(
            "Error: \(argument) needs a number greater than 0 and at most \(formatNumber(most))\n\n\(usage)\n")
          return PollcastCommand.exitUsage
        }
        index += 1
        if argument == "--polls" { polls = max(1, Int(number)) } else { hold = number }
        continue
      }
      rest.append(argument)
    }
    let options: CommandLineOptions
    do {
      options = try CommandLineOptions.parse(rest)
    } catch {
      PollcastCommand.printError("Error: \(error)\n\n\(usage)\n")
      return PollcastCommand.exitUsage
    }
    let configuration: Configuration
    switch PollcastCommand.loadConfiguration(options, environment: environment) {
    case .success(let loaded): configuration = loaded
    case .failure(let exit): return exit.code
    }
    guard configuration.adapterKind == .recipe, let recipe = configuration.loadedRecipe.recipe else {
      PollcastCommand.printError("Error: recipe check needs upstream.adapter recipe (and upstream.recipe)\n")
      return PollcastCommand.exitConfig
    }
    let streams =
      recipe.isMultiStream
      ? "streams \(recipe.streams.map(\.source).joined(separator: ", "))" : "stream \(recipe.stream)"
    print("recipe \(recipe.name): \(streams), \(recipe.session.count) session step(s), \(polls) poll(s)")
    // Which values print as [redacted], by name (never by value): what the recipe reads from the environment (a
    // URL excepted: only its userinfo and secret query values are hidden), the session's values, the credential.
    let environment = configuration.loadedRecipe.environment
    let hidden = recipe.environmentNames.sorted().filter { environment[$0].map(RecipeScope.isSecretValue) ?? false }
    let sessionNames = recipe.session.flatMap { $0.extract.filter { $0.1.secret }.map(\.0) }
    if !hidden.isEmpty || !sessionNames.isEmpty {
      let names = hidden.map { "$\($0)" } + sessionNames.map { "the session's \($0)" }
      print("  shown as [redacted] wherever they appear: \(names.joined(separator: ", "))")
      // `RecipeScope.isSecretValue`: a value under 4 characters would cut every `1` or `true` out of a line.
      print("  (a value under 4 characters, such as a short numeric user id, is shown as it is)")
    }
    do {
      let loop = try EventLoop()
      loop.start()
      defer { loop.stop() }
      let transport = try await loop.submit { () throws(UpstreamError) -> CurlTransport in
        try CurlTransport(loop: loop)
      }
      transport.maxBodyBytes = configuration.upstream.maxBodyBytes
      let driver = CheckDriver(loop: loop, transport: transport)
      let adapter = RecipeAdapter(
        recipe: recipe, environment: configuration.loadedRecipe.environment,
        credential: configuration.upstream.apiKey.isEmpty ? nil : configuration.upstream.apiKey,
        pollTimeout: min(hold, configuration.upstream.pollTimeoutSeconds + configuration.upstream.requestMarginSeconds),
        requestTimeout: configuration.upstream.requestTimeoutSeconds,
        connectTimeout: configuration.upstream.connectTimeoutSeconds)
      adapter.timeoutCap = hold
      return await driver.run(adapter, polls: polls, startFrom: configuration.workerSettings.startFrom)
    } catch {
      PollcastCommand.printError("Error: cannot start: \(error)\n")
      return PollcastCommand.exitUnavailable
    }
  }
}

/// Prints each request as it leaves (secrets redacted) and each answer: its status, and its body cut to a few hundred
/// characters with secrets and control bytes shown escaped (a session answer's body holds fresh secrets: only its
/// shape). Keeps the last answer's status for the driver.
private struct PrintingInterceptor: UpstreamInterceptor {
  /// The last answer's status (nil: the request failed), loop-confined like the client.
  final class Seen: @unchecked Sendable {
    var status: Int?
  }
  let seen: Seen

  func prepare(_ request: inout UpstreamRequest) {
    var url = redactURL(request.url)
    for secret in request.redact { url = UpstreamResponse.scrub(url, [secret]) }
    print("→ \(request.label): \(request.method) \(CheckText.printable(url))")
    for (name, value) in request.headers {
      let secret =
        request.redact.contains { value.contains($0) } || ["authorization", "cookie"].contains(name.lowercased())
      print("    \(name): \(secret ? "[redacted]" : CheckText.printable(value))")
    }
    if let body = request.body, !body.isEmpty {
      print("    body: \(CheckText.shown(body, redact: request.redact))")
    }
  }

  func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>) {
    switch outcome {
    case .success(let response):
      seen.status = response.status
      print("← \(response.status), \(response.body.count) bytes in \(Int(response.duration * 1000)) ms")
      guard !response.body.isEmpty else { return }
      if request.label == "session" {
        let json =
          response.body.count <= 1 << 16 ? try? RawJSON.parse(String(decoding: response.body, as: UTF8.self)) : nil
        print("    body: not shown (a session answer holds fresh secrets); \(RecipeAnswer.shape(json))")
      } else {
        print("    body: \(CheckText.shown(response.body, redact: request.redact))")
      }
    case .failure(let error):
      seen.status = nil
      print("← failed: \(CheckText.printable(UpstreamResponse.scrub(error.description, request.redact)))")
    }
  }
}

private actor CheckDriver {
  let loop: EventLoop
  let transport: CurlTransport
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  init(loop: EventLoop, transport: CurlTransport) {
    self.loop = loop
    self.transport = transport
  }

  func run(_ adapter: RecipeAdapter, polls: Int, startFrom: UpstreamWorker.StartFrom) async -> Int32 {
    let seen = PrintingInterceptor.Seen()
    let client = UpstreamClient(transport: transport, interceptors: [PrintingInterceptor(seen: seen)])
    var book = CursorBook()
    var succeeded = 0
    var failed = 0
    var swallowed = 0
    var frames: UInt64 = 0
    var prepared = false
    var poll = 0
    var sessions = 0
    while poll < polls {
      do throws(UpstreamError) {
        if !prepared {
          sessions += 1
          guard sessions <= 3 else {
            print("✗ three sessions in a row did not give a working poll: stopping")
            failed += 1
            break
          }
          let preparation = try await adapter.prepare(client)
          _ = book.apply(preparation, startFrom: startFrom)
          print("  session ready\(adapter.lastRule.map { " (\($0))" } ?? ""); cursor \(cursorText(book, adapter))")
          prepared = true
        }
        poll += 1
        print("poll \(poll) of \(polls) from cursor \(cursorText(book, adapter))")
        let answer = try await adapter.poll(client, cursors: book.cursors, tokens: book.tokens)
        succeeded += 1
        sessions = 0
        print("  decided by \(adapter.lastRule ?? "the defaults")")
        if let problem = Self.swallowedError(seen.status, adapter) {
          print("  ✗ \(problem)")
          swallowed += 1
        }
        let plan = book.plan(answer)
        for reset in plan.resets {
          let gap = reset.gap ? ", clients get a resync status event" : ""
          if adapter.recipe.cursor.opaque {
            let api = book.tokens(after: plan)[reset.stream].map { adapter.shownCursor($0) } ?? "its initial"
            print("  the API's cursor reset to \(api) (\(reset.reason))\(gap)")
          } else {
            print("  cursor reset to \(reset.to) (\(reset.reason))\(gap)")
          }
        }
        for rejection in answer.rejected {
          print(
            "  \(rejection.expected ? "skipped" : "rejected"): \(rejection.reason) (id \(rejection.id.map(String.init) ?? "none"))"
          )
        }
        for (stream, message) in plan.fresh {
          frames += 1
          let backlog = book.isBacklog(message.id, stream: stream)
          // A summary, then the SSE event as it goes on the wire (its id as a new feed would number it).
          print(
            "  event stream=\(stream) id=\(message.id)\(message.label.map { " upstream_id=\($0)" } ?? "")"
              + " backlog=\(backlog), sent as:")
          let data = UpstreamWorker.envelopeData(message, stream: stream, backlog: backlog)
          let frame = String(decoding: SSEEncoder.event(id: frames, type: nil, data: data), as: UTF8.self)
          for line in frame.split(separator: "\n") { print("    \(CheckText.printable(String(line), limit: 400))") }
        }
        if plan.duplicates > 0 { print("  \(plan.duplicates) resent event(s) dropped") }
        let before = book.cursors
        let tokensBefore = book.tokens
        book.stored(plan.fresh[...], window: plan.dedupeWindow)
        let next = book.settled(plan)
        book.moved(to: next, after: plan)
        book.moved(tokens: book.tokens(after: plan))
        print(
          before == book.cursors && tokensBefore == book.tokens
            ? "  cursor held at \(cursorText(book, adapter))" : "  cursor moved to \(cursorText(book, adapter))")
      } catch {
        if error.kind == .timeout {
          succeeded += 1
          print("  held for the whole --hold: no news, cursor held at \(cursorText(book, adapter))")
          continue
        }
        print("  ✗ \(CheckText.printable(error.description))")
        if let delay = error.retryAfter { print("    the server asks to wait \(delay) s before the next request") }
        if error.kind == .sessionExpired {
          // The recipe asked for a new session (a 401, a session rule): its own path, not a failure.
          prepared = false
          continue
        }
        failed += 1
        if !prepared { break }
      }
    }
    client.cancelAll()
    if succeeded > 0 && failed == 0 && swallowed == 0 {
      print("✓ \(succeeded) of \(poll) poll(s) answered; the recipe works against this API")
      return 0
    }
    var problems = ["\(failed) call(s) failed"]
    if swallowed > 0 { problems.append("\(swallowed) error answer(s) taken by a rule without a status") }
    print("✗ \(succeeded) of \(poll) poll(s) answered; \(problems.joined(separator: ", "))")
    return 1
  }

  /// An error status (4xx, 5xx) that a rule without `status` took as an answer: the rule was likely written for a
  /// 200's body and an error's body happened to match it.
  static func swallowedError(_ status: Int?, _ adapter: RecipeAdapter) -> String? {
    guard let status, status >= 400, let label = adapter.lastRule,
      let rule = adapter.recipe.rules.first(where: { $0.label == label }), rule.statuses == nil,
      !rule.actions.contains(where: { [.retry, .fail, .session, .refuseKey].contains($0) })
    else { return nil }
    return
      "\(label) has no status and took a \(status) answer as \(rule.actions.map(\.rawValue).joined(separator: "+"))"
      + ": give it a status (or a class such as \"2xx\") so an error is not read as news"
  }

  /// Each stream's cursor: the last event's id for an integer recipe; for an opaque one the API's own cursor as
  /// `/metrics` shows it (no session values, secrets redacted), with the relay's count of relayed events beside it
  /// (what `Last-Event-ID` numbering builds on, not something the API sees).
  private func cursorText(_ book: CursorBook, _ adapter: RecipeAdapter) -> String {
    book.streams.map { stream in
      let relayed = book.cursors[stream].map(String.init) ?? "none"
      guard adapter.recipe.cursor.opaque else { return "\(stream)=\(relayed)" }
      let api = book.tokens[stream].map { adapter.shownCursor($0) } ?? "none yet (the recipe's initial)"
      return "\(stream)=\(api) (relayed so far: \(relayed))"
    }.joined(separator: ", ")
  }
}

/// Text `recipe check` prints from an API: control bytes escaped (an answer must not drive the terminal), long
/// values cut.
enum CheckText {
  static func printable(_ text: String, limit: Int = 2000) -> String {
    var out = ""
    var count = 0
    for scalar in text.unicodeScalars {
      if count >= limit {
        out += "… (\(text.utf8.count) bytes)"
        break
      }
      count += 1
      switch scalar.value {
      case 0x0A: out += "\\n"
      case 0x0D: out += "\\r"
      case 0x09: out += "\\t"
      case 0..<0x20, 0x7F...0x9F, 0x2028, 0x2029: out += "\\u{\(String(scalar.value, radix: 16))}"
      default: out.unicodeScalars.append(scalar)
      }
    }
    return out
  }

  /// A body as shown: at most 300 characters, secrets cut out before the cut (so none is shown in part).
  static func shown(_ body: [UInt8], redact: [String]) -> String {
    let longest = redact.map(\.count).max() ?? 0
    let text = String(decoding: body.prefix(1200 + 6 * longest), as: UTF8.self)
    let scrubbed = UpstreamResponse.scrub(text, redact)
    let cut = scrubbed.count > 300 || body.count > 1200 + 6 * longest
    return printable(String(scrubbed.prefix(300)), limit: .max) + (cut ? "… (\(body.count) bytes)" : "")
  }
}
