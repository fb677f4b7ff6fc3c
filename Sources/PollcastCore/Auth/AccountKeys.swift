import CSSL

/// The key of an account whose API has no session step (no user id to name it): `credential:<HMAC-SHA256 of the
/// credential>`, keyed with a secret the store creates once and keeps, so the account keeps its stored ring, ids
/// and cursors across restarts. The credential itself is never stored or logged.
struct AccountKeys: Sendable {
  let secret: [UInt8]

  init(secret: [UInt8]) { self.secret = secret }

  /// From the store's secret, or a fresh one for this process when the store keeps none (memory).
  init(store: EventStore) throws(StoreError) {
    self.init(secret: try store.accountKeySecret() ?? AccountKeys.freshSecret())
  }

  /// 32 bytes from OpenSSL's CSPRNG.
  static func freshSecret() -> [UInt8] {
    var bytes = [UInt8](repeating: 0, count: 32)
    let made = bytes.withUnsafeMutableBufferPointer { RAND_bytes($0.baseAddress, Int32($0.count)) }
    precondition(made == 1, "RAND_bytes failed: no randomness for the account key secret")
    return bytes
  }

  func key(for credential: String) -> String {
    var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
    var length: UInt32 = 0
    let input = Array(credential.utf8)
    let done = secret.withUnsafeBufferPointer { key in
      input.withUnsafeBufferPointer { data in
        HMAC(EVP_sha256(), key.baseAddress, Int32(key.count), data.baseAddress, data.count, &digest, &length)
      }
    }
    precondition(done != nil && length == 32, "HMAC-SHA256 failed")
    // 128 bits name an account without collisions among any number of keys a relay will see.
    return "credential:" + digest.prefix(16).lowercaseHex
  }
}
