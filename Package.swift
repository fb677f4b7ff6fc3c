// swift-tools-version:6.0
import PackageDescription

let package = Package(
  name: "pollcast",
  platforms: [.macOS(.v15)],
  products: [
    .executable(name: "pollcast", targets: ["pollcast"]),
    .executable(name: "pollcast-legacy-fixture", targets: ["pollcast-legacy-fixture"]),
    .executable(name: "pollcast-bench", targets: ["pollcast-bench"]),
    .library(name: "PollcastCore", targets: ["PollcastCore"]),
  ],
  targets: [
    .systemLibrary(
      name: "CLibevent",
      pkgConfig: "libevent_pthreads",
      providers: [.apt(["libevent-dev"])]
    ),
    .systemLibrary(
      name: "CCurl",
      pkgConfig: "libcurl",
      providers: [.apt(["libcurl4-openssl-dev"])]
    ),
    .systemLibrary(
      name: "CJWT",
      pkgConfig: "libjwt",
      providers: [.apt(["libjwt-dev"])]
    ),
    .systemLibrary(
      name: "CSQLite",
      pkgConfig: "sqlite3",
      providers: [.apt(["libsqlite3-dev"])]
    ),
    .systemLibrary(
      name: "CHiredis",
      pkgConfig: "hiredis",
      providers: [.apt(["libhiredis-dev"])]
    ),
    .systemLibrary(
      name: "CSSL",
      pkgConfig: "libcrypto",
      providers: [.apt(["libssl-dev"])]
    ),
    .target(
      name: "PollcastCore",
      dependencies: ["CLibevent", "CCurl", "CJWT", "CSQLite", "CHiredis", "CSSL"]
    ),
    .target(
      name: "LegacyFixture",
      dependencies: ["PollcastCore"]
    ),
    .executableTarget(
      name: "pollcast-legacy-fixture",
      dependencies: ["LegacyFixture"]
    ),
    .target(
      name: "PollcastBench",
      dependencies: ["PollcastCore", "CLibevent", "CJWT", "LegacyFixture"]
    ),
    .executableTarget(
      name: "pollcast-bench",
      dependencies: ["PollcastBench"]
    ),
    .executableTarget(
      name: "pollcast",
      dependencies: ["PollcastCore", "LegacyFixture"]
    ),
    .testTarget(
      name: "PollcastCoreTests",
      dependencies: ["PollcastCore", "PollcastBench"]
    ),
    .testTarget(
      name: "PollcastIntegrationTests",
      dependencies: ["PollcastCore", "LegacyFixture"]
    ),
  ],
  swiftLanguageModes: [.v6]
)
