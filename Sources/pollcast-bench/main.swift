import Foundation
import PollcastBench
import PollcastCore

let options: BenchOptions
do {
  options = try BenchOptions.parse(Array(CommandLine.arguments.dropFirst()))
} catch let error as BenchError {
  if error.description == "help" {
    print(BenchOptions.usage)
    exit(0)
  }
  FileHandle.standardError.write(Data("Error: \(error)\n\n\(BenchOptions.usage)\n".utf8))
  exit(64)
}
if options.mode == .store {
  do {
    print(try StoreBench.run(options))
    exit(0)
  } catch {
    FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
    exit(1)
  }
}
let loop = try EventLoop()
loop.start()
do {
  let summary = try await BenchRunner(options: options, loop: loop).run()
  print(summary)
  exit(0)
} catch {
  FileHandle.standardError.write(Data("Error: \(error)\n".utf8))
  exit(1)
}
