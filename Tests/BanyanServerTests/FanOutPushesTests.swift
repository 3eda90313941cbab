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
        var fanOut = ListenFanOut()
        fanOut.updates = [.put(path: try Path(parsing: "/hot"), tree: try Tree(json: "1")), .put(path: try Path(parsing: "/cold"), tree: try Tree(json: "2"))]
        fanOut.deliveries = [
            .init(listen: 1, owner: 1, tag: nil, update: 0), .init(listen: 2, owner: 2, tag: nil, update: 0),
            .init(listen: 3, owner: 3, tag: 4, update: 0), .init(listen: 4, owner: 4, tag: 4, update: 0),
            .init(listen: 5, owner: 5, tag: 6, update: 0), .init(listen: 6, owner: 6, tag: nil, update: 1),
        ]
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
