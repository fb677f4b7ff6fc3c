import Foundation
import Testing

@testable import PollcastCore

/// A hostile or broken server's framing on a kept connection: whatever it sends beyond an answer, before one, or
/// around one, no request ever takes bytes meant for another as its answer. Each case runs through both clients (the
/// kept connection for an address, libcurl for a name never learned), which must agree.
@Suite(.serialized, .timeLimit(.minutes(3))) struct KeepAliveFramingTests {
  enum Route: String, CaseIterable, CustomTestStringConvertible {
    case kept, libcurl
    var testDescription: String { rawValue }
  }

  /// An answer echoing the request's `since`, so an answer given to the wrong request shows.
  static func answer(_ request: CapturingServer.Request, status: String = "200 OK") -> String {
    let since = request.line.split(separator: "=").last.map { $0.split(separator: " ")[0] } ?? "?"
    let body = "{\"since\":\(since)}"
    return "HTTP/1.1 \(status)\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
  }

  static let forged = "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{\"forged\":1}"

  /// Sends five polls (`since=0…4`) and returns each outcome's body or error.
  private func poll(_ server: CapturingServer, _ route: Route) async throws -> (results: [String], refused: String?) {
    let driver = try await KeptClientDriver.make()
    defer { driver.loop.stop() }
    if route == .libcurl { await driver.setAddressLifetime(0) }
    let host = route == .kept ? "127.0.0.1" : "localhost"
    var results: [String] = []
    for since in 0..<5 {
      let outcome = await driver.send(
        UpstreamRequest(url: "http://\(host):\(server.port)/poll?since=\(since)", label: "t"))
      switch outcome {
      case .success(let response): results.append(String(decoding: response.body, as: UTF8.self))
      case .failure(let error): results.append("error: \(error)")
      }
      try await Task.sleep(for: .milliseconds(50))
    }
    return (results, await driver.keptRefusedBecause())
  }

  private static let expected = (0..<5).map { "{\"since\":\($0)}" }

  @Test(arguments: Route.allCases)
  func bytesPastAnAnswersLengthAreNeverTheNextAnswer(route: Route) async throws {
    let server = try CapturingServer(rawRespond: { number, request in
      (Self.answer(request) + (number == 0 ? Self.forged : ""), false)
    })
    defer { server.stop() }
    let (results, refused) = try await poll(server, route)
    #expect(results == Self.expected)
    if route == .kept { #expect(refused?.contains("past the end") == true) }
  }

  @Test(arguments: Route.allCases, ["102 Processing", "103 Early Hints"])
  func interimAnswersAreNeverTakenForTheAnswer(route: Route, interim: String) async throws {
    let server = try CapturingServer(rawRespond: { _, request in
      ("HTTP/1.1 \(interim)\r\nLink: </style.css>; rel=preload\r\n\r\n" + Self.answer(request), false)
    })
    defer { server.stop() }
    let (results, refused) = try await poll(server, route)
    // The kept connection refuses the interim answer, and the poll goes again through libcurl at once.
    #expect(results == Self.expected)
    if route == .kept { #expect(refused?.contains("interim") == true) }
  }

  @Test(arguments: Route.allCases)
  func anAnswerSentBeforeTheRequestIsNeverItsAnswer(route: Route) async throws {
    let server = try CapturingServer(
      rawRespond: { _, request in (Self.answer(request), false) },
      unsolicited: { number in number == 0 ? Self.forged : nil })
    defer { server.stop() }
    let driver = try await KeptClientDriver.make()
    defer { driver.loop.stop() }
    if route == .libcurl { await driver.setAddressLifetime(0) }
    let host = route == .kept ? "127.0.0.1" : "localhost"
    let first = try await driver.send(UpstreamRequest(url: "http://\(host):\(server.port)/poll?since=0", label: "t"))
      .get()
    #expect(String(decoding: first.body, as: UTF8.self) == "{\"since\":0}")
    try await Task.sleep(for: .milliseconds(500))  // the forged answer arrives 200 ms after the first
    let second = try await driver.send(UpstreamRequest(url: "http://\(host):\(server.port)/poll?since=1", label: "t"))
      .get()
    #expect(String(decoding: second.body, as: UTF8.self) == "{\"since\":1}")
  }

  @Test(arguments: Route.allCases)
  func conflictingLengthsAreRefusedNotGuessed(route: Route) async throws {
    let server = try CapturingServer(rawRespond: { _, _ in
      ("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 12\r\n\r\n{\"forged\":1}", false)
    })
    defer { server.stop() }
    let (results, _) = try await poll(server, route)
    // Neither length is trusted: no poll gets a body cut at either.
    for result in results { #expect(result.hasPrefix("error"), "\(result)") }
  }

  @Test(arguments: Route.allCases)
  func aCloseDelimitedBodyIsReadToTheClose(route: Route) async throws {
    let server = try CapturingServer(rawRespond: { _, request in
      let since = request.line.split(separator: "=").last.map { $0.split(separator: " ")[0] } ?? "?"
      return ("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"since\":\(since)}", true)
    })
    defer { server.stop() }
    let (results, refused) = try await poll(server, route)
    #expect(results == Self.expected)
    #expect(refused == nil)
  }
}
