/// How a built request reaches the upstream: one protocol in front of every HTTP client the relay has. It sends a
/// request and gives back the answer (any status) or a typed error (`UpstreamError`); it never reads what an answer
/// means. Adapters depend on this alone: the relay's `UpstreamClient` (libcurl, and the kept connection for plain
/// `http`, behind the interceptors) in production, a scripted one in unit tests.
public protocol UpstreamTransport: AnyObject, Sendable {
  /// The largest body an answer may have (`upstream.max_body_bytes`); a longer one is a typed error.
  var maxBodyBytes: Int { get }
  /// Sends `held.request`; returns with `held.outcome` set. Cancelling the calling task cancels the request.
  func send(held: HeldRequest, isolation: isolated (any Actor)?) async
}

extension UpstreamTransport {
  /// Sends `request`: any status comes back as a response; only transport problems throw.
  public func send(_ request: UpstreamRequest, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamResponse
  {
    // One body for both: a poll's plan holds its request (`send(held:)`); any other request is held here, at the
    // cost of one small object per session or fetch request.
    let held = HeldRequest(request)
    await send(held: held, isolation: isolation)
    return try held.response()
  }
}

/// A request held by an object, for `UpstreamTransport.send(held:)` (a poll's plan is one).
public class HeldRequest: @unchecked Sendable {  // loop-confined
  public let request: UpstreamRequest
  /// What `send(held:)` got back; set when it returns.
  public internal(set) var outcome: Result<UpstreamResponse, UpstreamError>?

  public init(_ request: UpstreamRequest) { self.request = request }

  /// The response `send(held:)` got, or the error it met.
  public func response() throws(UpstreamError) -> UpstreamResponse {
    guard let outcome else { throw UpstreamError(.transport, "the request was not sent") }
    return try outcome.get()
  }
}
