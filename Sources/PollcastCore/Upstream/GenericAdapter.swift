import Foundation

/// Any single-stream long-poll API: a URL template with `{cursor}` (last id seen) and `{next}` (last id + 1),
/// an RFC 6901 pointer to the events array (or `""` with a non-array body: the whole body is one event), a
/// pointer to each event's id, and static headers. No session step.
public final class GenericAdapter: UpstreamAdapter, @unchecked Sendable {  // loop-confined
  public let name = "generic"
  public struct Settings: Sendable, Equatable {
    public var urlTemplate: String
    public var eventsPointer: String
    public var idPointer: String
    public var headers: [String]
    public var stream: String
    /// Client-side deadline of one poll.
    public var timeout: Double
    public var connectTimeout: Double
    /// The cursor of the first poll (events after it are relayed).
    public var initialCursor: UInt64

    public init(
      urlTemplate: String, eventsPointer: String = "", idPointer: String = "/id", headers: [String] = [],
      stream: String = "default", timeout: Double = 60, connectTimeout: Double = 5, initialCursor: UInt64 = 0
    ) {
      self.initialCursor = initialCursor
      self.urlTemplate = urlTemplate
      self.eventsPointer = eventsPointer
      self.idPointer = idPointer
      self.headers = headers
      self.stream = stream
      self.timeout = timeout
      self.connectTimeout = connectTimeout
    }
  }

  let settings: Settings
  /// Per-user relaying: the subscriber's credential, put in place of `{credential}` in the headers (as is) and
  /// the URL template (percent-encoded).
  let credential: String?

  public init(settings: Settings, credential: String? = nil) {
    self.settings = settings
    self.credential = credential
  }

  /// Whether the settings carry the subscriber's credential somewhere (per-user mode needs it).
  public static func usesCredential(_ settings: Settings) -> Bool {
    settings.urlTemplate.contains("{credential}") || settings.headers.contains { $0.contains("{credential}") }
  }

  public var canSync: Bool { false }
  public var hasSession: Bool { true }
  public func invalidateSession() {}

  public func prepare(_ client: UpstreamClient, isolation: isolated (any Actor)? = #isolation)
    async throws(UpstreamError) -> UpstreamPreparation
  {
    UpstreamPreparation(
      streams: [settings.stream], lastIDs: nil, initialCursors: [settings.stream: settings.initialCursor])
  }

  public func poll(
    _ client: UpstreamClient, cursors: [String: UInt64], tokens: [String: String] = [:],
    isolation: isolated (any Actor)? = #isolation
  ) async throws(UpstreamError) -> UpstreamPollAnswer {
    let values = credential.map { ["credential": $0] } ?? [:]
    let url = try OutgoingRequest.render(
      GenericAdapter.url(template: settings.urlTemplate, cursor: cursors[settings.stream] ?? 0), values, for: .url)
    var headers: [(String, String)] = []
    for line in settings.headers {
      let (name, value) = try OutgoingRequest.header(line: line).get()
      headers.append((name, try OutgoingRequest.render(value, values, for: .header)))
    }
    let response = try await client.send(
      UpstreamRequest(
        url: url, headers: headers, timeout: settings.timeout, connectTimeout: settings.connectTimeout, label: "poll"))
    if response.status == 204
      || (response.status == 200 && response.body.allSatisfy { $0 == 0x20 || $0 == 0x0A || $0 == 0x0D || $0 == 0x09 })
    {
      return UpstreamPollAnswer(batches: [(settings.stream, [])])
    }
    // Configured header values may be keys too (`Authorization: Bearer …`): none of them is echoed to the log.
    try response.requireOK(
      "poll", sessionOn401: false,
      scrubbing: headers.map(\.1).filter { $0.count >= 6 } + (credential.map { [$0] } ?? []))
    let settings = self.settings
    return try await response.decode("poll") { json, text throws(UpstreamError) in
      try GenericAdapter.parse(json, settings: settings, text: text)
    }
  }

  /// The poll URL: `{cursor}` is the last id seen, `{next}` the one after it (2^64-1 has none: `{next}` stays at
  /// 2^64-1 rather than wrapping to 0, which would ask for everything again).
  static func url(template: String, cursor: UInt64) -> String {
    let next = cursor == .max ? cursor : cursor + 1
    return template.replacingOccurrences(of: "{cursor}", with: String(cursor))
      .replacingOccurrences(of: "{next}", with: String(next))
  }

  static func parse(_ json: RawJSON, settings: Settings, text: RepairedText? = nil) throws(UpstreamError)
    -> UpstreamPollAnswer
  {
    guard let target = json.resolve(pointer: settings.eventsPointer) else {
      throw UpstreamError(.decoding, "events pointer \"\(settings.eventsPointer)\" names nothing in the answer")
    }
    let events: [RawJSON]
    switch target.value {
    case .array(let elements): events = elements
    case .null where !settings.eventsPointer.isEmpty: events = []
    default:
      guard settings.eventsPointer.isEmpty else {
        throw UpstreamError(.decoding, "events pointer \"\(settings.eventsPointer)\" does not name an array")
      }
      events = [target]
    }
    var answer = UpstreamPollAnswer(batches: [])
    var messages: [UpstreamMessage] = []
    for event in events {
      if let message = UpstreamMessage.checked(
        event, id: event.resolve(pointer: settings.idPointer), stream: settings.stream, text: text, into: &answer)
      {
        messages.append(message)
      }
    }
    answer.batches.append((settings.stream, messages.sorted { $0.id < $1.id }))
    return answer
  }
}
