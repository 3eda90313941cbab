import BanyanListen
@testable import BanyanServer
import BanyanTree
import NIOCore
import Testing

/// The hub's rendering of a fan-out: once per update for untagged listens, once per update and
/// tag for tagged ones, and the same bytes (the same buffers) for every connection sharing it.
@Suite struct FanOutPushesTests {
    @Test("listeners of one update share one rendering and its buffers; another tag or update gets its own")
    func sharing() throws {
        // Listens 1-2 default at /hot, 3-4 tagged 4 (a query that loads all data: the same
        // update), 5 tagged 6, 6 default at /cold; one write to both paths.
        var core = ListenCore()
        var root = try Tree(json: #"{"hot":0,"cold":0}"#)
        let hot = try Path(parsing: "/hot")
        let cold = try Path(parsing: "/cold")
        for (id, location, tag) in [(1, hot, nil), (2, hot, nil), (3, hot, 4), (4, hot, 4), (5, hot, 6), (6, cold, nil)] as [(UInt64, Path, UInt64?)] {
            _ = try core.listen(Listen(id: id, owner: id, namespace: "ns", path: location, tag: tag), tree: root)
        }
        root.set(try Tree(json: "1"), at: hot)
        root.set(try Tree(json: "2"), at: cold)
        let fanOut = core.fanOut(namespace: "ns", written: [hot, cold], tree: root)
        #expect(fanOut.deliveries.map(\.listen) == [1, 2, 3, 4, 5, 6])
        #expect(fanOut.updates.count == 2)
        var pushes = FanOutPushes(fanOut)
        let made = fanOut.deliveries.map { pushes.push(for: $0) }
        #expect(pushes.renders == 4)
        #expect(made[0] === made[1])
        #expect(made[2] === made[3])
        #expect(made[0] !== made[2] && made[2] !== made[4] && made[0] !== made[5])
        #expect(String(decoding: made[0].message, as: UTF8.self) == #"{"t":"d","d":{"a":"d","b":{"p":"hot","d":1}}}"#)
        #expect(String(decoding: made[2].message, as: UTF8.self) == #"{"t":"d","d":{"a":"d","b":{"p":"hot","d":1,"t":4}}}"#)
        #expect(String(decoding: made[5].message, as: UTF8.self) == #"{"t":"d","d":{"a":"d","b":{"p":"cold","d":2}}}"#)
        // Every connection of one encoding is handed the same buffers.
        let codec = DeflateCodec()
        let allocator = ByteBufferAllocator()
        let a = made[0].frames(.plain, codec: codec, allocator: allocator)
        let b = made[1].frames(.plain, codec: codec, allocator: allocator)
        func address(_ buffer: ByteBuffer) -> UInt { buffer.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) } }
        #expect(a.count == 1 && a.map(address) == b.map(address))
    }
}
