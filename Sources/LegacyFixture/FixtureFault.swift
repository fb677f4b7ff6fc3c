import PollcastCore

/// A fault the fixture applies to one following poll (queued through `POST /_control/faults`).
public enum FixtureFault: Equatable, Sendable {
  /// Answer at once with this HTTP status.
  case status(Int)
  /// Send the status line, headers and part of the answer, then reset the connection.
  case resetMidBody
  /// Answer 200 with a body that is not JSON.
  case malformedJSON
  /// Hold the answer this many milliseconds longer.
  case delay(milliseconds: Int)
  /// Re-send messages the caller already has along with the new ones.
  case duplicate
  /// Never answer.
  case hang

  /// Parses `{"kind":"status","code":503}` and the other kinds.
  public init(json: RawJSON) throws(FixtureError) {
    guard let kind = json["kind"]?.stringValue else { throw FixtureError("a fault needs a \"kind\"") }
    switch kind {
    case "status":
      guard let code = json["code"]?.unsignedID, (100...599).contains(code) else {
        throw FixtureError("a status fault needs a \"code\" between 100 and 599")
      }
      self = .status(Int(code))
    case "reset_mid_body": self = .resetMidBody
    case "malformed_json": self = .malformedJSON
    case "delay":
      guard let ms = json["ms"]?.unsignedID, ms <= 600_000 else {
        throw FixtureError("a delay fault needs \"ms\" (0 to 600000)")
      }
      self = .delay(milliseconds: Int(ms))
    case "duplicate": self = .duplicate
    case "hang": self = .hang
    default:
      throw FixtureError(
        "unknown fault kind \"\(kind)\" (status, reset_mid_body, malformed_json, delay, duplicate, hang)")
    }
  }
}

/// A bad control request or start-up problem of the fixture.
public struct FixtureError: Error, CustomStringConvertible, Sendable {
  public var description: String
  public init(_ description: String) { self.description = description }
}
