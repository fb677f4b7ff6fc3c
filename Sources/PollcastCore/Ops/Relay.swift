import Foundation

/// The assembled relay: the event loop, the feed, the SSE server and the upstream worker, started and stopped
/// in the right order.
public final class Relay: Sendable {
  public let loop: EventLoop
  public let feed: Feed
  public let server: SSEServer
  public let worker: UpstreamWorker?
  /// Who polls the shared feed: this node (`LocalOwner`), or the lease holder among the nodes of a shared store.
  public let owner: any FeedOwner
  /// A shared store's lease owner (tests read its statistics).
  public var replica: FeedReplica? { owner as? FeedReplica }
  /// `auth.mode = upstream`: one feed and loop per account (the shared feed then stays empty).
  public var hub: AccountHub? { server.feeds.accounts }
  /// `host:port` the server listens on.
  public let address: String
  public let logger: Logger
  public let lagProbe: LoopLagProbe
  /// Window over which `shutdown()` spreads the end of the streams.
  public let shutdownSpread: Double

  /// What the upstream side needs.
  public struct Upstream: Sendable {
    public var adapter: UpstreamAdapter
    public var settings: UpstreamWorker.Settings
    public var apiKey: String
    public var maxBodyBytes: Int
    /// Seed for the backoff's jitter (tests); nil draws one.
    public var seed: UInt64?

    public init(
      adapter: UpstreamAdapter, settings: UpstreamWorker.Settings = .init(), apiKey: String = "",
      maxBodyBytes: Int = 16 << 20, seed: UInt64? = nil
    ) {
      self.adapter = adapter
      self.settings = settings
      self.apiKey = apiKey
      self.maxBodyBytes = maxBodyBytes
      self.seed = seed
    }
  }

  private init(
    loop: EventLoop, feed: Feed, server: SSEServer, worker: UpstreamWorker?, owner: any FeedOwner, address: String,
    logger: Logger, lagProbe: LoopLagProbe, shutdownSpread: Double
  ) {
    self.owner = owner
    self.lagProbe = lagProbe
    self.shutdownSpread = shutdownSpread
    self.loop = loop
    self.feed = feed
    self.server = server
    self.worker = worker
    self.address = address
    self.logger = logger
  }

  /// Starts a loop thread, the feed, the server and (when given) the upstream worker.
  ///
  /// With a durable `store`, the shared feed is rebuilt from it first (ring, ids above its head) and the worker
  /// polls on from the stored cursors; the server listens only once that is done.
  public static func start(
    server serverSettings: ServerSettings, feed feedSettings: FeedSettings, logger: Logger,
    ids: EventIDAllocator = EventIDAllocator(), store: EventStore = MemoryEventStore(), upstream: Upstream? = nil,
    accounts: (upstream: AccountHub.Upstream, settings: AccountHub.Settings)? = nil, shutdownSpread: Double = 0,
    leaseSeconds: Double = 5
  ) async throws -> Relay {
    let restored = try store.load(feed: "shared")
    var ids = ids
    if store.sharedAcrossNodes {
      // A node of a cluster shows what the stream holds and follows on from its head; ids of its own come only
      // once it leads the feed (`Feed.lead`), above the stored head.
      ids = EventIDAllocator(startMicroseconds: 0, persistedAtLeast: restored?.headID ?? 0)
    } else if let restored, ids.head < restored.headID {
      // Above the stored head even when the clock went backwards: ids are never reused.
      ids = EventIDAllocator(startMicroseconds: ids.head + 1, persistedAtLeast: restored.headID)
    }
    if let restored {
      logger.info(
        "store loaded",
        metadata: [
          "kind": store.kind, "events": String(restored.events.count), "head_id": String(restored.headID),
          "next_id": String(ids.head + 1),
          "cursors": restored.position.map { position in
            position.streams.map { "\($0)=\(position.cursors[$0] ?? 0)" }.joined(separator: ",")
          } ?? "",
        ])
    }
    let loop = try EventLoop()
    loop.start()
    let lagProbe = await loop.submit { LoopLagProbe(loop: loop, interval: serverSettings.loopProbeInterval) }
    await loop.submit { store.attach(to: loop) }
    let feed = Feed(loop: loop, settings: feedSettings, ids: ids, store: store, restored: restored)
    await feed.start()
    var worker: UpstreamWorker?
    if let upstream {
      worker = try await makeWorker(loop: loop, feed: feed, upstream: upstream, logger: logger)
      if !store.sharedAcrossNodes, let restored, let position = restored.position {
        await worker?.restore(position, events: restored.events)
      }
    }
    let owner = store.owner(
      of: feed, worker: worker, leaseSeconds: leaseSeconds, logger: logger, restored: restored)
    var hub: AccountHub?
    if let accounts {
      // One store for every feed: the accounts' feeds are kept beside the shared one.
      var hubUpstream = accounts.upstream
      hubUpstream.store = store
      hubUpstream.leaseSeconds = leaseSeconds
      // Accounts without a user id are named by a keyed hash of their key, the secret kept in the store.
      hubUpstream.accountKeys = try AccountKeys(store: store)
      hub = try await loop.submit { [hubUpstream] () throws(UpstreamError) -> AccountHub in
        try AccountHub(loop: loop, upstream: hubUpstream, settings: accounts.settings, logger: logger)
      }
      await hub?.start()
    }
    let authenticator: any Authenticator =
      if let hub {
        AccountAuthenticator(hub: hub, access: serverSettings.access)
      } else if let jwt = serverSettings.access.jwt { TokenAuthenticator(jwt, access: serverSettings.access) } else {
        OpenAccess()
      }
    let server = SSEServer(
      loop: loop, feeds: FeedHub(shared: feed, accounts: hub), authenticator: authenticator,
      settings: serverSettings, logger: logger)
    let page = LivePage.render(access: serverSettings.access)
    await server.addRoute("/", .init { (200, "text/html; charset=utf-8", page) })
    await server.addRoute("/healthz", .init { (200, "application/json", "{\"status\":\"ok\"}\n") })
    await server.addRoute(
      "/readyz",
      .init { [owner, hub] in
        var (ready, reason) = owner.readinessOnLoop()
        if let hub { (ready, reason) = hub.assumeIsolated { $0.readiness() } }
        let body = JSONText.object(["ready": ready ? "true" : "false", "reason": JSONText.quoted(reason)]) + "\n"
        return (ready ? 200 : 503, "application/json", body)
      })
    // Renders on the loop, with the accounts' figures summed beforehand (per-user relaying) or none.
    let renderMetrics: @Sendable (AccountHub.Statistics?) -> SSEServer.Route.Answer = {
      [feed, worker, lagProbe, owner, loop, weak server] accounts in
      let stats = feed.assumeIsolated { $0.statistics() }
      var store = feed.store.statistics()
      owner.describeOnLoop(&store)
      let upstream = worker?.assumeIsolated { $0.snapshot() }
      // Per-user relaying on a shared store: the lease counters are the accounts' (and the shared feed's).
      if let replication = accounts?.replication {
        store.replication = store.replication ?? FeedReplica.Statistics()
        store.replication?.absorb(replication)
      }
      let protection = server?.assumeIsolated { $0.protectionCounters }
      return (
        200, "text/plain; version=0.0.4; charset=utf-8",
        Metrics.render(
          stats, upstream: upstream, loopLag: (lagProbe.lastLag, lagProbe.maxLag, lagProbe.lateness),
          protection: protection,
          accounts: accounts, store: store, jobPasses: (loop.longestJobPass, loop.slowJobPasses, loop.cutJobPasses))
      )
    }
    if let hub {
      // The accounts' figures are running totals; only a store shared across nodes has its lease owners' figures
      // summed, in turns (`sharedStatisticsInTurns`), so a scrape does not stall every stream.
      await server.addRoute(
        "/metrics",
        .init(asyncHandler: { [loop] in
          let accounts = await hub.sharedStatisticsInTurns()
          return await loop.submit { renderMetrics(accounts) }
        }))
    } else {
      await server.addRoute("/metrics", .init { renderMetrics(nil) })
    }
    let address: String
    do {
      address = try await server.start()
    } catch {
      await owner.stop()
      store.close()
      loop.stop()
      throw error
    }
    await owner.start()
    return Relay(
      loop: loop, feed: feed, server: server, worker: worker, owner: owner, address: address, logger: logger,
      lagProbe: lagProbe, shutdownSpread: shutdownSpread)
  }

