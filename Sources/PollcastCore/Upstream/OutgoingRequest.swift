import Foundation

/// The one place an outgoing request's method, URL and headers are checked and built from templates.
///
/// libcurl sends a header value or URL as it is given: a CR or LF in one ends the header (or the request line)
/// and lets the value's owner write headers, or a whole second request, into the legacy API's connection. Every
/// request passes `check` in `UpstreamClient.send`, after the interceptors and right before the transport, so no
/// caller can skip it; `render` and `header` build values from templates and refuse the same bytes at the source.
public enum OutgoingRequest {
  /// Why a value cannot go on the wire, or nil when it can. `what` names the value in the message (never the
  /// value itself: it may be a secret).
  static func problem(inHeaderValue value: String, _ what: String) -> String? {
    for byte in value.utf8 where isControlInFieldValue(byte) {
      return "\(what) holds the control byte 0x\(String(byte, radix: 16, uppercase: true))"
    }
    return nil
  }

  /// RFC 9110 field-value: visible bytes, obs-text, spaces and tabs; no other control byte, no DEL.
  static func isControlInFieldValue(_ byte: UInt8) -> Bool { (byte < 0x20 && byte != 0x09) || byte == 0x7F }

  /// Whether `byte` is an RFC 9110 `tchar`: a digit, a letter or one of ``!#$%&'*+-.^_`|~``. A switch, not a
  /// `Set` of the extra bytes: this runs for the method and every header name of every request, and building the
  /// set each time hashed fifteen bytes into a fresh allocation.
  static func isTokenByte(_ byte: UInt8) -> Bool {
    switch byte {
    case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
      UInt8(ascii: "a")...UInt8(ascii: "z"):
      return true
    case UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"),
      UInt8(ascii: "'"), UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."),
      UInt8(ascii: "^"), UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
      return true
    default:
      return false
    }
  }

  /// A header name is an RFC 9110 token.
  static func problem(inHeaderName name: String) -> String? {
    if name.isEmpty { return "a header name is empty" }
    for byte in name.utf8 {
      if !isTokenByte(byte) {
        return
          "header name \"\(String(decoding: name.utf8.prefix(40).filter { $0 >= 0x20 && $0 < 0x7F }, as: UTF8.self))\" is not a token"
      }
    }
    return nil
  }

  /// A URL on the request line: no control byte, no space (curl would send it as is), nothing above ASCII.
  static func problem(inURL url: String) -> String? {
    for byte in url.utf8 where byte <= 0x20 || byte >= 0x7F {
      return "the URL holds the byte 0x\(String(byte, radix: 16, uppercase: true)) (it must be percent-encoded)"
    }
    return nil
  }

  /// Throws `.unsafeRequest` naming the first value that cannot go on the wire.
  public static func check(_ request: UpstreamRequest) throws(UpstreamError) {
    if let problem = problem(inHeaderName: request.method) {
      throw UpstreamError(.unsafeRequest, "\(request.label) request refused: method: \(problem)")
    }
    if let problem = problem(inURL: request.url) {
      throw UpstreamError(.unsafeRequest, "\(request.label) request refused: \(problem)")
    }
    for (name, value) in request.headers {
      if let problem = problem(inHeaderName: name) ?? problem(inHeaderValue: value, "the value of header \(name)") {
        throw UpstreamError(.unsafeRequest, "\(request.label) request refused: \(problem)")
      }
    }
  }

  /// How a placeholder's value is put into a template.
  public enum Placement: Sendable {
    /// Into a URL: percent-encoded (RFC 3986 unreserved bytes stay).
    case url
    /// Into a header value: as it is, refused when it holds a control byte.
    case header
  }

  /// `template` with each `{name}` of `values` replaced, encoded for `placement`; a value that cannot be placed
  /// throws `.unsafeRequest` naming the placeholder (never the value).
  public static func render(_ template: String, _ values: [String: String], for placement: Placement)
    throws(UpstreamError) -> String
  {
    var text = template
    for (name, value) in values where text.contains("{\(name)}") {
      let placed: String
      switch placement {
      case .url:
        placed = encodeQueryValue(value)
      case .header:
        if let problem = problem(inHeaderValue: value, "the value of {\(name)}") {
          throw UpstreamError(.unsafeRequest, "request refused: \(problem)")
        }
        placed = value
      }
      text = text.replacingEvery("{\(name)}", with: placed)
    }
    return text
  }

  /// A configured header line `Name: value` split and checked; the problem is returned for validation at load.
  public static func header(line: String) -> Result<(name: String, value: String), UpstreamError> {
    guard let colon = line.firstIndex(of: ":") else {
      return .failure(UpstreamError(.unsafeRequest, "header \"\(line.prefix(40))\" has no colon"))
    }
    let name = String(line[..<colon]).trimmingCharacters(in: .whitespaces)
    let value = String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
    if let problem = problem(inHeaderName: name) ?? problem(inHeaderValue: value, "the value of header \(name)") {
      return .failure(UpstreamError(.unsafeRequest, problem))
    }
    return .success((name, value))
  }
}
