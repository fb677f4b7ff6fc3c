import Foundation
import LegacyFixture
import PollcastCore
import Testing

extension RecipeShapesTests {
  /// A fetch chain whose API always has more pages cannot hold them all until one commit: once the pages' bodies add
  /// up to `upstream.max_body_bytes` they are committed, and the next poll fetches the rest. Every entry arrives once,
  /// in order.
  @Test func fetchPagesAreCommittedOnceTheyReachTheBodyBound() async throws {
    var options = LegacyFixture.Options()
    options.maxPollTimeout = 30
    let fixture = try await LegacyFixture.start(options)
    await fixture.dropboxPage(1)
    let logs = try NodeLogs("pollcast-fetch-bound", nodes: 1)
    defer { logs.remove() }
    let base = "http://\(fixture.address)"
    let environment = ["DROPBOX_API": base, "DROPBOX_NOTIFY": base, "DROPBOX_TOKEN": fixture.options.apiKey]
    let node = try relay(
      "dropbox.json", store: logs.directory.appendingPathComponent("relay.db").path, log: logs.files[0],
      environment: environment, extra: ["--log-level", "debug", "--upstream-max-body-bytes", "1200"])
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    let client = try TestSSEClient(port: node.port)
    try await Task.sleep(for: .milliseconds(Int(500 * timingFactor)))
    let expected = await fixture.append(user: "101", texts: (1...12).map { "entry \($0)" })
    let deadline = MonotonicClock.seconds() + 15 * timingFactor
    while RecipeShapesTests.dropboxMessages(client).count < expected.count && MonotonicClock.seconds() < deadline {
      _ = try? client.pump(timeout: 0.05)
    }
    #expect(RecipeShapesTests.dropboxMessages(client) == expected)
    #expect(waitForLog(logs.files[0], "fetch pages reached upstream.max_body_bytes"))
    node.kill9()
    await fixture.shutdown()
  }
}
