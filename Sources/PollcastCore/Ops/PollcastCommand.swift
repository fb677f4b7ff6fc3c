import Foundation

/// The `pollcast` program: parse → build → run → exit code.
public enum PollcastCommand {
  public static let exitUsage: Int32 = 64
  public static let exitConfig: Int32 = 78
  public static let exitUnavailable: Int32 = 69
  /// The store (`store.path`) cannot be opened, or is corrupt or not a Pollcast store (sysexits' EX_IOERR).
  public static let exitStore: Int32 = 74

  /// What `--demo` runs against: started on demand, stopped at exit.
  public struct DemoUpstream: Sendable {
    public var url: String
    public var apiKey: String
    public var stop: @Sendable () async -> Void

    public init(url: String, apiKey: String, stop: @escaping @Sendable () async -> Void) {
      self.url = url
      self.apiKey = apiKey
      self.stop = stop
    }
  }

  public static func run(
    arguments: [String], environment: [String: String],
    demo startDemo: (@Sendable () async throws -> DemoUpstream)? = nil
  ) async -> Int32 {
    if arguments.first == "recipe" {
      guard arguments.count >= 2, arguments[1] == "check" else {
        printError("Error: the recipe command has one action: check\n\n\(RecipeCheck.usage)\n")
        return exitUsage
      }
      return await RecipeCheck.run(arguments: Array(arguments.dropFirst(2)), environment: environment)
    }
    let options: CommandLineOptions
    do {
      options = try CommandLineOptions.parse(arguments)
    } catch {
      printError("Error: \(error)\n\n\(CommandLineOptions.usage)\n")
      return exitUsage
    }
    if options.help {
      print(CommandLineOptions.usage)
      return 0
    }
    if options.version {
      print("pollcast \(PollcastVersion.current)")
      return 0
    }
    if options.helpConfig {
      print(CommandLineOptions.settingsReference())
      return 0
    }
    var configuration: Configuration
    switch loadConfiguration(options, environment: environment) {
    case .success(let loaded): configuration = loaded
    case .failure(let exit): return exit.code
    }
    if options.printConfig {
      let encoder = JSONEncoder()
      encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
      print(String(decoding: (try? encoder.encode(configuration.redacted)) ?? Data(), as: UTF8.self))
      return 0
    }
    let logger = configuration.logger
    let descriptors = raiseDescriptorLimit()
    var demo: DemoUpstream?
    if options.demo {
      guard let startDemo else {
        printError("Error: --demo is not available in this build\n")
        return exitUsage
      }
      do {
        let upstream = try await startDemo()
        configuration.upstream.adapter = "chat"
        configuration.upstream.url = upstream.url
        configuration.upstream.apiKey = upstream.apiKey
        configuration.isDemo = true
        demo = upstream
        logger.info("demo: embedded legacy fixture started", metadata: ["upstream.url": redactURL(upstream.url)])
      } catch {
        logger.error("demo: cannot start the embedded fixture", metadata: ["error": "\(error)"])
        return exitUnavailable
      }
    }
    let relay: Relay
    do {
      relay = try await Relay.start(configuration: configuration)
    } catch let error as StoreError {
      logger.error(
        "cannot open the store", metadata: ["path": error.path, "kind": error.kind.rawValue, "error": error.message])
      printError(
        "Error: \(error)\n" + (error.hint.map { "  \($0)\n" } ?? ""))
      await demo?.stop()
      // A store of another source is a configuration mistake (this relay points at the wrong store or API).
      return error.kind == .sourceMismatch ? exitConfig : exitStore
    } catch {
      logger.error("cannot start", metadata: ["error": "\(error)"])
      await demo?.stop()
      return exitUnavailable
    }
    print("listening on \(relay.address)")
    fflush(nil)
    logger.info(
      "listening",
      metadata: ["address": relay.address, "version": PollcastVersion.current, "max_open_files": String(descriptors)])
    if demo != nil && configuration.authMode == .upstream {
      logger.info(
        "demo running, per-user: curl -N -H 'Authorization: Bearer key-1000' http://\(relay.address)/events",
        metadata: ["demo_accounts": "dev-key (user 101, linked 202), key-1000 … key-1009"])
    } else if demo != nil {
      logger.info("demo running: curl -N http://\(relay.address)/events")
    }
    // SIGHUP re-reads the token keys (rotation without a restart); a bad key set keeps the previous one.
    let reloader = configuration.authMode == .jwt ? KeyReloader(relay: relay, configuration: configuration) : nil
    await reloader?.start()
    let signal = await SignalWaiter.wait(loop: relay.loop, signals: [SIGTERM, SIGINT])
    await reloader?.stop()
    if signal < 0 { logger.error("cannot watch termination signals: shutting down") }
    logger.info("shutting down", metadata: ["signal": "\(signal)"])
    await relay.shutdown(deadline: configuration.server.shutdownDeadlineSeconds)
    await demo?.stop()
    logger.info("stopped")
    return 0
  }

