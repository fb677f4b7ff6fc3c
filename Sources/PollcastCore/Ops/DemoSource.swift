import Foundation

/// A stand-in event source for `pollcast --demo` until the upstream worker and the reference legacy fixture
/// exist: publishes a chat-shaped message on streams 101 and 202 every `interval` seconds.
public actor DemoSource {
  public nonisolated let feed: Feed
  public nonisolated var unownedExecutor: UnownedSerialExecutor { feed.loop.asUnownedSerialExecutor() }
  private var timer: LoopTimer?
  private var counter = 0

  public init(feed: Feed) { self.feed = feed }

  public func start(interval: Double = 1) {
    let timer = LoopTimer(loop: feed.loop, repeating: true) { [unowned self] in
      self.assumeIsolated { $0.emit() }
    }
    timer.schedule(after: interval)
    self.timer = timer
    feed.assumeIsolated { $0.publishStatus("{\"state\":\"live\",\"source\":\"demo\"}") }
  }

  public func stop() { timer = nil }

  private func emit() {
    counter += 1
    let stream = counter % 3 == 0 ? "202" : "101"
    let message = JSONText.object([
      "id": String(counter), "chat_id": JSONText.quoted("c1"), "from": JSONText.quoted("demo"),
      "text": JSONText.quoted("demo message \(counter)"), "sent_at": JSONText.quoted(utcTimestamp()),
    ])
    let data = JSONText.object([
      "stream": JSONText.quoted(stream), "upstream_id": JSONText.quoted(String(counter)), "backlog": "false",
      "message": message,
    ])
    feed.assumeIsolated { _ = $0.publish([FeedEvent(stream: stream, data: data)]) }
  }
}
