import Foundation

/// The `pollcast` program: parse → build → run → exit code.
public enum PollcastCommand {
  public static let exitUsage: Int32 = 64
  public static let exitConfig: Int32 = 78
  public static let exitUnavailable: Int32 = 69

  public static func run(arguments: [String], environment: [String: String]) async -> Int32 {
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
    var fileText: String?
    let configPath = options.configPath ?? environment["POLLCAST_CONFIG"]
    if let configPath {
      guard let data = FileManager.default.contents(atPath: configPath) else {
        printError("Error: cannot read configuration file \(configPath)\n")
        return exitConfig
      }
      fileText = String(decoding: data, as: UTF8.self)
    }
    let configuration: Configuration
    do {
      configuration = try ConfigurationLoader().load(
        fileText: fileText, fileName: configPath ?? "config", environment: environment,
        overrides: options.overrides.map { ($0.key, $0.value) })
    } catch {
      printError("Error: invalid configuration:\n" + error.problems.map { "  - \($0)" }.joined(separator: "\n") + "\n")
      return exitConfig
    }
    if options.printConfig {
      let encoder = JSONEncoder()
      encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
      print(String(decoding: (try? encoder.encode(configuration)) ?? Data(), as: UTF8.self))
      return 0
    }
    let logger = configuration.logger
    let relay: Relay
    do {
      relay = try await Relay.start(configuration: configuration)
    } catch {
      logger.error("cannot start", metadata: ["error": "\(error)"])
      return exitUnavailable
    }
    print("listening on \(relay.address)")
    fflush(nil)
    logger.info("listening", metadata: ["address": relay.address, "version": PollcastVersion.current])
    var demo: DemoSource?
    if options.demo {
      let source = DemoSource(feed: relay.feed)
      await source.start()
      demo = source
      logger.info("demo source started: open http://\(relay.address)/events")
    }
    let signal = await SignalWaiter.wait(loop: relay.loop, signals: [SIGTERM, SIGINT])
    logger.info("shutting down", metadata: ["signal": "\(signal)"])
    await demo?.stop()
    await relay.shutdown(deadline: 5)
    logger.info("stopped")
    return 0
  }

  static func printError(_ text: String) {
    FileHandle.standardError.write(Data(text.utf8))
  }
}

/// Waits on the loop for the first of `signals`.
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
      watcher = SignalWatcher(loop: loop, signals: signals) { [self] signum in
        self.assumeIsolated { holder in
          holder.watcher = nil
        }
        pending?.resume(returning: signum)
        pending = nil
      }
    }
  }
}
