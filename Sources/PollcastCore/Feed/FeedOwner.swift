/// Who polls a feed's upstream. Every feed has one, whatever the mode and the store:
///
/// - `LocalOwner`: this node runs the feed's worker (a store that is not shared across nodes).
/// - `FeedReplica`, the lease owner: whichever node holds the feed's lease polls, the others follow what it
///   stores (a store shared across nodes makes it: `EventStore.owner(of:worker:leaseSeconds:logger:restored:)`).
///
/// The relay starts, stops and asks every owner the same way, and never asks which kind it has.
public protocol FeedOwner: AnyObject, Sendable {
  /// Starts polling (or following), after the server listens.
  func start() async
  /// Stops polling and following (shutdown).
  func stop() async
  /// On the loop: polls with `worker` from now on, starting again after a stop (an account's loop starts again
  /// here, with the key of the subscriber who came).
  nonisolated func resumeOnLoop(worker: UpstreamWorker?)
  /// On the loop: stops, as `stop()` (an account's grace ended here; a lease is given up at once).
  nonisolated func stopOnLoop()
  /// `/readyz`, on the loop.
  nonisolated func readinessOnLoop() -> (ready: Bool, reason: String)
  /// `/metrics`, on the loop: a lease owner's counters and role (nil: this node polls, no lease).
  nonisolated func replicationOnLoop() -> (statistics: FeedReplica.Statistics, role: FeedReplica.Role)?
}

extension FeedOwner {
  /// `/metrics`, on the loop: what the owner adds to the store's figures (role, replication).
  public func describeOnLoop(_ statistics: inout StoreStatistics) {
    guard let (replication, role) = replicationOnLoop() else { return }
    statistics.replication = replication
    statistics.role = role.rawValue
  }
}

/// This node polls the feed's upstream with `worker` (nil: no upstream configured).
public final class LocalOwner: FeedOwner, @unchecked Sendable {  // `worker` changes on the loop only
  public private(set) var worker: UpstreamWorker?

  public init(worker: UpstreamWorker?) { self.worker = worker }

  public func start() async { await worker?.start() }
  public func stop() async { await worker?.stop() }

  public func resumeOnLoop(worker: UpstreamWorker?) {
    self.worker?.assumeIsolated { $0.stop() }
    self.worker = worker
    worker?.assumeIsolated { $0.start() }
  }

  public func stopOnLoop() { worker?.assumeIsolated { $0.stop() } }

  public func readinessOnLoop() -> (ready: Bool, reason: String) {
    worker?.assumeIsolated { $0.readiness() } ?? (true, "no upstream configured")
  }

  public func replicationOnLoop() -> (statistics: FeedReplica.Statistics, role: FeedReplica.Role)? { nil }
}

extension FeedReplica: FeedOwner {
  public nonisolated func resumeOnLoop(worker: UpstreamWorker?) { assumeIsolated { $0.resume(worker: worker) } }
  public nonisolated func stopOnLoop() { assumeIsolated { $0.stop() } }

  public nonisolated func readinessOnLoop() -> (ready: Bool, reason: String) {
    assumeIsolated { $0.readiness() }
  }

  public nonisolated func replicationOnLoop() -> (statistics: FeedReplica.Statistics, role: FeedReplica.Role)? {
    assumeIsolated { ($0.statistics, $0.role) }
  }
}
