import Foundation

/// Cross-origin rules for browsers on other origins: an allowlist from configuration.
///
/// A matching `Origin` is echoed back with `Vary: Origin`. `*` is sent only when any origin is allowed and
/// credentials are not: configuration validation refuses `*` together with credentials.
public struct CORSPolicy: Sendable, Equatable {
  /// Exact origins (`scheme://host[:port]`), compared case-insensitively; `*` allows any.
  public var allowedOrigins: [String]
  public var allowCredentials: Bool
  /// Seconds a browser may cache a preflight answer.
  public var maxAge: Int

  /// Request headers a cross-origin page may send.
  public static let allowedRequestHeaders = ["Last-Event-ID", "Cache-Control", "Authorization"]
  public static let allowedMethods = ["GET", "HEAD", "OPTIONS"]
  /// Response headers a cross-origin page may read.
  public static let exposedHeaders = ["X-Pollcast-Head-Id"]

  public init(allowedOrigins: [String] = [], allowCredentials: Bool = false, maxAge: Int = 600) {
    self.allowedOrigins = allowedOrigins.map { $0.lowercased() }
    self.allowCredentials = allowCredentials
    self.maxAge = maxAge
  }

  private var allowsAny: Bool { allowedOrigins.contains("*") }

  /// Whether a request from `origin` may read responses.
  public func allows(origin: String) -> Bool {
    allowsAny || allowedOrigins.contains(origin.lowercased())
  }

  /// Headers to add to an ordinary response for a request carrying `origin` (empty when it has none or it is
  /// not allowed: the browser then refuses the response to the page, as it should).
  public func responseHeaders(origin: String?) -> [(String, String)] {
    guard let origin, allows(origin: origin) else { return [] }
    var headers: [(String, String)]
    if allowsAny && !allowCredentials {
      headers = [("Access-Control-Allow-Origin", "*")]
    } else {
      headers = [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]
    }
    if allowCredentials { headers.append(("Access-Control-Allow-Credentials", "true")) }
    headers.append(("Access-Control-Expose-Headers", CORSPolicy.exposedHeaders.joined(separator: ", ")))
    return headers
  }

  public enum Preflight: Equatable {
    /// Answer 204 with these headers.
    case allowed([Header])
    /// Answer 403 with this reason.
    case refused(String)

    public struct Header: Equatable {
      public var name: String
      public var value: String
    }
  }

  /// The answer to `OPTIONS` with `Origin`, `Access-Control-Request-Method` and `-Headers`.
  public func preflight(origin: String, requestMethod: String?, requestHeaders: String?) -> Preflight {
    guard allows(origin: origin) else { return .refused("origin \(origin) is not allowed") }
    if let requestMethod, !CORSPolicy.allowedMethods.contains(requestMethod.uppercased()) {
      return .refused("method \(requestMethod) is not allowed")
    }
    let allowedLower = Set(CORSPolicy.allowedRequestHeaders.map { $0.lowercased() })
    let asked = (requestHeaders ?? "").split(separator: ",").map {
      $0.trimmingCharacters(in: .whitespaces).lowercased()
    }.filter { !$0.isEmpty }
    if let bad = asked.first(where: { !allowedLower.contains($0) }) {
      return .refused("request header \(bad) is not allowed")
    }
    var headers = responseHeaders(origin: origin).map { Preflight.Header(name: $0.0, value: $0.1) }
    headers.append(
      .init(name: "Access-Control-Allow-Methods", value: CORSPolicy.allowedMethods.joined(separator: ", ")))
    headers.append(
      .init(name: "Access-Control-Allow-Headers", value: CORSPolicy.allowedRequestHeaders.joined(separator: ", ")))
    headers.append(.init(name: "Access-Control-Max-Age", value: String(maxAge)))
    if !headers.contains(where: { $0.name == "Vary" }) { headers.append(.init(name: "Vary", value: "Origin")) }
    return .allowed(headers)
  }
}

extension Substring {
  fileprivate func trimmingCharacters(in set: CharacterSet) -> String {
    String(self).trimmingCharacters(in: set)
  }
}
