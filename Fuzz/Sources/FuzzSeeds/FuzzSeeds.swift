/// Writes the encoded seeds of the binary fuzz targets into `Corpus/<target>/seed-*`, from the
/// formats' own encoders (the text targets' seeds are committed as written). Run from `Fuzz/`:
///
///     swift run -c release --scratch-path .build/seeds FuzzSeeds
///
/// (a scratch path of its own: this is an ordinary build, not an instrumented one).
import BanyanBasics
import BanyanOpLog
import BanyanRaft
import BanyanStateMachine
import BanyanTree

#if canImport(Glibc)
    import Glibc
#endif

@main
struct FuzzSeeds {
    static func main() {
        let trees = [
            #"{"users":{"ada":{"age":36,"name":"Ada","tags":[1,2.5,"x",true]}},".priority":3}"#,
            #"{"a":{".value":"s",".priority":"p"},"b":-0.5,"c":1e300,"d":"\u00e9\ud83d\ude00","e":9007199254740993}"#,
            #""leaf""#, "12", "true",
        ].compactMap { try? TreeReader.read(Array($0.utf8)) }

        // Peer messages (selector 0), hellos (1), replies (2), a framed stream (3).
        let membership = Membership(voters: [1, 2, 3], learners: [9], incarnations: [1: 7, 9: 1])
        let entries = [
            LogEntry(index: 1, term: 1, kind: .config(membership)), LogEntry(index: 2, term: 1, kind: .noop),
            LogEntry(index: 3, term: 2, kind: .command, data: command(.set(path: "/a", json: Array("1".utf8)))),
        ]
        let meta = SnapshotMeta(index: 40, term: 3, membership: membership)
        let bodies: [Message.Body] = [
            .preVote(lastIndex: 5, lastTerm: 2, voterIncarnation: 3), .preVoteResponse(granted: true),
            .vote(lastIndex: 3, lastTerm: 1, leaderTransfer: true), .voteResponse(granted: false),
            .append(prevIndex: 4, prevTerm: 2, entries: entries, commit: 3), .appendAccepted(index: 9, mayVote: false),
            .appendRejected(rejectedIndex: 9, hintIndex: 4, hintTerm: 1), .heartbeat(commit: 8, readSeq: 12, commitTerm: 3),
            .heartbeatResponse(readSeq: 12), .snapshotChunk(meta: meta, offset: 0, data: [1, 2, 3], last: true),
            .snapshotResponse(snapshotIndex: 40, nextOffset: 3), .proposal(commands: [[1], [2, 3]]), .readIndex(context: 7),
            .readIndexResponse(context: 7, index: 40), .timeoutNow,
        ]
        let messages = bodies.enumerated().map { Message(from: 1, to: 2, term: UInt64($0.offset + 1), body: $0.element) }
        var peer: [[UInt8]] = messages.map { [0] + MessageCodec.encode($0) }
        let hello = PeerHello(clusterID: "cluster-1", from: 1, to: 2, protocolVersion: 3, address: "10.0.0.1:7000", incarnation: 5)
        peer.append([1] + hello.encode())
        peer.append([2] + PeerHelloReply(accepted: false, reason: "another cluster", protocolVersion: 3).encode())
        var stream = Framing.frame(hello.encode())
        for m in messages.prefix(5) { Framing.appendFrame(m, to: &stream) }
        peer.append([3] + stream)
        write("peer", peer)

        // Log segments: version 2 with records and a marker, version 1, a torn and a zero tail;
        // selectors cover last/expected/repair/payload combinations; and hard states.
        let records = (1...4).map { LogRecord(index: UInt64($0), term: 1, kind: UInt8($0 % 3), payload: Array(repeating: UInt8($0), count: $0 * 3)) }
        var v2 = LogFormat.segmentHeader
        for (i, record) in records.enumerated() {
            LogFormat.encode(record, into: &v2)
            if i == 1 { v2 += LogFormat.encode(SyncMarker(syncedThrough: v2.count, spanStart: 8, spanEnd: v2.count)) }
        }
        let v1 = LogFormat.segmentHeaderV1 + LogFormat.encode(records)
        var log: [[UInt8]] = [[0x0B] + v2, [0x0F] + v2, [0x0A] + v1, [0x09] + v2.dropLast(5), [0x0B] + v2 + [UInt8](repeating: 0, count: 64)]
        log.append([0x10] + HardStateRecord(term: 3, vote: 2, commit: 9, mayVote: true).encoded)
        write("log", log)

        // Snapshot images: tree images (0), state-machine images (1), snapshot files (2), streamed (3).
        var snapshot: [[UInt8]] = trees.map { [0] + TreeImage.bytes($0) }
        snapshot.append([3] + TreeImage.bytes(trees[0]))
        snapshot.append([1] + sampleMachine().image())
        let trailer = SnapshotFormat.Trailer(
            metadata: SnapshotMetaRecord(lastIndex: 40, lastTerm: 3, membership: [1, 2, 3]), imageLength: 99, imageChecksum: 0xDEAD_BEEF)
        snapshot.append([2] + SnapshotFormat.header + [0x78, 0x9C, 1, 2, 3] + SnapshotFormat.encode(trailer))
        write("snapshot", snapshot)

        // Commands: one of each kind, and a sequence of several.
        let commands: [CommandEnvelope] = [
            envelope(.set(path: "/open/x", json: Array(#"{"a":1,"b":{".sv":"timestamp"}}"#.utf8))),
            envelope(.update(path: "/open", entries: [.init(path: "n", json: Array(#"{".sv":{"increment":2}}"#.utf8)), .init(path: "m/k", json: Array("null".utf8))])),
            envelope(.compareAndSet(path: "/open/n", expectedHash: "", json: Array("5".utf8))),
            envelope(.onDisconnectSet(path: "/open/bye", json: Array("1".utf8), secret: 3, holder: 5)),
            envelope(.onDisconnectUpdate(path: "/open", entries: [.init(path: "q", json: Array("2".utf8))], secret: 3)),
            envelope(.onDisconnectCancel(path: "/open", secret: 3)), envelope(.connectionEnded(connection: 7, secret: 99)),
            envelope(.renewLease(holder: 5, node: 2)), envelope(.expireHolder(holder: 5, lastRenewal: 4)),
            envelope(.setRules(text: Array(#"{"rules":{".read":true,".write":"auth != null"}}"#.utf8))),
            CommandEnvelope(
                namespace: "fuzz", session: 3, seq: 1, timestamp: 5, settledBelow: 1, ordered: true,
                command: .set(path: "/users/ada/age", json: Array("37".utf8)), auth: .user(json: Array(#"{"uid":"ada"}"#.utf8))),
        ]
        var commandSeeds = commands.map { $0.encoded() }
        commandSeeds.append(commands.prefix(4).map { $0.encoded() }.joined(separator: [0] + Array("CMDSEP".utf8) + [0]).map { $0 })
        write("command", commandSeeds)
    }

    static func command(_ c: Command) -> [UInt8] { envelope(c).encoded() }

    static func envelope(_ c: Command) -> CommandEnvelope {
        CommandEnvelope(namespace: "fuzz", session: 2, seq: 1, timestamp: 1_700_000_000_000, command: c)
    }

    static func sampleMachine() -> StateMachine {
        var machine = StateMachine()
        let setup: [Command] = [
            .set(path: "/", json: Array(#"{"a":{"b":1},"list":[1,2]}"#.utf8)),
            .onDisconnectSet(path: "/a/c", json: Array("true".utf8), secret: 9, holder: 4), .renewLease(holder: 4, node: 1),
        ]
        for (i, c) in setup.enumerated() {
            _ = machine.apply(CommandEnvelope(namespace: "fuzz", session: UInt64(i + 1), seq: 1, timestamp: 10, command: c).encoded(), index: UInt64(i + 1))
        }
        return machine
    }

    static func write(_ target: String, _ seeds: [[UInt8]]) {
        for (i, seed) in seeds.enumerated() {
            let path = "Corpus/\(target)/seed-\(i)"
            guard let file = fopen(path, "wb") else {
                print("cannot write \(path) (run from Fuzz/)")
                exit(1)
            }
            _ = seed.withUnsafeBytes { fwrite($0.baseAddress, 1, $0.count, file) }
            fclose(file)
        }
        print("\(target): \(seeds.count) seeds")
    }
}
