import CSQLite
import Foundation

/// SQLite helpers, on the store's `queue` only: statements, bindings and errors with their hints; and the kept
/// secret of account names.
extension SQLiteEventStore {
  /// Kept in `meta` as hex; made on first use.
  public func accountKeySecret() throws(StoreError) -> [UInt8]? {
    let result: Result<[UInt8], StoreError> = queue.sync {
      do throws(StoreError) {
        if let hex = try metaValue("account_key_secret") {
          // Replacing it would rename every such account, silently: a damaged one is refused.
          guard let kept = [UInt8](hex: hex), kept.count == 32 else {
            throw StoreError(.corrupt, path: path, "meta.account_key_secret is not 32 bytes of hex")
          }
          return .success(kept)
        }
        let made = AccountKeys.freshSecret()
        try setMeta("account_key_secret", made.lowercaseHex)
        return .success(made)
      } catch {
        return .failure(error)
      }
    }
    return try result.get()
  }

  /// A damaged file is left as it is: the error says how to start afresh.
  static func hinted(_ error: StoreError) -> StoreError {
    guard error.kind == .corrupt, error.hint == nil else { return error }
    var hinted = error
    hinted.hint =
      "The file was left as it is. To start with an empty store instead, move it aside or set"
      + " store.reset_if_corrupt (--store-reset-if-corrupt true)."
    return hinted
  }

  func statement(_ sql: String) throws(StoreError) -> OpaquePointer {
    if let prepared = statements[sql] { return prepared }
    var prepared: OpaquePointer?
    let status = sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &prepared, nil)
    guard status == SQLITE_OK, let prepared else { throw failure(status, "preparing a statement") }
    statements[sql] = prepared
    return prepared
  }

  /// Steps once: true with a row, false when done.
  func step(_ statement: OpaquePointer) throws(StoreError) -> Bool {
    let status = sqlite3_step(statement)
    if status == SQLITE_ROW { return true }
    if status == SQLITE_DONE { return false }
    throw failure(status, nil)
  }

  func execute(_ sql: String) throws(StoreError) {
    let status = sqlite3_exec(db, sql, nil, nil, nil)
    guard status == SQLITE_OK else { throw failure(status, nil) }
  }

  func integer(_ sql: String) throws(StoreError) -> Int64 {
    var prepared: OpaquePointer?
    let status = sqlite3_prepare_v2(db, sql, -1, &prepared, nil)
    defer { sqlite3_finalize(prepared) }
    guard status == SQLITE_OK, let prepared else { throw failure(status, sql) }
    guard try step(prepared) else { return 0 }
    return sqlite3_column_int64(prepared, 0)
  }

  func text(_ sql: String) throws(StoreError) -> String? {
    var prepared: OpaquePointer?
    let status = sqlite3_prepare_v2(db, sql, -1, &prepared, nil)
    defer { sqlite3_finalize(prepared) }
    guard status == SQLITE_OK, let prepared else { throw failure(status, sql) }
    guard try step(prepared) else { return nil }
    return columnText(prepared, 0)
  }

  func columnText(_ statement: OpaquePointer, _ column: Int32) -> String {
    guard let text = sqlite3_column_text(statement, column) else { return "" }
    let count = Int(sqlite3_column_bytes(statement, column))
    return String(decoding: UnsafeRawBufferPointer(start: text, count: count), as: UTF8.self)
  }

  func message(_ status: Int32) -> String {
    let detail = db.flatMap { sqlite3_errmsg($0) }.map { String(cString: $0) }
    let name = String(cString: sqlite3_errstr(status))
    return detail.map { $0 == name ? name : "\(name): \($0)" } ?? name
  }

  func failure(_ status: Int32, _ doing: String?) -> StoreError {
    let primary = status & 0xff
    let kind: StoreError.Kind
    switch primary {
    case SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_FORMAT: kind = .corrupt
    case SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN, SQLITE_PERM, SQLITE_AUTH, SQLITE_READONLY:
      kind = .unavailable
    default: kind = .write
    }
    var text = message(status)
    if primary == SQLITE_BUSY { text += " (another process holds the store)" }
    return StoreError(kind, path: path, doing.map { "\($0): \(text)" } ?? text)
  }

  func fileSize(_ path: String) -> Int {
    var info = stat()
    return stat(path, &info) == 0 ? Int(info.st_size) : 0
  }
}
