import Foundation
import LegacyFixture
import PollcastCore

let code = await PollcastCommand.run(
  arguments: Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment,
  demo: {
    // --demo: the reference legacy fixture in-process, with a message every two seconds so there is something
    // to watch.
    // Ten extra accounts (users 1000…1009, keys key-1000…) to try per-user relaying (--auth-mode upstream).
    var options = LegacyFixture.Options()
    options.accounts = 10
    let fixture = try await LegacyFixture.start(options)
    await fixture.startChatter(every: 2)
    return PollcastCommand.DemoUpstream(
      url: "http://\(fixture.address)", apiKey: fixture.options.apiKey, stop: { await fixture.shutdown() })
  })
exit(code)
