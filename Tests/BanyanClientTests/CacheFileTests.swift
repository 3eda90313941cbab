@testable import BanyanClient
import BanyanClientCore
import BanyanTree
import Foundation
import Testing

/// The SDK's cache file on disk (docs/swift-sdk.md, "Offline and persistence").
@Suite struct CacheFileTests {
    @Test("a format 1 file keeps its records, gets the current format's magic before anything is appended, and reads back whole with the new records")
    func upgradesFormatOneInPlace() throws {
        let dir = NSTemporaryDirectory() + "banyan-cachefile-\(UInt64.random(in: 0...UInt64.max))"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let path = dir + "/db.bnycache"
        let write = ClientStore.StoredWrite(number: 2, kind: .set, path: try Path(parsing: "/a"), json: Array("1".utf8))
        let old: [ClientStore.Record] = [.identity(client: 9, nextNumber: 3), .write(write)]
        FileManager.default.createFile(atPath: path, contents: Data(ClientStore.magicFormatOne + old.flatMap { ClientStore.encode($0) }))

        let file = try CacheFile(path: path, budget: 1 << 20)
        #expect(file.restored.formatOne && file.restored.writes == [write])
        let window = ClientStore.Record.query(path: try Path(parsing: "/m"), query: "q", at: .root, json: Array(#"{"x":1}"#.utf8))
        file.append([window])
        file.sync()
        file.close()
        let bytes = Array(try #require(FileManager.default.contents(atPath: path)))
        #expect(Array(bytes.prefix(8)) == ClientStore.magic, "the magic was not upgraded")
        let again = try #require(ClientStore.restore(bytes))
        #expect(!again.formatOne && again.client == 9 && again.writes == [write])
        #expect(again.queries[.init(path: try Path(parsing: "/m"), query: "q")] != nil)
    }
}
