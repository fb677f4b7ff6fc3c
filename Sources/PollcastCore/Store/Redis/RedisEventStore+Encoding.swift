import CHiredis
import Foundation

/// How commits, positions and stream entries are written to and read from Redis, checked on the way in.
extension RedisEventStore {
  func commitArguments(_ batch: StoreBatch, token: String) -> [[UInt8]] {
    var arguments: [[UInt8]] = [
      Array("EVAL".utf8), Array(RedisEventStore.commitScript.utf8), Array("3".utf8),
      Array(key(batch.feed, "lease").utf8), Array(key(batch.feed, "events").utf8), Array(key(batch.feed, "meta").utf8),
      Array(token.utf8), Array(String(batch.headID).utf8), Array(String(batch.floorID).utf8),
      Array((batch.position.map(RedisEventStore.encodePosition) ?? "").utf8),
      Array(String(batch.forgetStreams.count).utf8), Array((source ?? "").utf8),
      // "" leaves the ranges as they are; "-" stores none.
      Array((batch.unissued.map { $0.isEmpty ? "-" : UnissuedRanges.encode($0) } ?? "").utf8),
    ]
    arguments.reserveCapacity(arguments.count + batch.forgetStreams.count + batch.events.count * 6)
    for stream in batch.forgetStreams { arguments.append(Array(stream.utf8)) }
    for event in batch.events {
      arguments.append(Array(String(event.id).utf8))
      arguments.append(Array((event.stream ?? "").utf8))
      arguments.append(Array((event.upstreamID.map { String($0) } ?? "").utf8))
      arguments.append(Array(String(event.unixTime).utf8))
      arguments.append(Array((event.type ?? "").utf8))
      arguments.append(event.bytes.bytes)
    }
    return arguments
  }

  static func arguments(_ strings: [String]) -> [[UInt8]] { strings.map { Array($0.utf8) } }

  static func encodePosition(_ position: FeedPosition) -> String {
    let cursors = position.streams.map {
      "\(JSONText.quoted($0)):\(JSONText.quoted(String(position.cursors[$0] ?? 0)))"
    }
    let tokens = position.streams.compactMap { stream in
      position.tokens[stream].map { "\(JSONText.quoted(stream)):\(JSONText.quoted($0))" }
    }
    return "{\"streams\":[\(position.streams.map(JSONText.quoted).joined(separator: ","))],\"cursors\":{"
      + cursors.joined(separator: ",") + "}" + (tokens.isEmpty ? "" : ",\"tokens\":{\(tokens.joined(separator: ","))}")
      + "}"
  }

  static func decodePosition(_ text: String) -> FeedPosition? {
    guard let json = try? RawJSON.parse(text), case .array(let streams)? = json["streams"]?.value,
      let cursors = json["cursors"]
    else { return nil }
    var names: [String] = []
    var values: [String: UInt64] = [:]
    var tokens: [String: String] = [:]
    for stream in streams {
      guard let name = stream.stringValue else { return nil }
      names.append(name)
      guard let cursor = cursors[name]?.stringValue.flatMap({ UInt64($0) }) else { return nil }
      values[name] = cursor
      if let token = json["tokens"]?[name] {
        guard let text = token.stringValue else { return nil }
        tokens[name] = text
      }
    }
    return FeedPosition(streams: names, cursors: values, tokens: tokens)
  }

  /// Stream entries (`[[id, [field, value, …]], …]`) as events, checked: ids ascending, each entry's bytes
  /// one whole frame naming its own id. Any entry that fails is damage (the load at start refuses the store).
  func parseEntries(_ reply: RedisReply) throws(StoreError) -> [StoredEvent] {
    let chunk = try parseEntries(reply, skipping: false)
    return chunk.events
  }

  func parseEntries(_ reply: RedisReply, skipping: Bool) throws(StoreError) -> StoreChunk {
    guard let entries = reply.elements else { throw unexpected(reply) }
    var chunk = StoreChunk()
    chunk.events.reserveCapacity(entries.count)
    for entry in entries {
      let name = entry.elements?.first?.text ?? "?"
      let id = name.split(separator: "-").first.flatMap { UInt64($0) }
      if let id { chunk.highest = max(chunk.highest ?? 0, id) }
      guard let event = Self.event(entry), chunk.events.last.map({ event.id > $0.id }) ?? true else {
        guard skipping else {
          throw StoreError(.corrupt, path: address.description, "stream entry \(name) is not a Pollcast event")
        }
        chunk.skipped.append(name)
        continue
      }
      chunk.events.append(event)
    }
    if !chunk.skipped.isEmpty { stats.withLock { $0.foreignEntries = ($0.foreignEntries ?? 0) + chunk.skipped.count } }
    return chunk
  }

  /// One entry as an event, or nil when it is not one a relay wrote (its id, its frame).
  static func event(_ entry: RedisReply) -> StoredEvent? {
    guard let parts = entry.elements, parts.count == 2, let name = parts[0].text,
      name.hasSuffix("-0"), let id = UInt64(name.dropLast(2)), let fields = parts[1].elements
    else { return nil }
    var bytes: [UInt8]?
    var event = StoredEvent(id: id, stream: nil, upstreamID: nil, unixTime: 0, bytes: ByteSlice([]))
    var index = 0
    while index + 1 < fields.count {
      let value = fields[index + 1]
      switch fields[index].text {
      case "d": if case .string(let data) = value { bytes = data }
      case "t": event.unixTime = value.text.flatMap { Double($0) } ?? 0
      case "s": event.stream = value.text
      case "u": event.upstreamID = value.text.flatMap { UInt64($0) }
      case "k": event.type = value.text
      default: break
      }
      index += 2
    }
    guard let bytes, StoredEvent.isFrame(id: id, bytes) else { return nil }
    event.bytes = ByteSlice(bytes)
    return event
  }

  func unexpected(_ reply: RedisReply) -> StoreError {
    if case .error(let message) = reply { return address.unavailable(message) }
    return StoreError(.corrupt, path: address.description, "unexpected reply \(String(describing: reply).prefix(200))")
  }
}
