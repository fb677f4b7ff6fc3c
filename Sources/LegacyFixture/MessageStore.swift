import Foundation
import PollcastCore

/// The fixture's messages: per user, ids strictly increasing from 1, each message's JSON encoded once.
struct MessageStore {
  struct Message {
    let id: UInt64
    let json: String
  }

  private(set) var messages: [String: [Message]] = [:]

  func lastID(_ user: String) -> UInt64 { messages[user]?.last?.id ?? 0 }

  mutating func append(user: String, text: String, from: String, chatID: String) -> UInt64 {
    let id = lastID(user) + 1
    let json = JSONText.object([
      "id": String(id), "chat_id": JSONText.quoted(chatID), "from": JSONText.quoted(from),
      "text": JSONText.quoted(text), "sent_at": JSONText.quoted(utcTimestamp()),
    ])
    messages[user, default: []].append(Message(id: id, json: json))
    return id
  }

  /// Appends a message whose JSON is made by `body(id)` (poison messages for the relay's tests).
  mutating func append(user: String, body: (UInt64) -> String) -> UInt64 {
    let id = lastID(user) + 1
    messages[user, default: []].append(Message(id: id, json: body(id)))
    return id
  }

  /// Forgets the messages of `user` above `lastID`, as a database restored from an older backup would: the next
  /// message gets `lastID + 1` again.
  mutating func rewind(user: String, to lastID: UInt64) {
    guard var list = messages[user] else { return }
    list.removeLast(max(0, list.count - Int(min(lastID, UInt64(list.count)))))
    messages[user] = list
  }

  /// Messages of `user` after `cursor`, at most `limit`.
  func after(_ cursor: UInt64, user: String, limit: Int) -> ArraySlice<Message> {
    guard let list = messages[user] else { return [] }
    // Ids are 1...n without holes, so the position is the cursor itself.
    let start = Int(min(cursor, UInt64(list.count)))
    return list[start..<min(list.count, start + limit)]
  }

  /// The last `count` messages of `user` at or below `cursor` (what the caller already has).
  func already(_ cursor: UInt64, user: String, count: Int) -> ArraySlice<Message> {
    guard let list = messages[user] else { return [] }
    let end = Int(min(cursor, UInt64(list.count)))
    return list[max(0, end - count)..<end]
  }

  var counts: [String: Int] { messages.mapValues(\.count) }
}
