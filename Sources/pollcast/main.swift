import Foundation
import LegacyFixture
import PollcastCore

let code = await PollcastCommand.run(
  arguments: Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment,
  demo: {
    // --demo: the reference legacy fixture in-process, with a message every two seconds so there is something
    // to watch.
    let fixture = try await LegacyFixture.start()
    await fixture.startChatter(every: 2)
    return PollcastCommand.DemoUpstream(
      url: "http://\(fixture.address)", apiKey: fixture.options.apiKey, stop: { await fixture.shutdown() })
  })
exit(code)
