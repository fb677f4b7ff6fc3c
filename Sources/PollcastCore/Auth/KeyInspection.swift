import CSSL

/// What a configured JWT key file holds, read with OpenSSL's PEM reader, and whether it fits the algorithm.
///
/// libjwt 1.10 verifies with whatever algorithm the token names when the key fits it, and takes any bytes as an
/// HMAC secret: an RSA public key configured for HS256 made every token HMAC'd with that (public) file verify. So
/// the key is parsed for what it is, and a key of the wrong kind stops the relay at start (exit 78).
enum KeyInspection {
  /// What a PEM public key is: `RSA`, with its bits, or `EC` with its curve (`prime256v1` is P-256).
  struct PublicKey: Equatable, CustomStringConvertible {
    var type: String
    var bits: Int
    var curve: String?

    var description: String {
      curve.map { "an \(type) public key on \($0) (\(bits) bits)" } ?? "an \(type) public key of \(bits) bits"
    }
  }

  /// The first public key in `bytes`, or nil when OpenSSL reads none.
  static func publicKey(_ bytes: [UInt8]) -> PublicKey? {
    bytes.withUnsafeBufferPointer { buffer -> PublicKey? in
      guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
      defer { BIO_free(bio) }
      guard let key = PEM_read_bio_PUBKEY(bio, nil, nil, nil) else {
        ERR_clear_error()
        return nil
      }
      defer { EVP_PKEY_free(key) }
      let bits = Int(EVP_PKEY_get_bits(key))
      switch EVP_PKEY_get_base_id(key) {
      case EVP_PKEY_RSA: return PublicKey(type: "RSA", bits: bits)
      case EVP_PKEY_RSA_PSS: return PublicKey(type: "RSA-PSS", bits: bits)
      case EVP_PKEY_EC:
        var name = [CChar](repeating: 0, count: 80)
        var length = 0
        let found = EVP_PKEY_get_group_name(key, &name, name.count, &length) == 1
        return PublicKey(type: "EC", bits: bits, curve: found ? String(cString: name) : "an unnamed curve")
      case EVP_PKEY_ED25519: return PublicKey(type: "Ed25519", bits: bits)
      default: return PublicKey(type: "unknown-type", bits: bits)
      }
    }
  }

  /// Why `bytes` (from `path`) cannot be the key of `algorithm`, or nil when it can.
  static func problem(_ bytes: [UInt8], path: String, algorithm: JWTVerifier.Algorithm) -> String? {
    let text = String(decoding: bytes, as: UTF8.self)
    let pem = text.contains("-----BEGIN")
    switch algorithm {
    case .hs256:
      if pem {
        let what = publicKey(bytes).map { $0.description } ?? "a PEM block"
        return "\(path) holds \(what), not an HS256 secret: tokens HMAC'd with a public key would verify"
          + " (set auth.jwt.algorithm to RS256/ES256 for a public key, or give the secret's own bytes)"
      }
      return bytes.count < 32 ? "an HS256 secret needs at least 32 bytes (\(path) has \(bytes.count))" : nil
    case .rs256, .es256:
      if text.contains("PRIVATE KEY-----") {
        return "\(path) holds a private key: give the relay only the public key (openssl pkey -pubout)"
      }
      guard pem, let key = publicKey(bytes) else {
        return "\(path) is not a PEM public key (-----BEGIN PUBLIC KEY-----) that OpenSSL can read"
      }
      if algorithm == .rs256 && key.type != "RSA" {
        return "\(path) holds \(key), but RS256 needs an RSA public key"
      }
      if algorithm == .rs256 && key.bits < 2048 {
        return "\(path) holds \(key): RS256 needs at least 2048 bits"
      }
      if algorithm == .es256 && (key.type != "EC" || key.curve != "prime256v1") {
        return "\(path) holds \(key), but ES256 needs an EC public key on P-256 (prime256v1)"
      }
      return nil
    }
  }
}
