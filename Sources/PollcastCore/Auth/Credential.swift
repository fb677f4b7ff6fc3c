import Foundation

/// Where a subscriber's credential came from. The credential itself is never logged, counted by value or echoed.
public enum CredentialSource: String, Sendable {
  case header = "authorization"
  case cookie
  case query
}

/// Which bytes a credential may hold. A credential is a token: it goes into headers and URLs of the legacy API,
/// so anything else is refused where it is extracted, before any cache lookup or upstream call.
public enum CredentialCharset: String, Sendable, CaseIterable {
  /// RFC 6750's `b64token`: letters, digits, `-._~+/`, then `=` padding only.
  case b64token
  /// Any visible ASCII byte (0x21-0x7E), for legacy keys that need more; never a space or a control byte.
  case visible

  /// Longer credentials are refused too: no real key or token is this long, and each one is hashed and cached.
  public static let maxLength = 8192

  public func accepts(_ credential: String) -> Bool {
    let bytes = credential.utf8
    guard !bytes.isEmpty, bytes.count <= CredentialCharset.maxLength else { return false }
    switch self {
    case .visible:
      return bytes.allSatisfy { $0 >= 0x21 && $0 <= 0x7E }
    case .b64token:
      var padding = false
      for byte in bytes {
        if byte == 0x3D {  // "="
          padding = true
          continue
        }
        let alnum = (byte >= 0x30 && byte <= 0x39) || (byte | 0x20 >= 0x61 && byte | 0x20 <= 0x7A)
        let extra = byte == 0x2D || byte == 0x2E || byte == 0x5F || byte == 0x7E || byte == 0x2B || byte == 0x2F
        if padding || !(alnum || extra) { return false }
      }
      return bytes.first != 0x3D
    }
  }
}

/// What a request carries as its credential, checked against the charset.
public enum CredentialLookup: Sendable, Equatable {
  case missing
  case found(String, CredentialSource)
  /// Present, but not a token of the charset: a control byte, a space, a smuggled header. Never used.
  case malformed(CredentialSource)
}

/// Finds a subscriber's credential, in DESIGN's order: `Authorization: Bearer …`, then the cookie named
/// `cookieName`, then the `access_token` query parameter when `allowQuery` is set.
public enum CredentialExtractor {
  public static func extract(
    authorization: String?, cookie: String?, query: [(String, String)], cookieName: String, allowQuery: Bool
  ) -> (credential: String, source: CredentialSource)? {
    if let authorization {
      let trimmed = trimSpaces(Substring(authorization))
      if trimmed.utf8.count > 7, trimmed.utf8.prefix(7).map({ $0 | 0x20 }) == Array("bearer ".utf8) {
        let value = trimSpaces(trimmed.dropFirst(7))
        if !value.isEmpty { return (String(value), .header) }
      }
    }
    if let cookie, let value = cookieValue(cookie, name: cookieName), !value.isEmpty {
      return (value, .cookie)
    }
    if allowQuery, let value = query.first(where: { $0.0 == "access_token" })?.1, !value.isEmpty {
      return (value, .query)
    }
    return nil
  }

  /// The credential of a request, checked: the one place every source and every mode gets its credential.
  public static func lookup(
    authorization: String?, cookie: String?, query: [(String, String)], cookieName: String, allowQuery: Bool,
    charset: CredentialCharset
  ) -> CredentialLookup {
    guard
      let (credential, source) = extract(
        authorization: authorization, cookie: cookie, query: query, cookieName: cookieName, allowQuery: allowQuery)
    else { return .missing }
    return charset.accepts(credential) ? .found(credential, source) : .malformed(source)
  }

  /// `text` without leading and trailing spaces and tabs (Foundation's trimming cost ~10 % of a connect).
  static func trimSpaces(_ text: Substring) -> Substring {
    var result = text
    while let first = result.utf8.first, first == 0x20 || first == 0x09 { result = result.dropFirst() }
    while let last = result.utf8.last, last == 0x20 || last == 0x09 { result = result.dropLast() }
    return result
  }

  /// The value of cookie `name` in a `Cookie:` header (`a=1; b=2`), surrounding quotes removed and
  /// percent-encoding decoded.
  static func cookieValue(_ header: String, name: String) -> String? {
    for pair in header.split(separator: ";") {
      let parts = pair.split(separator: "=", maxSplits: 1)
      guard parts.count == 2, trimSpaces(parts[0]) == name else { continue }
      var value = trimSpaces(parts[1])
      if value.utf8.count >= 2, value.hasPrefix("\""), value.hasSuffix("\"") { value = value.dropFirst().dropLast() }
      // Pages store keys with encodeURIComponent (a cookie value cannot hold `;`, `,`, spaces…): decode that.
      if value.contains("%"), let decoded = String(value).removingPercentEncoding { return decoded }
      return String(value)
    }
    return nil
  }
}

/// An IP address or a CIDR block (`10.0.0.0/8`, `::1`, `fd00::/8`), for the trusted proxy list.
public struct AddressBlock: Sendable, Equatable {
  let bytes: [UInt8]
  let prefix: Int

  public init?(_ text: String) {
    let parts = text.split(separator: "/", maxSplits: 1)
    guard let first = parts.first, let bytes = AddressBlock.parse(String(first)) else { return nil }
    let width = bytes.count * 8
    if parts.count == 2 {
      guard let prefix = Int(parts[1]), (0...width).contains(prefix) else { return nil }
      self.prefix = prefix
    } else {
      prefix = width
    }
    self.bytes = bytes
  }

  /// The 4 or 16 bytes of an address; an IPv4-mapped IPv6 address (`::ffff:1.2.3.4`) counts as IPv4.
  static func parse(_ text: String) -> [UInt8]? {
    var v4 = in_addr()
    if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
    var v6 = in6_addr()
    guard inet_pton(AF_INET6, text, &v6) == 1 else { return nil }
    let bytes = withUnsafeBytes(of: &v6) { Array($0) }
    if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF { return Array(bytes[12...]) }
    return bytes
  }

  public func contains(_ address: String) -> Bool {
    guard let other = AddressBlock.parse(address), other.count == bytes.count else { return false }
    var remaining = prefix
    for index in 0..<bytes.count where remaining > 0 {
      let bits = min(8, remaining)
      let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - bits))
      if bytes[index] & mask != other[index] & mask { return false }
      remaining -= bits
    }
    return true
  }
}

/// Which address a request comes from: the peer, or, when the peer is a trusted proxy, the right-most address
/// in `X-Forwarded-For` that is not itself a trusted proxy. A header from anyone else is ignored, so a client
/// cannot pick its own address to dodge the per-address limits.
public struct ClientAddressResolver: Sendable {
  public let trusted: [AddressBlock]

  public init(trusted: [AddressBlock]) { self.trusted = trusted }

  public func isTrusted(_ address: String) -> Bool { trusted.contains { $0.contains(address) } }

  public func resolve(peer: String, forwardedFor: String?) -> String {
    guard !trusted.isEmpty, isTrusted(peer), let forwardedFor else { return peer }
    let hops = forwardedFor.split(separator: ",").map { String(CredentialExtractor.trimSpaces($0)) }
    for hop in hops.reversed() {
      guard AddressBlock.parse(hop) != nil else { return peer }  // garbage: believe nothing further left
      if !isTrusted(hop) { return hop }
    }
    return hops.first.flatMap { AddressBlock.parse($0) != nil ? $0 : nil } ?? peer
  }
}
