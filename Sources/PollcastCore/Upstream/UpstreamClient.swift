import Foundation

/// Something that sees every upstream request before it goes out and after it completes (seed 002's
/// interceptors): authentication, logging, metrics.
public protocol UpstreamInterceptor: Sendable {
  func prepare(_ request: inout UpstreamRequest)
  func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>)
}

extension UpstreamInterceptor {
  public func prepare(_ request: inout UpstreamRequest) {}
  public func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>) {}
}

/// Adds `Authorization: Bearer <api key>` to requests that ask for it.
public struct AuthInterceptor: UpstreamInterceptor {
  let apiKey: String
  public init(apiKey: String) { self.apiKey = apiKey }

  public func prepare(_ request: inout UpstreamRequest) {
    guard request.authentication == .apiKey, !apiKey.isEmpty else { return }
    request.headers.append(("Authorization", "Bearer \(apiKey)"))
  }
}

/// Logs each request and its outcome with tokens and keys redacted from the URL; headers are never logged.
public struct LoggingInterceptor: UpstreamInterceptor {
  let logger: Logger
  public init(logger: Logger) { self.logger = logger }

  public func prepare(_ request: inout UpstreamRequest) {
    logger.trace(
      "upstream request",
      metadata: ["upstream.call": request.label, "url": redactURL(request.url), "method": request.method])
  }

  public func completed(_ request: UpstreamRequest, outcome: Result<UpstreamResponse, UpstreamError>) {
    switch outcome {
    case .success(let response):
      logger.debug(
        "upstream response",
        metadata: [
          "upstream.call": request.label, "upstream.status": String(response.status),
          "duration_ms": String(Int(response.duration * 1000)),
        ])
    case .failure(let error) where error.kind == .cancelled:
      break
    case .failure(let error):
      logger.debug(
        "upstream request failed",
        metadata: ["upstream.call": request.label, "url": redactURL(request.url), "error": error.description])
    }
  }
}

/// Query parameters whose values are secrets.
let secretParameters: Set<String> = ["token", "access_token", "key", "api_key", "apikey", "secret", "password", "auth"]

/// `url` with the values of secret query parameters replaced by `[redacted]`.
public func redactURL(_ url: String) -> String {
  guard let question = url.firstIndex(of: "?") else { return url }
  let query = url[url.index(after: question)...]
  let redacted = query.split(separator: "&", omittingEmptySubsequences: false).map { pair -> String in
    guard let equals = pair.firstIndex(of: "=") else { return String(pair) }
    let name = pair[..<equals].lowercased()
    return secretParameters.contains(name) ? "\(pair[..<equals])=[redacted]" : String(pair)
  }
  return String(url[...question]) + redacted.joined(separator: "&")
}

/// Percent-encodes a query parameter value.
public func encodeQueryValue(_ value: String) -> String {
  var allowed = CharacterSet.alphanumerics
  allowed.insert(charactersIn: "-._~")
  return value.addingPercentEncoding(withAllowedCharacters: allowed) ?? value
}

/// The transport with its interceptor chain: what adapters call.
public final class UpstreamClient: @unchecked Sendable {  // loop-confined, like its transport
  public let transport: CurlTransport
  public let interceptors: [UpstreamInterceptor]

  public init(transport: CurlTransport, interceptors: [UpstreamInterceptor]) {
    self.transport = transport
    self.interceptors = interceptors
  }

  /// Sends `request` through the interceptors. Any status comes back as a response; only transport problems
  /// throw.
  public func send(_ request: UpstreamRequest, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError)
    -> UpstreamResponse
  {
    var prepared = request
    for interceptor in interceptors { interceptor.prepare(&prepared) }
    let outcome: Result<UpstreamResponse, UpstreamError>
    do {
      outcome = .success(try await transport.perform(prepared))
    } catch {
      outcome = .failure(error)
    }
    for interceptor in interceptors.reversed() { interceptor.completed(prepared, outcome: outcome) }
    return try outcome.get()
  }
}
