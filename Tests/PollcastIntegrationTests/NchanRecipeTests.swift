import Foundation
import PollcastCore
import Testing

/// `Config/recipes/nchan.json` against a real nginx with Debian's `libnginx-mod-nchan`: the cursor is the
/// `Last-Modified` + `Etag` pair (an opaque cursor in parts, sent back as `If-Modified-Since` / `If-None-Match`),
/// bodies are raw text or JSON as published. Relayed exactly once, across held answers that time out (408) and a
/// relay `kill -9` with the SQLite store.
@Suite(.serialized, .timeLimit(.minutes(5))) struct NchanRecipeTests {
  /// nginx with nchan on a free loopback port, its config and temp files in `directory`, its errors in the log.
  final class Nginx {
    let server: LocalServer
    var port: Int { server.ports[0] }
    var url: String { "http://127.0.0.1:\(port)" }

    init(directory: URL) throws {
      let module = "/usr/lib/nginx/modules/ngx_nchan_module.so"
      guard FileManager.default.fileExists(atPath: module) else {
        throw TestSSEClient.Failure(description: "nchan is missing: apt-get install nginx libnginx-mod-nchan")
      }
      let root = directory.path
      let file = directory.appendingPathComponent("nginx.conf")
      server = try LocalServer(
        "nginx", executable: "/usr/sbin/nginx", portCount: 1, directory: directory, timeout: 10 * timingFactor,
        prepare: { ports in
          let config = """
            load_module \(module);
            daemon off;
            # One process: a worker of its own would outlive a SIGKILL of the master and keep Foundation's exit watch.
            master_process off;
            error_log stderr warn;
            pid \(root)/nginx.pid;
            events { worker_connections 256; }
            http {
              access_log off;
              client_body_temp_path \(root)/body;
              proxy_temp_path \(root)/proxy;
              fastcgi_temp_path \(root)/fastcgi;
              uwsgi_temp_path \(root)/uwsgi;
              scgi_temp_path \(root)/scgi;
              server {
                listen 127.0.0.1:\(ports[0]);
                location ~ /pub/(\\w+)$ { nchan_publisher; nchan_channel_id $1; nchan_message_buffer_length 5000; }
                location ~ /sub/(\\w+)$ {
                  nchan_subscriber longpoll; nchan_channel_id $1; nchan_subscriber_first_message oldest;
                  nchan_subscriber_timeout 2s;
                }
              }
            }
            """
          try config.write(to: file, atomically: true, encoding: .utf8)
        },
        arguments: { _ in ["-c", file.path, "-p", root, "-e", "stderr"] },
        ready: { ports in
          let answer = try? run(
            "/usr/bin/curl",
            ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(ports[0])/pub/probe"], timeout: 2)
          return answer?.stdout == "200" || answer?.stdout == "404"
        })
    }

    func publish(_ channel: String, _ body: String, type: String = "text/plain") throws {
      let answer = try run(
        "/usr/bin/curl",
        ["-sf", "-XPOST", "\(url)/pub/\(channel)", "-H", "Content-Type: \(type)", "--data-binary", body])
      if answer.code != 0 { throw TestSSEClient.Failure(description: "nchan publish failed: \(answer.stderr)") }
    }
  }

  static var recipePath: String {
    URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent(
      "../../Config/recipes/nchan.json"
    )
    .standardized.path
  }

  /// The bodies of the message events a client received, in order.
  static func bodies(_ client: TestSSEClient) -> [String] {
    client.events.filter { $0.type == "message" }.compactMap { event in
      (try? RawJSON.parse(event.data))?.resolve(pointer: "/message/body")?.stringValue
    }
  }

  @Test func rawMessagesRelayExactlyOnceAcrossTimeoutsAndAKill() async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("pollcast-nchan-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let nginx = try Nginx(directory: directory)
    let logs = try NodeLogs("pollcast-nchan-logs", nodes: 1)
    defer { logs.remove() }
    let store = directory.appendingPathComponent("relay.db").path
    func relay() throws -> RelayProcess {
      try RelayProcess(
        arguments: [
          "--listen", "127.0.0.1:0", "--upstream-adapter", "recipe", "--upstream-recipe", NchanRecipeTests.recipePath,
          "--store-kind", "sqlite", "--store-path", store, "--upstream-backoff-base-seconds", "0.05",
          "--upstream-backoff-cap-seconds", "0.2", "--log-level", "info",
        ], log: logs.files[0], environment: ["NCHAN_URL": nginx.url, "NCHAN_CHANNEL": "orders"])
    }
    var expected: [String] = []
    var node = try relay()
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    var client = try TestSSEClient(port: node.port)
    for n in 0..<20 {
      let body = n % 2 == 0 ? "plain \(n)" : "{\"n\":\(n)}"
      expected.append(body)
      try nginx.publish("orders", body, type: n % 2 == 0 ? "text/plain" : "application/json")
    }
    var deadline = MonotonicClock.seconds() + 10 * timingFactor
    while NchanRecipeTests.bodies(client).count < expected.count && MonotonicClock.seconds() < deadline {
      _ = try? client.pump(timeout: 0.05)
    }
    var received = NchanRecipeTests.bodies(client)
    // Longer than nchan_subscriber_timeout: held polls end with 408, which the recipe reads as "no news".
    let idle = MonotonicClock.seconds() + 2.5 * timingFactor
    while MonotonicClock.seconds() < idle { _ = try? client.pump(timeout: 0.1) }
    let lastID = client.events.last { $0.hadID && $0.type == "message" }?.lastEventID
    node.kill9()
    for n in 0..<10 {
      expected.append("while down \(n)")
      try nginx.publish("orders", "while down \(n)")
    }
    node = try relay()
    try await waitReady(port: node.port, timeout: 10 * timingFactor)
    client = try TestSSEClient(port: node.port, headers: lastID.map { [("Last-Event-ID", $0)] } ?? [])
    deadline = MonotonicClock.seconds() + 10 * timingFactor
    while NchanRecipeTests.bodies(client).count + received.count < expected.count && MonotonicClock.seconds() < deadline
    {
      _ = try? client.pump(timeout: 0.05)
    }
    received += NchanRecipeTests.bodies(client)
    #expect(received == expected, "exactly once, in order:\n\(received)\n\(logs.tails())")
    let kinds = client.events.filter { $0.type == "message" }.compactMap {
      (try? RawJSON.parse($0.data))?.resolve(pointer: "/message/content_type")?.stringValue
    }
    #expect(kinds.allSatisfy { $0 == "text/plain" }, "\(kinds)")
    let log = logs.tails()
    #expect(!log.contains("backing off"), "a 408 is no news, not a failure: \(log)")
    node.kill9()
  }
}
