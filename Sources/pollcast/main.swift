import Foundation
import PollcastCore

let code = await PollcastCommand.run(
  arguments: Array(CommandLine.arguments.dropFirst()), environment: ProcessInfo.processInfo.environment)
exit(code)
