/// The realtime protocol after the WebSocket layer (NIO delivers whole text messages): frame
/// counts and reassembly (`FrameAssembler`), the v5 message reader, and a whole session
/// (`SessionCore`) answering what it asks the node for, under small limits so they are reached.
///
/// Input: frames separated by 0xFF (a byte that never occurs in UTF-8). A frame starting with
/// 0xFE is instead a clock tick of that many seconds (keep-alive paths).
///
/// Invariants: memory held for a message stays within its limit; a dropped message keeps at most
/// its prefix; listens and unanswered requests stay within their limits; every request the
/// session hands to the node is answered once; a server message split into frames reassembles
/// to itself.
import BanyanQuery
import BanyanSession
import BanyanStateMachine
import BanyanTree
import FuzzSupport

let limits = SessionCore.Limits(
    maxListens: 4, readPauseRequests: 3, maxPendingRequests: 6,
    frames: FrameAssembler.Limits(maxFrameBytes: 600, maxMessageBytes: 1_000, maxFramesPerMessage: 8))

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWebSocket(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { bytes in
        let frames = FuzzInput(bytes).parts(separator: 0xFF)
        checkAssembler(frames)
        checkSession(frames)
        checkSplitter(bytes)
    }
}

/// Limits small enough that short inputs reach every one of them.
let tiny = FrameAssembler.Limits(maxFrameBytes: 48, maxMessageBytes: 96, maxFramesPerMessage: 4)

func checkAssembler(_ frames: [[UInt8]]) {
    for limits in [tiny, limits.frames] { checkAssembler(frames, limits) }
}

func checkAssembler(_ frames: [[UInt8]], _ limits: FrameAssembler.Limits) {
    var assembler = FrameAssembler(limits: limits)
    for frame in frames {
        let received: FrameAssembler.Received
        do {
            received = try assembler.receive(frame)
        } catch {
            require(frame.count > limits.maxFrameBytes, "refused a frame within the limit")
            continue
        }
        require(assembler.heldBytes <= limits.maxMessageBytes, "holds \(assembler.heldBytes) bytes")
        switch received {
        case .keepAlive, .partial:
            break
        case .message(let message):
            require(message.count <= limits.maxMessageBytes, "a message over the limit was delivered")
            if case .request(let r)? = try? MessageReader.read(message) { _ = r.action }
        case .tooLarge(let prefix, _):
            require(prefix.count <= FrameAssembler.prefixBytes, "a dropped message kept \(prefix.count) bytes")
            _ = MessageReader.requestNumber(inPrefix: prefix)
        }
    }
}

func checkSession(_ frames: [[UInt8]]) {
    var session = SessionCore(timestamp: 1_700_000_000_000, host: "fuzz.local", sessionID: "s1", limits: limits)
    var now: Int64 = 1_700_000_000_000
    var open: [SessionCore.ListenID: ListenSpec] = [:]
    var unanswered: [Int64] = []
    func handle(_ outputs: [SessionCore.Output]) {
        var next: [SessionCore.Output] = []
        for output in outputs {
            switch output {
            case .listen(let id, let spec):
                require(open[id] == nil, "\(id) started twice")
                open[id] = spec
                if let q = spec.query { _ = try? QueryParams(wire: q) }
                next += session.listenStarted(id)
            case .unlisten(let id):
                require(open.removeValue(forKey: id) != nil, "\(id) stopped but never started")
            case .write(let request, let write, let client):
                unanswered.append(request)
                checkWrite(write)
                if let client { require(client.number > 0 && client.acknowledgedBelow > 0 && client.acknowledgedBelow <= client.number, "a client write number out of range") }
            case .get(let request, _, _), .authenticate(let request, _, _):
                unanswered.append(request)
            case .send(let message):
                require(!FrameSplitter.frames(message).isEmpty, "a message with no frames")
            case .unauthenticate, .stats, .pauseReading, .resumeReading, .close, .ping:
                break
            }
        }
        require(open.count <= limits.maxListens, "\(open.count) listens open")
        if !next.isEmpty { handle(next) }
    }
    for frame in frames {
        if frame.first == 0xFE {
            now += Int64(frame.count) * 1_000
            handle(session.tick(now: now))
            continue
        }
        session.heard(at: now)
        handle(session.receive(frame: frame))
        require(session.assemblingBytes <= limits.frames.maxMessageBytes, "assembling \(session.assemblingBytes) bytes")
        require(session.unansweredCount <= limits.maxPendingRequests + 1, "\(session.unansweredCount) requests unanswered")
        // The node answers every other request at once, the rest later.
        if unanswered.count > 1, let number = unanswered.first {
            unanswered.removeFirst()
            handle(session.answer(request: number, status: "ok", data: Array("null".utf8)))
        }
    }
    for number in unanswered { handle(session.answer(request: number, status: "ok", data: Array("null".utf8))) }
    handle(session.ended())
    require(open.isEmpty || session.isClosed, "listens left open after the end")
}

/// Splitting is the server's side: any valid UTF-8 message, cut into frames (with small chunks,
/// so that counts appear), reassembles to itself.
func checkSplitter(_ bytes: [UInt8]) {
    guard String(validating: bytes, as: UTF8.self) != nil, !bytes.isEmpty else { return }
    let frames = FrameSplitter.frames(bytes, chunkUnits: 7, maxChunks: 50)
    var assembler = FrameAssembler(limits: FrameAssembler.Limits(maxFrameBytes: 1 << 20, maxMessageBytes: 1 << 20, maxFramesPerMessage: 1 << 20))
    var result: [UInt8]?
    for frame in frames {
        require(String(validating: frame, as: UTF8.self) != nil, "a frame cut inside a scalar")
        switch try? assembler.receive(frame) {
        case .message(let m)?: result = m
        case .partial?: break
        default: require(false, "a split message was not reassembled")
        }
    }
    require(result == bytes, "split then reassembled differs")
}

/// A write the session validated before proposing applies to an empty database (no rules): the
/// client is never told a write was accepted that the log then refuses (but for a priority on a
/// location without data, which only the log knows).
func checkWrite(_ write: SessionCore.Write) {
    guard case .success(let command) = SessionWrites.command(for: write, secret: 1, holder: 0) else { return }
    let envelope = CommandEnvelope(namespace: "fuzz", session: 5, seq: 1, timestamp: 1_700_000_000_000, command: command)
    require(CommandEnvelope(decoding: envelope.encoded()) == envelope, "command does not round-trip")
    var machine = StateMachine()
    let outcome = machine.apply(envelope.encoded(), index: 1)?.outcome
    switch (outcome, write) {
    case (.ok?, _), (.datastale?, _): break
    case (.rejected(let e)?, .put(let path, _, _)) where e.code == .emptyLocation && path.isPriority: break
    default: require(false, "a validated \(write) applied as \(String(describing: outcome))")
    }
}
