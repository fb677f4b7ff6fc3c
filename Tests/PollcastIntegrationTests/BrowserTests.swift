import Foundation
import LegacyFixture
import PollcastCore
import Testing

/// The live page at `/` in a real headless Chromium.
@Suite(.serialized, .timeLimit(.minutes(5))) struct BrowserTests {
  @Test func livePageShowsMessagesAndReconnectsByItselfWithoutLosingOrRepeatingAny() async throws {
    // Streams end every 1.5 s (maximum connection age): the browser must reconnect and resume on its own.
    try await UpstreamHarness.start(
      feed: FeedSettings(heartbeatInterval: 5, retryMilliseconds: 200, maxConnectionAge: 1.5)
    ).run { harness in
      try await harness.waitForState(.live)
      let browser = try WebDriver()
      defer { browser.quit() }
      try browser.navigate(to: "http://127.0.0.1:\(harness.port)/")
      try await waitFor(browser, "the page to connect", "return window.pollcast && window.pollcast.opens >= 1")
      try await harness.waitForParkedPoll()
      var expected: [String] = []
      let first = ["hello", "from", "legacy"]
      await harness.fixture.append(user: "101", texts: first)
      expected += first
      try await waitFor(browser, "the first messages", "return window.pollcast.messages.length === 3")
      // Publish across several forced reconnects.
      for index in 0..<30 {
        let text = "m\(index)"
        await harness.fixture.append(user: index % 2 == 0 ? "101" : "202", texts: [text])
        expected.append(text)
        try await Task.sleep(for: .milliseconds(150))
      }
      try await waitFor(
        browser, "every message", "return window.pollcast.messages.length >= \(expected.count)", timeout: 30)
      try await Task.sleep(for: .milliseconds(300))
      let texts = try browser.evaluate("return window.pollcast.messages.map(m => m.text)")
      let shown = arrayOfStrings(texts)
      #expect(shown.sorted() == expected.sorted())
      #expect(shown.count == expected.count, "a message was shown twice")
      let ids = arrayOfStrings(try browser.evaluate("return window.pollcast.messages.map(m => m.id)"))
      #expect(Set(ids).count == ids.count)
      #expect(ids == ids.sorted { UInt64($0)! < UInt64($1)! })
      let opens = try browser.evaluate("return window.pollcast.opens").unsignedID ?? 0
      #expect(opens >= 3, "the browser reconnected \(opens - 1) times")
      #expect(try browser.evaluate("return window.pollcast.resets.length").unsignedID == 0)
      #expect(
        try browser.evaluate("return document.querySelectorAll('li.msg').length").unsignedID == UInt64(expected.count))
      #expect(try browser.evaluate("return document.getElementById('upstream').textContent").stringValue == "live")
      #expect((await harness.relay.feed.statistics()).agedOut >= 2)
      try? browser.screenshot(
        to: FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-live-page.png").path)
    }
  }

  @Test func livePageMarksBacklogAndShowsResets() async throws {
    try await UpstreamHarness.start(
      settings: UpstreamHarness.fastSettings(startFrom: .earliest), prefill: ["101": ["old-a", "old-b"]]
    ).run { harness in
      try await harness.waitForState(.live)
      let browser = try WebDriver()
      defer { browser.quit() }
      let before = await harness.relay.feed.headID - 2
      try browser.navigate(to: "http://127.0.0.1:\(harness.port)/?lastEventId=\(before)")
      try await waitFor(browser, "backlog", "return window.pollcast && window.pollcast.messages.length === 2")
      #expect(try browser.evaluate("return document.querySelectorAll('li.msg.backlog').length").unsignedID == 2)
      try browser.navigate(to: "http://127.0.0.1:\(harness.port)/?lastEventId=nonsense")
      try await waitFor(browser, "a reset notice", "return window.pollcast && window.pollcast.resets.length === 1")
      let notice = try browser.evaluate("return document.querySelector('.notice').textContent").stringValue ?? ""
      #expect(notice.contains("Reset (invalid)"))
    }
  }

  /// `auth.mode = upstream`: the page asks for the legacy key, puts it in the cookie, and then shows that
  /// account's messages only (the browser's EventSource sends the cookie).
  @Test func livePageAsksForTheKeyAndShowsOnlyThatAccount() async throws {
    try await AccountsHarness.start().run { harness in
      let browser = try WebDriver()
      defer { browser.quit() }
      try browser.navigate(to: "http://127.0.0.1:\(harness.port)/")
      try await waitFor(browser, "the key form", "return document.getElementById('token-form') !== null")
      _ = try browser.evaluate(
        "document.getElementById('token').value = 'key-1000'; "
          + "document.getElementById('token-form').requestSubmit(); return true")
      try await waitFor(
        browser, "the page to connect with the key",
        "return document.cookie.includes('pollcast_token=key-1000') && window.pollcast && window.pollcast.opens >= 1")
      try await harness.waitForParkedPoll(user: "1000")
      await harness.fixture.append(user: "1001", texts: ["not yours"])
      await harness.fixture.append(user: "1000", texts: ["yours 1", "yours 2"])
      try await waitFor(browser, "the account's messages", "return window.pollcast.messages.length >= 2")
      try await Task.sleep(for: .milliseconds(300))
      let shown = arrayOfStrings(try browser.evaluate("return window.pollcast.messages.map(m => m.text)"))
      #expect(shown == ["yours 1", "yours 2"])
    }
  }

  private func waitFor(_ browser: WebDriver, _ what: String, _ script: String, timeout: Double = 15) async throws {
    let deadline = MonotonicClock.seconds() + timeout
    while try browser.evaluate(script).rawText != "true" {
      guard MonotonicClock.seconds() < deadline else {
        throw WebDriver.Failure(description: "timed out waiting for \(what)")
      }
      try await Task.sleep(for: .milliseconds(100))
    }
  }

  private func arrayOfStrings(_ json: RawJSON) -> [String] {
    guard case .array(let elements) = json.value else { return [] }
    return elements.compactMap(\.stringValue)
  }
}
