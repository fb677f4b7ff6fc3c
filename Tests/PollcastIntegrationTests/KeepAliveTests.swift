import Foundation
import Testing

@testable import PollcastCore

/// Plain-HTTP requests to an IP address go over one kept-alive connection per upstream client (libevent's HTTP
/// client), the rest through libcurl. These pin what a legacy API sees on the wire and every way an answer can go
/// wrong, against a loopback server that records each request and connection.
@Suite(.serialized, .timeLimit(.minutes(3))) struct KeepAliveTests {
  private func driver(maxBody: Int = 16 << 20) async throws -> KeptClientDriver {
    try await KeptClientDriver.make(maxBody: maxBody)
  }

  @Test func requestsToAnAddressShareOneConnectionAndSayExactlyWhatWasAsked() async throws {
    let server = try CapturingServer { number, _ in (200, "{\"n\":\(number)}") }
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    for number in 0..<20 {
      let outcome = await driver.send(
        UpstreamRequest(url: "\(server.url)/poll?since=\(number)#fragment", headers: [("X-Key", "k 1")], label: "t"))
      let response = try outcome.get()
      #expect(response.status == 200)
      #expect(String(decoding: response.body, as: UTF8.self) == "{\"n\":\(number)}")
    }
    let posted = try await driver.send(
      UpstreamRequest(method: "POST", url: "\(server.url)/send", body: Array("a=1&b=2".utf8), label: "t")
    ).get()
    #expect(posted.status == 200)
    #expect(server.connections == 1)
    #expect(await driver.kept() == 21)
    let received = server.received
    #expect(received.count == 21)
    #expect(received.first?.line == "GET /poll?since=0 HTTP/1.1")
    let first = try #require(received.first)
    #expect(first.headers.filter { $0.name == "X-Key" }.map(\.value) == ["k 1"])
    #expect(first.headers.first { $0.name == "Host" }?.value == "127.0.0.1:\(server.port)")
    #expect(first.headers.first { $0.name == "User-Agent" }?.value.hasPrefix("pollcast/") == true)
    let post = try #require(received.last)
    #expect(post.line == "POST /send HTTP/1.1")
    #expect(String(decoding: post.body, as: UTF8.self) == "a=1&b=2")
    #expect(post.headers.first { $0.name == "Content-Length" }?.value == "7")
  }

  @Test func aRequestLargerThanTheSocketTakesIsWrittenWholeBeforeItsAnswerIsRead() async throws {
    // A request on a kept socket that the kernel cannot take in one write (an 8 MB body, more than a loopback
    // socket's send buffer holds) goes out as the socket drains, byte for byte, and only then is its answer read.
    // Short requests before and after share the connection.
    let server = try CapturingServer { number, request in (200, "{\"n\":\(number),\"bytes\":\(request.body.count)}") }
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    let body = (0..<(8 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 13) }
    let first = try await driver.send(UpstreamRequest(url: "\(server.url)/p?since=0", label: "t")).get()
    #expect(String(decoding: first.body, as: UTF8.self) == "{\"n\":0,\"bytes\":0}")
    let posted = try await driver.send(
      UpstreamRequest(method: "POST", url: "\(server.url)/send", body: body, timeout: 20, label: "t")
    ).get()
    #expect(String(decoding: posted.body, as: UTF8.self) == "{\"n\":1,\"bytes\":\(body.count)}")
    let last = try await driver.send(UpstreamRequest(url: "\(server.url)/p?since=2", label: "t")).get()
    #expect(String(decoding: last.body, as: UTF8.self) == "{\"n\":2,\"bytes\":0}")
    #expect(server.connections == 1)
    let received = server.received
    #expect(received.map(\.line) == ["GET /p?since=0 HTTP/1.1", "POST /send HTTP/1.1", "GET /p?since=2 HTTP/1.1"])
    #expect(received.count == 3 && received[1].body == body)
    #expect(await driver.inFlight() == 0)
  }

  @Test func aServerThatClosesAfterAnswersGetsANewConnectionEachTime() async throws {
    // Every answer says "Connection: close" and the server closes: nothing is lost, each request a new connection.
    let server = try CapturingServer(rawRespond: { number, _ in
      let body = "{\"n\":\(number)}"
      return ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)", true)
    })
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    for number in 0..<5 {
      let response = try await driver.send(UpstreamRequest(url: "\(server.url)/p", label: "t")).get()
      #expect(String(decoding: response.body, as: UTF8.self) == "{\"n\":\(number)}")
    }
    #expect(server.connections == 5)
    #expect(await driver.kept() == 5)
  }

  @Test func aKeptConnectionClosedAsARequestArrivesIsRetriedOnceOnAFreshOne() async throws {
    // The race every keep-alive client meets: the server drops a kept connection (a keep-alive timeout, a restart)
    // just as the next request goes out. Requests 1 and 3 arrive on kept connections and are dropped unanswered:
    // each is sent once more on a fresh connection. Request 4 is that retry of 3, dropped on its fresh connection:
    // that failure stands (no second retry, no loop).
    let server = try CapturingServer(rawRespond: { number, _ in
      if number == 1 || number == 3 || number == 4 { return ("", true) }
      let body = "{\"n\":\(number)}"
      return ("HTTP/1.1 200 OK\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)", false)
    })
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    let request = UpstreamRequest(url: "\(server.url)/p?since=1", timeout: 5, label: "t")
    #expect(String(decoding: try await driver.send(request).get().body, as: UTF8.self) == "{\"n\":0}")
    #expect(String(decoding: try await driver.send(request).get().body, as: UTF8.self) == "{\"n\":2}")
    #expect(server.connections == 2)
    guard case .failure(let dropped) = await driver.send(request) else {
      Issue.record("a request dropped on a fresh connection was taken as answered")
      return
    }
    #expect(dropped.kind == .transport, "\(dropped)")
    #expect(String(decoding: try await driver.send(request).get().body, as: UTF8.self) == "{\"n\":5}")
    #expect(server.connections == 4)
    // Every try said the same on the wire.
    #expect(Set(server.received.map(\.line)) == ["GET /p?since=1 HTTP/1.1"])
    #expect(await driver.kept() == 6)
    #expect(await driver.inFlight() == 0)
  }

  @Test func chunkedAnswersAndTheHeadersAskedFor() async throws {
    let server = try CapturingServer(rawRespond: { _, _ in
      (
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Index: 1\r\nx-index: 7\r\nRetry-After: 3\r\n\r\n"
          + "5\r\n[1,2,\r\n2\r\n3]\r\n0\r\n\r\n", false
      )
    })
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    var request = UpstreamRequest(url: "\(server.url)/p", label: "t")
    request.wantedHeaders = ["X-Index"]
    let named = try await driver.send(request).get()
    #expect(String(decoding: named.body, as: UTF8.self) == "[1,2,3]")
    #expect(named.header("X-Index") == "7")
    #expect(named.headers.count == 1)
    request.wantedHeaders = []
    let all = try await driver.send(request).get()
    #expect(all.header("Retry-After") == "3")
    request.wantedHeaders = nil
    #expect(try await driver.send(request).get().headers.isEmpty)
    #expect(server.connections == 1)
  }

  @Test func oversizedBrokenAndCutAnswersAreTypedErrorsAndTheClientGoesOn() async throws {
    let server = try CapturingServer(rawRespond: { number, _ in
      switch number {
      case 0: ("HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + String(repeating: "x", count: 5000), false)
      case 1: ("NOT HTTP AT ALL\r\n\r\n", true)
      case 2: ("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort", true)
      case 3: ("HTTP/1.1 200 OK\r\nX-Long: " + String(repeating: "h", count: 70_000) + "\r\n\r\n", true)
      default: ("HTTP/1.1 204 No Content\r\n\r\n", false)
      }
    })
    defer { server.stop() }
    let driver = try await driver(maxBody: 1000)
    defer { driver.loop.stop() }
    let request = UpstreamRequest(url: "\(server.url)/p", timeout: 5, label: "t")
    guard case .failure(let large) = await driver.send(request) else {
      Issue.record("a body over the limit was accepted")
      return
    }
    #expect(large.kind == .decoding, "\(large)")
    guard case .failure(let garbage) = await driver.send(request) else {
      Issue.record("a non-HTTP answer was accepted")
      return
    }
    #expect(garbage.kind == .transport, "\(garbage)")
    guard case .failure(let cut) = await driver.send(request) else {
      Issue.record("an answer cut short was accepted")
      return
    }
    #expect(cut.kind == .transport, "\(cut)")
    guard case .failure(let longHead) = await driver.send(request) else {
      Issue.record("a header block over the limit was accepted")
      return
    }
    // evhttp reports a head over its limit as a head it cannot parse.
    #expect(longHead.kind == .transport, "\(longHead)")
    // Teeth: after all that, the same client still works.
    #expect(try await driver.send(request).get().status == 204)
    #expect(await driver.inFlight() == 0)
  }

  @Test func timeoutsRefusalsAndCancellationEndTheRequestAndFreeTheClient() async throws {
    let driver = try await driver()
    defer { driver.loop.stop() }
    // A listening socket that never accepts: the kernel completes the handshake, nothing answers.
    let silent = try ListeningSocket.bind(host: "127.0.0.1", port: 0, backlog: 4)
    let started = MonotonicClock.seconds()
    guard
      case .failure(let timeout) = await driver.send(
        UpstreamRequest(url: "http://127.0.0.1:\(silent.port)/p", timeout: 0.5, label: "t"))
    else {
      Issue.record("expected a timeout")
      return
    }
    #expect(timeout.kind == .timeout)
    #expect(MonotonicClock.seconds() - started < 3)
    // Cancelling the waiting task ends the request at once.
    let task = Task {
      await driver.send(UpstreamRequest(url: "http://127.0.0.1:\(silent.port)/p", timeout: 30, label: "t"))
    }
    try await Task.sleep(for: .milliseconds(200))
    #expect(await driver.inFlight() == 1)
    task.cancel()
    guard case .failure(let cancelled) = await task.value else {
      Issue.record("expected a cancellation")
      return
    }
    #expect(cancelled.kind == .cancelled)
    #expect(await driver.inFlight() == 0)
    close(silent.fd)
    guard
      case .failure(let refused) = await driver.send(
        UpstreamRequest(url: "http://127.0.0.1:\(silent.port)/p", timeout: 2, label: "t"))
    else {
      Issue.record("expected a refused connection")
      return
    }
    #expect(refused.kind == .transport, "\(refused)")
    #expect(await driver.kept() == 3)
  }

  @Test func aNameIsPolledOverTheKeptConnectionAtTheAddressLibcurlReachedItAt() async throws {
    // How a relay in a container addresses its API ("http://legacy:8081"): libcurl resolves the name (without
    // blocking, every address tried), and the requests after it go over the kept connection to the address it
    // reached, with the name still in Host.
    let server = try CapturingServer(status: 200, body: "{}")
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    for number in 0..<5 {
      let response = try await driver.send(
        UpstreamRequest(url: "http://localhost:\(server.port)/p?n=\(number)", label: "t")
      ).get()
      #expect(response.status == 200)
    }
    #expect(await driver.learned() == ["127.0.0.1"])
    #expect(await driver.kept() == 4)
    #expect(server.connections == 2, "libcurl's connection for the first request, then one kept")
    #expect(server.received.map(\.line) == (0..<5).map { "GET /p?n=\($0) HTTP/1.1" })
    #expect(
      Set(server.received.compactMap { $0.headers.first { $0.name == "Host" }?.value }) == ["localhost:\(server.port)"])
    // An address that takes no connection (the API moved, as a restarted container does): nothing was sent there,
    // so libcurl resolves the name again and sends the same request at once; the next one is kept again.
    await driver.learn("::1", for: "localhost", port: server.port)
    let moved = try await driver.send(UpstreamRequest(url: "http://localhost:\(server.port)/moved", label: "t")).get()
    #expect(moved.status == 200)
    #expect(await driver.learned() == ["127.0.0.1"])
    #expect(await driver.kept() == 5, "the try at the old address")
    #expect(
      try await driver.send(UpstreamRequest(url: "http://localhost:\(server.port)/again", label: "t")).get().status
        == 200)
    #expect(await driver.kept() == 6)
    // An open kept connection goes on being used past the address's lifetime, as libcurl reuses its own.
    await driver.setAddressLifetime(0)
    #expect(
      try await driver.send(UpstreamRequest(url: "http://localhost:\(server.port)/open", label: "t")).get().status
        == 200)
    #expect(await driver.kept() == 7)
    #expect(
      server.received.suffix(3).map(\.line) == ["GET /moved HTTP/1.1", "GET /again HTTP/1.1", "GET /open HTTP/1.1"])
    #expect(await driver.inFlight() == 0)
  }

  @Test func aLearnedAddressServesNewConnectionsOnlyWhileFresh() async throws {
    // A server that closes after every answer: each request needs a new connection. Past the address's lifetime a
    // new connection goes through libcurl (which resolves the name again); an open kept connection would be used
    // for as long as it stays open.
    let server = try CapturingServer(rawRespond: { number, _ in
      ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", true)
    })
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    let request = UpstreamRequest(url: "http://localhost:\(server.port)/p", label: "t")
    #expect(try await driver.send(request).get().status == 200)
    #expect(try await driver.send(request).get().status == 200)
    #expect(await driver.kept() == 1)
    await driver.setAddressLifetime(0)
    try await Task.sleep(for: .milliseconds(20))
    #expect(try await driver.send(request).get().status == 200)
    #expect(try await driver.send(request).get().status == 200)
    #expect(await driver.kept() == 1, "every new connection after the lifetime went through libcurl")
    #expect(server.received.count == 4)
  }

  @Test func tlsUserinfoAndOtherMethodsGoThroughLibcurl() async throws {
    let server = try CapturingServer(status: 200, body: "{}")
    defer { server.stop() }
    let driver = try await driver()
    defer { driver.loop.stop() }
    let named = try await driver.send(UpstreamRequest(url: "http://localhost:\(server.port)/a", label: "t")).get()
    #expect(named.status == 200)
    #expect(await driver.kept() == 0, "a name is first reached through libcurl")
    let custom = try await driver.send(UpstreamRequest(method: "PROPFIND", url: "\(server.url)/b", label: "t")).get()
    #expect(custom.status == 200)
    let userinfo = try await driver.send(
      UpstreamRequest(url: "http://u:p@127.0.0.1:\(server.port)/c", label: "t")
    ).get()
    #expect(userinfo.status == 200)
    #expect(server.received.map(\.line) == ["GET /a HTTP/1.1", "PROPFIND /b HTTP/1.1", "GET /c HTTP/1.1"])
    #expect(server.received.last?.headers.first { $0.name == "Authorization" }?.value.hasPrefix("Basic ") == true)
    #expect(await driver.kept() == 0)
    // Teeth: the same server by address goes over the kept connection.
    #expect(try await driver.send(UpstreamRequest(url: "\(server.url)/d", label: "t")).get().status == 200)
    #expect(await driver.kept() == 1)
  }
}
