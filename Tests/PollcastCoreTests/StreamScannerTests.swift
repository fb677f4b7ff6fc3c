import Testing

@testable import PollcastBench

@Suite struct StreamScannerTests {
  private func scan(_ text: String, splitAt split: Int? = nil) -> (StreamScanner, [StreamScanner.Event]) {
    var scanner = StreamScanner()
    var events: [StreamScanner.Event] = []
    let bytes = Array(text.utf8)
    let cut = split ?? bytes.count
    for part in [bytes[..<cut], bytes[cut...]] {
      Array(part).withUnsafeBytes { scanner.feed($0) { events.append($0) } }
    }
    return (scanner, events)
  }

  private let pollcastStream =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + "10\r\n: pollcast 0.1\n\n\r\n"
    + "5d\r\nid: 77\ndata: {\"stream\":\"101\",\"message\":{\"id\":1,\"text\":\"bench 3 1700000000000001\"},\"x\":0}\n\n\r\n"

  @Test func findsTheMarkerInsideChunkedJSONWhereverTheBytesSplit() {
    let total = pollcastStream.utf8.count
    for split in 0...total {
      let (scanner, events) = scan(pollcastStream, splitAt: split)
      #expect(events == [.init(sequence: 3, sentMicros: 1_700_000_000_000_001)], "split at \(split)")
      #expect(scanner.status == 200)
      #expect(scanner.lastEventID == Array("77".utf8))
    }
  }

  @Test func readsUnchunkedBodiesAndRawTextData() {
    let nchan = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n: hi\n\nid: 1795:0\ndata: bench 12 99\n\n"
    let (scanner, events) = scan(nchan)
    #expect(events == [.init(sequence: 12, sentMicros: 99)])
    #expect(scanner.lastEventID == Array("1795:0".utf8))
  }

  @Test func ignoresDataWithoutTheMarkerAndNonSuccessHeads() {
    let (scanner, events) = scan("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
    #expect(scanner.status == 403)
    #expect(events.isEmpty)
    let (_, none) = scan("HTTP/1.1 200 OK\r\n\r\ndata: hello\n\nid: 5\ndata: bench x\n\n")
    #expect(none.isEmpty)
  }
}
