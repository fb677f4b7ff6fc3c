// swift-tools-version:6.0
import PackageDescription

let package = Package(
  name: "pollcast",
  platforms: [.macOS(.v15)],
  products: [
    .executable(name: "pollcast", targets: ["pollcast"]),
    .library(name: "PollcastCore", targets: ["PollcastCore"]),
  ],
  targets: [
    .systemLibrary(
      name: "CLibevent",
      pkgConfig: "libevent_pthreads",
      providers: [.apt(["libevent-dev"])]
    ),
    .target(
      name: "PollcastCore",
      dependencies: ["CLibevent"]
    ),
    .executableTarget(
      name: "pollcast",
      dependencies: ["PollcastCore"]
    ),
    .testTarget(
      name: "PollcastCoreTests",
      dependencies: ["PollcastCore"]
    ),
    .testTarget(
      name: "PollcastIntegrationTests",
      dependencies: ["PollcastCore"]
    ),
  ],
  swiftLanguageModes: [.v6]
)
