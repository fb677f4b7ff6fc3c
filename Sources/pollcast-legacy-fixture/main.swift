import Foundation
import LegacyFixture

let code = await FixtureCommand.run(arguments: Array(CommandLine.arguments.dropFirst()))
exit(code)
