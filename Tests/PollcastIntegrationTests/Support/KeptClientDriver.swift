import Foundation

@testable import PollcastCore

/// An actor on the client's loop, from which `send` may be called.
actor KeptClientDriver {
  let loop: EventLoop
  let client: UpstreamClient
  nonisolated var unownedExecutor: UnownedSerialExecutor { loop.asUnownedSerialExecutor() }

  init(loop: EventLoop, client: UpstreamClient) {
    self.loop = loop
    self.client = client
  }

  func send(_ request: UpstreamRequest) async -> Result<UpstreamResponse, UpstreamError> {
    do {
      return .success(try await client.send(request))
    } catch {
      return .failure(error)
    }
  }

  /// A client on a loop of its own, started; stop `loop` when done.
  static func make(maxBody: Int = 16 << 20) async throws -> KeptClientDriver {
    let loop = try EventLoop()
    loop.start()
    let transport = try await loop.submit { () throws(UpstreamError) -> CurlTransport in
      let transport = try CurlTransport(loop: loop)
      transport.maxBodyBytes = maxBody
      return transport
    }
    return KeptClientDriver(loop: loop, client: UpstreamClient(transport: transport, interceptors: []))
  }

  func kept() -> Int { client.keptAliveRequests }
  func keptRefusedBecause() -> String? { client.keptRefusedBecause?.description }
  func inFlight() -> Int { client.inFlight }
  func learned() -> [String] { client.transport.addresses.entries.map(\.address) }
  func learn(_ address: String, for name: String, port: Int) {
    client.transport.addresses.entries = [
      LearnedAddress(name: name, port: UInt16(port), address: address, at: MonotonicClock.seconds())
    ]
  }
  func setAddressLifetime(_ seconds: Double) { client.transport.addresses.lifetime = seconds }
}
