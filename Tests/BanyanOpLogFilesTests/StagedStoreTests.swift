import BanyanBasics
import BanyanOpLog
import BanyanOpLogFiles
import Foundation
import Testing

/// The staged store (docs/staged-payloads.md): durable only after fsync, rename and directory
/// fsync; damage is reported, never returned.
@Suite struct StagedStoreTests {
    static func payload(_ seed: UInt64, _ count: Int) -> [UInt8] {
        var rng = SeededRandom(seed: seed)
        return (0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    }

    /// What `load` found, short enough to print.
    static func summary(_ loaded: StagedStore.Loaded) -> String {
        switch loaded {
        case .payload(let bytes, let checksum): "payload of \(bytes.count) bytes, CRC32C \(checksum), CRC32C of the bytes \(CRC32C.checksum(bytes))"
        case .missing: "missing"
        case .damaged(let why): "damaged: \(why)"
        }
    }

    static func holds(_ loaded: StagedStore.Loaded, _ expected: [UInt8]) -> Bool {
        loaded == .payload(expected, checksum: CRC32C.checksum(expected))
    }

    @Test("a stored payload lists and loads back with its checksum; removal is durable")
    func storeLoadRemove() throws {
        let fs = SimulatedFileSystem(durableDirectories: ["/data"])
        let store = try StagedStore(directory: "/data/staged", fileSystem: fs)
        let a = StageID(term: 3, n: 1)
        let b = StageID(term: 3, n: 2)
        let bytes = Self.payload(1, 70_000)
        let checksum = try store.store(a, bytes)
        #expect(checksum == CRC32C.checksum(bytes))
        try store.store(b, [])
        #expect(try store.list() == [a, b])
        #expect(Self.holds(store.load(a), bytes), "\(Self.summary(store.load(a)))")
        #expect(Self.holds(store.load(b), []), "\(Self.summary(store.load(b)))")
        #expect(store.load(StageID(term: 9, n: 9)) == .missing)
        // Storing the same id again keeps the file, and syncs it and its directory again (a
        // visible file may be one whose last fsync failed).
        let operations = fs.operations
        #expect(try store.store(a, bytes) == checksum)
        #expect(fs.operations == operations + 2)
        #expect(Self.holds(store.load(a), bytes))
        try store.remove([a, StageID(term: 1, n: 1)])
        fs.reboot()
        let reopened = try StagedStore(directory: "/data/staged", fileSystem: fs)
        #expect(try reopened.list() == [b])
    }

    @Test("a crash at any operation of a store leaves the payload whole and durable, or absent")
    func crashAtEveryOperation() throws {
        let bytes = Self.payload(2, 5_000)
        let id = StageID(term: 2, n: 7)
        var sawAbsent = false
        var sawWhole = false
        for crashAt in 1...12 {
            let fs = SimulatedFileSystem(durableDirectories: ["/data"])
            let store = try StagedStore(directory: "/data/staged", fileSystem: fs)
            fs.crashAtOperation = fs.operations + crashAt
            let stored = (try? store.store(id, bytes)) != nil
            fs.reboot(keepUnsynced: { _, growth in growth / 2 }, keepSector: { _, sector in sector % 2 == 0 })
            let reopened = try StagedStore(directory: "/data/staged", fileSystem: fs)
            switch reopened.load(id) {
            case .payload(let read, _):
                #expect(read == bytes, "crash at \(crashAt): \(read.count) bytes read back")
                sawWhole = true
            case .missing:
                #expect(!stored, "crash at \(crashAt): a store that returned left nothing")
                sawAbsent = true
            case .damaged(let why):
                Issue.record("crash at \(crashAt): damaged (\(why))")
            }
            // No temporary file survives a reopen.
            #expect(try fs.list("/data/staged").allSatisfy { !$0.hasSuffix(".tmp") })
        }
        #expect(sawAbsent && sawWhole)
    }

    @Test("every damaged byte, a short file and a file under another id's name read as damaged")
    func damage() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("staged-\(UInt64.random(in: 1...UInt64.max))").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = try StagedStore(directory: directory, fileSystem: PosixFileSystem())
        let id = StageID(term: 5, n: 1)
        let bytes = Self.payload(3, 300)
        try store.store(id, bytes)
        let path = directory + "/" + id.fileName
        let whole = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
        #expect(whole.count == StagedStore.headerBytes + bytes.count)
        for at in 0..<whole.count where at < 40 || at >= StagedStore.headerBytes {
            var damaged = whole
            damaged[at] ^= 0x10
            try Data(damaged).write(to: URL(fileURLWithPath: path))
            guard case .damaged = store.load(id) else {
                Issue.record("a flipped byte at \(at) was not caught")
                continue
            }
        }
        try Data(whole.dropLast()).write(to: URL(fileURLWithPath: path))
        guard case .damaged = store.load(id) else { Issue.record("a short file was not caught"); return }
        try Data(whole).write(to: URL(fileURLWithPath: directory + "/" + StageID(term: 5, n: 2).fileName))
        guard case .damaged = store.load(StageID(term: 5, n: 2)) else { Issue.record("a file under another id's name was not caught"); return }
        try Data(whole).write(to: URL(fileURLWithPath: path))
        #expect(Self.holds(store.load(id), bytes), "\(Self.summary(store.load(id)))")
    }

    @Test("file names: only <term>-<n>.staged names an id")
    func fileNames() {
        let id = StageID(term: 12, n: 0)
        #expect(StageID(fileName: id.fileName) == id)
        for name in ["12-0.staged.tmp", "12.staged", "12-0-1.staged", "-1.staged", "012-0.staged", "a-0.staged", "12-0.stage", "18446744073709551616-0.staged"] {
            #expect(StageID(fileName: name) == nil, "\(name)")
        }
        #expect(StageID(fileName: "18446744073709551615-18446744073709551615.staged") == StageID(term: .max, n: .max))
    }
}
