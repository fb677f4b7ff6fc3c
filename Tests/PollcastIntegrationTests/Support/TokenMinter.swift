import Foundation
import PollcastCore

/// Mints JWTs the way a backend without a JWT library would: header and claims are base64url JSON, and the
/// signature comes from the `openssl` command line (`openssl dgst -sha256 -mac HMAC` or `-sign`). ES256's DER
/// signature is turned into JOSE's raw r‖s.
final class TokenMinter {
  let directory: URL

  init() throws {
    directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-jwt-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
  }

  deinit { try? FileManager.default.removeItem(at: directory) }

  enum Signer {
    case hmac(secret: [UInt8])
    case rsa(privateKey: String)
    case ec(privateKey: String)
    /// `alg: none`: an empty signature.
    case unsigned
  }

  /// A fresh HS256 secret (64 bytes of hex text), written to a file the relay reads.
  func secret(_ name: String = "secret") throws -> (bytes: [UInt8], path: String) {
    let result = try openssl(["rand", "-hex", "32"])
    let bytes = Array(result.trimmingCharacters(in: .whitespacesAndNewlines).utf8)
    let path = directory.appendingPathComponent(name).path
    FileManager.default.createFile(atPath: path, contents: Data(bytes + [0x0A]))
    return (bytes, path)
  }

  /// A key pair made by `openssl genpkey`: "rsa" (2048 bits) or "ec" (P-256). Returns the PEM file paths.
  func keyPair(_ kind: String, name: String? = nil) throws -> (privateKey: String, publicKey: String) {
    let base = directory.appendingPathComponent(name ?? kind).path
    let options =
      kind == "rsa"
      ? ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
      : ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    _ = try openssl(["genpkey"] + options + ["-out", base + ".key"])
    _ = try openssl(["pkey", "-in", base + ".key", "-pubout", "-out", base + ".pem"])
    return (base + ".key", base + ".pem")
  }

  func mint(alg: String, kid: String? = nil, claims: [String: Any], signer: Signer) throws -> String {
    var header: [String: Any] = ["alg": alg, "typ": "JWT"]
    if let kid { header["kid"] = kid }
    let input =
      TokenMinter.base64URL(try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])) + "."
      + TokenMinter.base64URL(try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys]))
    let inputPath = directory.appendingPathComponent("input-\(UUID().uuidString)").path
    let signaturePath = inputPath + ".sig"
    FileManager.default.createFile(atPath: inputPath, contents: Data(input.utf8))
    defer {
      try? FileManager.default.removeItem(atPath: inputPath)
      try? FileManager.default.removeItem(atPath: signaturePath)
    }
    switch signer {
    case .unsigned:
      return input + "."
    case .hmac(let secret):
      let hex = secret.map { String(format: "%02x", $0) }.joined()
      _ = try openssl(
        ["dgst", "-sha256", "-mac", "HMAC", "-macopt", "hexkey:\(hex)", "-binary", "-out", signaturePath, inputPath])
    case .rsa(let key), .ec(let key):
      _ = try openssl(["dgst", "-sha256", "-sign", key, "-out", signaturePath, inputPath])
    }
    guard var signature = FileManager.default.contents(atPath: signaturePath).map({ [UInt8]($0) }) else {
      throw TestSSEClient.Failure(description: "openssl wrote no signature")
    }
    if case .ec = signer { signature = try TokenMinter.joseSignature(fromDER: signature) }
    return input + "." + TokenMinter.base64URL(Data(signature))
  }

  static func base64URL(_ data: Data) -> String {
    data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
      .replacingOccurrences(of: "=", with: "")
  }

  /// ECDSA-Sig-Value ::= SEQUENCE { r INTEGER, s INTEGER } → r ‖ s, 32 bytes each.
  static func joseSignature(fromDER der: [UInt8]) throws -> [UInt8] {
    var index = 2
    if der.count > 1 && der[1] & 0x80 != 0 { index = 2 + Int(der[1] & 0x7F) }
    func integer() throws -> [UInt8] {
      guard index + 2 <= der.count, der[index] == 0x02 else { throw TestSSEClient.Failure(description: "bad DER") }
      let length = Int(der[index + 1])
      let value = Array(der[(index + 2)..<(index + 2 + length)])
      index += 2 + length
      let trimmed = Array(value.drop { $0 == 0 })
      return [UInt8](repeating: 0, count: max(0, 32 - trimmed.count)) + trimmed
    }
    return try integer() + integer()
  }

  func openssl(_ arguments: [String]) throws -> String {
    let result = try run("/usr/bin/openssl", arguments)
    guard result.code == 0 else {
      throw TestSSEClient.Failure(description: "openssl \(arguments.first ?? ""): \(result.stderr)")
    }
    return result.stdout
  }
}

/// One plain HTTP exchange on a fresh connection (`Connection: close`): status, headers (lower-cased names) and
/// body.
func httpGet(port: Int, _ target: String, headers: [(String, String)] = []) throws -> (
  status: Int, headers: [String: String], body: String
) {
  var request = "GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
  for (name, value) in headers { request += "\(name): \(value)\r\n" }
  let answer = try rawExchange(port: port, request + "\r\n")
  let parts = answer.text.components(separatedBy: "\r\n\r\n")
  let head = parts.first ?? ""
  var fields: [String: String] = [:]
  for line in head.components(separatedBy: "\r\n").dropFirst() {
    guard let colon = line.firstIndex(of: ":") else { continue }
    fields[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
  }
  return (answer.statuses.first ?? 0, fields, parts.dropFirst().joined(separator: "\r\n\r\n"))
}
