// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Sofa",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "sofa", targets: ["sofa"]),
        .library(name: "DocumentStore", targets: ["DocumentStore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", exact: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", exact: "1.16.2"),
        .package(url: "https://github.com/apple/swift-nio", exact: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl", exact: "2.37.6"),
        .package(url: "https://github.com/weichsel/ZIPFoundation", exact: "0.9.20"),
    ],
    targets: [
        // System libraries: one modulemap + shim each, imported by exactly one Swift module.
        .systemLibrary(name: "CSQLite3", path: "Sources/CSQLite3", pkgConfig: "sqlite3",
                       providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CCrypto", path: "Sources/CCrypto", pkgConfig: "libcrypto",
                       providers: [.apt(["libssl-dev"])]),
        .systemLibrary(name: "CGzip", path: "Sources/CGzip", pkgConfig: "zlib",
                       providers: [.apt(["zlib1g-dev"])]),
        .systemLibrary(name: "CLinux", path: "Sources/CLinux"),
        .systemLibrary(name: "CCurl", path: "Sources/CCurl", pkgConfig: "libcurl",
                       providers: [.apt(["libcurl4-openssl-dev"])]),
        .systemLibrary(name: "CFuse3", path: "Sources/CFuse3", pkgConfig: "fuse3",
                       providers: [.apt(["libfuse3-dev"])]),

        // ICU (libicu-dev) behind plain C functions: Foundation's own ICU headers clash with it.
        .target(name: "CUnicode", linkerSettings: [.linkedLibrary("icui18n"), .linkedLibrary("icuuc")]),

        // A VFS shim that seals SQLite's pages with AES-256-GCM (libsqlite3, libcrypto); see
        // docs/encryption.md. Debian's SQLCipher is built on SQLite 3.15, too old for Sofa.
        .target(name: "CSeal", linkerSettings: [.linkedLibrary("sqlite3"), .linkedLibrary("crypto")]),

        .target(name: "DocumentModel", dependencies: ["CCrypto", "CUnicode"]),
        // BLIP, Couchbase Lite's replication transport: frames, messages, flow control.
        .target(name: "BLIP", dependencies: [
            "CGzip", .product(name: "NIOCore", package: "swift-nio"), .product(name: "NIOWebSocket", package: "swift-nio"),
            .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
        ]),
        // Couchbase Lite's replication over BLIP, one engine for the server's and the client's side.
        .target(name: "BLIPReplication", dependencies: [
            "DocumentModel", "DocumentStore", "BLIP",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "NIOWebSocket", package: "swift-nio"),
            .product(name: "NIOSSL", package: "swift-nio-ssl"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "QueryServer", dependencies: ["DocumentModel", "CLinux"]),
        .target(name: "DocumentStore", dependencies: [
            "DocumentModel", "QueryServer", "CSQLite3", "CSeal", "CCrypto", "CGzip", "CLinux",
            .product(name: "ZIPFoundation", package: "ZIPFoundation"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The mount's own tables (staged files, local attributes), over the store's connection.
        .target(name: "MountTables", dependencies: [
            "DocumentModel", "DocumentStore", .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "FuseKit", dependencies: ["CFuse3", .product(name: "Logging", package: "swift-log")]),
        .target(name: "DocumentFS", dependencies: [
            "DocumentModel", "DocumentStore", "MountTables", "FuseKit",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .target(name: "CouchServer", dependencies: [
            "DocumentModel", "DocumentStore", "CCrypto", "BLIP", "BLIPReplication",
            .product(name: "NIOCore", package: "swift-nio"),
            .product(name: "NIOPosix", package: "swift-nio"),
            .product(name: "NIOHTTP1", package: "swift-nio"),
            .product(name: "NIOWebSocket", package: "swift-nio"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // HTTP on libcurl: remote URLs, the client, retries, cancellation, transport errors.
        .target(name: "HTTPTransport", dependencies: ["DocumentModel", "CCurl"]),
        .target(name: "Replicator", dependencies: [
            "DocumentModel", "DocumentStore", "HTTPTransport", "BLIPReplication",
            .product(name: "Logging", package: "swift-log"),
        ]),
        .executableTarget(name: "sofa", dependencies: [
            "DocumentModel", "DocumentStore", "DocumentFS", "FuseKit", "CouchServer", "HTTPTransport", "Replicator",
            .product(name: "ArgumentParser", package: "swift-argument-parser"),
            .product(name: "Logging", package: "swift-log"),
        ]),
        // The JavaScript query server: SpiderMonkey 102 (libmozjs-102-dev). Its pkg-config file
        // is broken in Debian 12 (an unexpanded @NSPR_CFLAGS@), so the flags are given here; its
        // headers refuse DEBUG, which SwiftPM defines in debug builds.
        .executableTarget(name: "sofa-js",
                          cxxSettings: [.unsafeFlags(["-isystem", "/usr/include/mozjs-102", "-UDEBUG", "-std=c++17", "-Wno-invalid-offsetof"])],
                          linkerSettings: [.linkedLibrary("mozjs-102")]),
        .executableTarget(name: "sofa-bench", dependencies: ["DocumentModel", "DocumentStore"]),

        // Helpers shared by the test targets: temporary directories, subprocesses, fixtures.
        .target(name: "TestSupport", dependencies: ["DocumentModel", "DocumentStore"], path: "Tests/TestSupport"),
        .testTarget(name: "DocumentModelTests", dependencies: ["DocumentModel", "TestSupport"]),
        .testTarget(name: "DocumentStoreTests", dependencies: ["DocumentModel", "DocumentStore", "MountTables", "TestSupport"]),
        .testTarget(name: "SofaCLITests", dependencies: ["DocumentModel", "DocumentStore", "TestSupport"]),
        .testTarget(name: "DocumentFSTests", dependencies: ["DocumentModel", "DocumentStore", "MountTables", "DocumentFS", "FuseKit", "TestSupport"]),
        .testTarget(name: "CouchServerTests", dependencies: ["DocumentModel", "DocumentStore", "CouchServer", "BLIP", "CGzip", "TestSupport"]),
        .testTarget(name: "ReplicatorTests", dependencies: [
            "DocumentModel", "DocumentStore", "HTTPTransport", "Replicator", "TestSupport",
            .product(name: "ZIPFoundation", package: "ZIPFoundation"),  // to make damaged snapshots
        ]),
    ]
)