  private static func makeWorker(loop: EventLoop, feed: Feed, upstream: Upstream, logger: Logger) async throws
    -> UpstreamWorker
  {
    let transport = try await loop.submit { () throws(UpstreamError) -> CurlTransport in
      let transport = try CurlTransport(loop: loop)
      transport.maxBodyBytes = upstream.maxBodyBytes
      return transport
    }
    let client = UpstreamClient(
      transport: transport,
      interceptors: [AuthInterceptor(apiKey: upstream.apiKey), LoggingInterceptor(logger: logger)])
    return UpstreamWorker(
      loop: loop, feed: feed, client: client, adapter: upstream.adapter, settings: upstream.settings, logger: logger,
      random: SeededRandom(seed: upstream.seed ?? UInt64.random(in: 0...UInt64.max)))
  }

  public static func start(configuration: Configuration) async throws -> Relay {
    let perUser = configuration.authMode == .upstream && configuration.hasUpstream
    let accounts =
      perUser
      ? (
        upstream: AccountHub.Upstream(
          makeAdapter: { configuration.makeAdapter(credential: $0) }, worker: configuration.workerSettings,
          feed: configuration.feedSettings, maxBodyBytes: configuration.upstream.maxBodyBytes),
        settings: configuration.accountSettings
      ) : nil
    let upstream =
      configuration.hasUpstream && !perUser
      ? Upstream(
        adapter: configuration.makeAdapter(), settings: configuration.workerSettings,
        apiKey: configuration.upstream.apiKey, maxBodyBytes: configuration.upstream.maxBodyBytes) : nil
    var server = configuration.serverSettings
    server.access.jwt = try configuration.jwtSettings()
    let store = try configuration.openStore(logger: configuration.logger)
    do {
      return try await start(
        server: server, feed: configuration.feedSettings, logger: configuration.logger, store: store,
        upstream: upstream, accounts: accounts, shutdownSpread: configuration.server.shutdownSpreadSeconds,
        leaseSeconds: configuration.store.leaseSeconds)
    } catch {
      store.close()
      throw error
    }
  }

  /// The port the server listens on.
  public var port: Int { Int(address.split(separator: ":").last!)! }

  /// Stops the upstream worker, stops accepting, ends every stream, stops the loop. Idempotent.
  public func shutdown(deadline: Double = 5) async {
    await owner.stop()
    if feed.store.sharedAcrossNodes {
      // The lease goes at once (another node takes over while this one ends its streams), and the store's
      // connections close while the loop that drives them still runs.
      feed.store.close()
    }
    await server.shutdown(deadline: max(deadline, shutdownSpread + 1), spread: shutdownSpread)
    await loop.submit { [lagProbe] in lagProbe.stop() }
    loop.stop()
    // Every commit given before the worker stopped is waited for; the WAL is folded into the file.
    if !feed.store.sharedAcrossNodes { feed.store.close() }
  }
}