  /// Reads the file, the environment and the flags into a validated configuration, or prints every problem and
  /// returns the exit code (78).
  static func loadConfiguration(_ options: CommandLineOptions, environment: [String: String]) -> Result<
    Configuration, ExitCode
  > {
    var fileText: String?
    let configPath = options.configPath ?? environment["POLLCAST_CONFIG"]
    if let configPath {
      guard let data = FileManager.default.contents(atPath: configPath) else {
        printError("Error: cannot read configuration file \(configPath)\n")
        return .failure(ExitCode(exitConfig))
      }
      fileText = String(decoding: data, as: UTF8.self)
    }
    let configuration: Configuration
    do throws(ConfigurationError) {
      configuration = try ConfigurationLoader().load(
        fileText: fileText, fileName: configPath ?? "config", environment: environment,
        overrides: options.overrides.map { ($0.key, $0.value) })
      if !options.demo && !options.printConfig && !configuration.hasUpstream {
        throw ConfigurationError(
          configuration.adapterKind == .generic
            ? "generic.url_template is required for the generic adapter"
            : "upstream.url is required (--upstream-url URL), or run --demo against the embedded fixture")
      }
      // The key files are read now, so a missing or wrong key is a configuration error, not a late failure.
      if !options.printConfig { _ = try configuration.jwtSettings() }
    } catch {
      printError("Error: invalid configuration:\n" + error.problems.map { "  - \($0)" }.joined(separator: "\n") + "\n")
      return .failure(ExitCode(exitConfig))
    }
    return .success(configuration)
  }

  /// A process exit status carried as an error.
  struct ExitCode: Error {
    var code: Int32
    init(_ code: Int32) { self.code = code }
  }

  /// Writes to stderr with every control character but the line feed escaped as JSON escapes it (`\u001b`), as
  /// `Setting.shown` quotes a refused value: whatever a message quotes unquoted never reaches the terminal raw.
  static func printError(_ text: String) {
    var shown = ""
    shown.reserveCapacity(text.utf8.count)
    for scalar in text.unicodeScalars {
      if (scalar.value < 0x20 && scalar != "\n") || scalar.value == 0x7F {
        JSONText.appendUnicodeEscape(scalar, to: &shown)
      } else {
        shown.unicodeScalars.append(scalar)
      }
    }
    FileHandle.standardError.write(Data(shown.utf8))
  }
}

/// Waits on the loop for the first of `signals`; -1 when the signals cannot be watched.
public enum SignalWaiter {
  public static func wait(loop: EventLoop, signals: [Int32]) async -> Int32 {
    let holder = WatcherHolder(loop: loop)
    return await withCheckedContinuation { continuation in
      Task { await holder.install(signals: signals, continuation: continuation) }
    }
  }

  private actor WatcherHolder {
    let loop: EventLoop
    var watcher: SignalWatcher?
    nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }
    init(loop: EventLoop) { self.loop = loop }

    func install(signals: [Int32], continuation: CheckedContinuation<Int32, Never>) {
      var pending: CheckedContinuation<Int32, Never>? = continuation
      do {
        watcher = try SignalWatcher(loop: loop, signals: signals) { [weak self] signum in
          self?.assumeIsolated { holder in
            holder.watcher = nil
          }
          pending?.resume(returning: signum)
          pending = nil
        }
      } catch {
        pending?.resume(returning: -1)
        pending = nil
      }
    }
  }
}

/// Re-reads `auth.jwt.key_file` and `auth.jwt.keys_directory` on SIGHUP and hands the keys to the server.
actor KeyReloader {
  let relay: Relay
  let configuration: Configuration
  private var watcher: SignalWatcher?
  nonisolated var unownedExecutor: UnownedSerialExecutor { relay.loop.asUnownedSerialExecutor() }

  init(relay: Relay, configuration: Configuration) {
    self.relay = relay
    self.configuration = configuration
  }

  func start() {
    let logger = configuration.logger
    do {
      watcher = try SignalWatcher(loop: relay.loop, signals: [SIGHUP]) { [weak self] _ in
        self?.assumeIsolated { $0.reload() }
      }
    } catch {
      logger.error("cannot watch SIGHUP: token keys cannot be reloaded", metadata: ["error": "\(error)"])
    }
  }

  func stop() { watcher = nil }

  private func reload() {
    let logger = configuration.logger
    do throws(ConfigurationError) {
      guard let jwt = try configuration.jwtSettings() else { return }
      // On the loop (this actor's executor), where the authenticator's verifier lives.
      guard relay.server.authenticator.reload(jwt) else { return }
      logger.info(
        "token keys reloaded",
        metadata: ["kids": jwt.keys.keys.sorted().map { $0.isEmpty ? "(key_file)" : $0 }.joined(separator: ",")])
    } catch {
      logger.error(
        "token keys not reloaded: keeping the previous ones",
        metadata: ["problems": error.problems.joined(separator: "; ")])
    }
  }
}
