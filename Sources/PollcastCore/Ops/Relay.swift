import Foundation

/// The assembled relay: the event loop, the feed and the SSE server, started and stopped in the right order.
public final class Relay: Sendable {
  public let loop: EventLoop
  public let feed: Feed
  public let server: SSEServer
  /// `host:port` the server listens on.
  public let address: String
  public let logger: Logger

  private init(loop: EventLoop, feed: Feed, server: SSEServer, address: String, logger: Logger) {
    self.loop = loop
    self.feed = feed
    self.server = server
    self.address = address
    self.logger = logger
  }

  /// Starts a loop thread, the feed and the server. Throws if the address cannot be bound.
  public static func start(
    server serverSettings: ServerSettings, feed feedSettings: FeedSettings, logger: Logger,
    ids: EventIDAllocator = EventIDAllocator()
  ) async throws -> Relay {
    let loop = try EventLoop()
    loop.start()
    let feed = Feed(loop: loop, settings: feedSettings, ids: ids)
    await feed.start()
    let server = SSEServer(loop: loop, feed: feed, settings: serverSettings, logger: logger)
    await server.addRoute("/healthz", .init { (200, "application/json", "{\"status\":\"ok\"}\n") })
    await server.addRoute(
      "/metrics",
      .init { [feed] in
        let stats = feed.assumeIsolated { $0.statistics() }
        return (200, "text/plain; version=0.0.4; charset=utf-8", Metrics.render(stats))
      })
    let address: String
    do {
      address = try await server.start()
    } catch {
      loop.stop()
      throw error
    }
    return Relay(loop: loop, feed: feed, server: server, address: address, logger: logger)
  }

  public static func start(configuration: Configuration) async throws -> Relay {
    try await start(
      server: configuration.serverSettings, feed: configuration.feedSettings, logger: configuration.logger)
  }

  /// The port the server listens on.
  public var port: Int { Int(address.split(separator: ":").last!)! }

  /// Stops accepting, ends every stream, stops the loop. Idempotent.
  public func shutdown(deadline: Double = 5) async {
    await server.shutdown(deadline: deadline)
    loop.stop()
  }
}
