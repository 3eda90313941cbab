/// Banyan's own reading of an HTTP request (NIO's parser delivers the head; everything after is
/// Banyan's): the route, the head-only access check that runs before a body is read, the REST
/// request and its body, the write command it becomes, the realtime upgrade and emulator tokens.
///
/// Input: the method, the target, then `name: value` header lines, each ending in `\n`; an empty
/// line; then the body.
///
/// Invariants: refusals are 4xx/5xx with a message; the head-only access decision (namespace and
/// credentials) is the one the full parse reaches; a parsed write becomes a command that
/// round-trips through the log encoding.
import BanyanREST
import BanyanRules
import BanyanStateMachine
import BanyanTree
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzREST(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { bytes in
        var input = FuzzInput(bytes)
        let method = String(decoding: input.part(until: 0x0A), as: UTF8.self)
        let uri = String(decoding: input.part(until: 0x0A), as: UTF8.self)
        var headers: [(name: String, value: String)] = []
        while !input.rest.isEmpty {
            let line = input.part(until: 0x0A)
            if line.isEmpty { break }
            let colon = line.firstIndex(of: UInt8(ascii: ":")) ?? line.endIndex
            let value = line[colon...].dropFirst().drop { $0 == 0x20 }
            headers.append((String(decoding: line[..<colon], as: UTF8.self), String(decoding: value, as: UTF8.self)))
        }
        checkRequest(HTTPHead(method: method, uri: uri, headers: headers), body: input.remaining)
    }
}

func checkRequest(_ head: HTTPHead, body: [UInt8]) {
    _ = Route.of(method: head.method, uri: head.uri)
    let early = RESTRequest.access(in: head, defaultNamespace: "fuzz")
    let credentials = RESTRequest.authorization(in: head)
    if case .other(let token) = credentials {
        _ = Access.unsignedTokenAuth(token)
    }
    switch RealtimeUpgrade.result(head) {
    case .success(let upgrade): require(RESTRequest.isValidNamespace(upgrade.namespace), "upgrade with an invalid namespace")
    case .failure(let e): require((400..<600).contains(e.status) && !e.message.isEmpty, "bad refusal \(e)")
    }

    switch RESTRequest.parse(head, body: body, defaultNamespace: "fuzz") {
    case .failure(let e):
        require((400..<600).contains(e.status) && !e.message.isEmpty, "bad refusal \(e)")
    case .success(let request):
        require(RESTRequest.isValidNamespace(request.namespace), "accepted an invalid namespace \(request.namespace)")
        // What the server decided from the head alone must be what the whole parse says.
        require(early?.namespace == request.namespace, "head-only namespace \(String(describing: early?.namespace)) differs from \(request.namespace)")
        require(early?.authorization == request.authorization && credentials == request.authorization, "head-only credentials differ")
        require(early?.override == request.authOverride, "head-only override differs")
        checkCommand(request)
        checkAccess(request)
    }
}

/// Rules in force for the access decisions: reads for signed-in users, writes of one's own
/// record (validated), anything under `open`.
let rules: Rules? = try? Rules.parse(
    #"{"rules":{".read":"auth != null","users":{"$uid":{".write":"auth.uid === $uid","age":{".validate":"newData.isNumber() && newData.val() >= 0"}}},"open":{".read":true,".write":true,".indexOn":["h"]}}}"#)
let stored: Tree = (try? TreeReader.read(Array(#"{"users":{"ada":{"age":36}},"open":{"a":{"h":1},"b":{"h":"x"}}}"#.utf8))) ?? .empty

/// The decisions a request's credentials lead to, with and without rules and development
/// tokens; a write the rules judge applies in a state machine holding those rules.
func checkAccess(_ request: RESTRequest) {
    for development in [true, false] {
        let identity = Access.identity(request.authorization, override: request.authOverride, acceptOwnerToken: development, developmentTokens: development)
        if case .refused(let message) = identity { require(!message.isEmpty, "a refusal without a reason") }
        _ = Access.readDenied(identity, rules: rules, allowUnauthenticated: development, at: request.path, query: request.query, tree: stored, now: 1_700_000_000_000)
        _ = Access.readDenied(identity, rules: nil, allowUnauthenticated: development, at: request.path, query: request.query, tree: stored, now: 0)
        guard !Access.writeRefused(identity, hasRules: true, allowUnauthenticated: development),
            case .success(let command) = request.command(pushID: "-NfuzzPushID0000000a")
        else { continue }
        var machine = judged
        let envelope = CommandEnvelope(namespace: "fuzz", session: 9, seq: 1, timestamp: 2_000, command: command, auth: identity.commandAuth)
        _ = machine.apply(envelope.encoded(), index: machine.appliedIndex + 1)
    }
}

/// A state machine with `stored` in namespace `fuzz` and `rules` in force there.
let judged: StateMachine = {
    var machine = StateMachine()
    let text = rules?.text ?? ""
    _ = machine.apply(CommandEnvelope(namespace: "fuzz", session: 1, seq: 1, timestamp: 1, command: .set(path: "/", json: JSONWriter.bytes(stored, format: .export))).encoded(), index: 1)
    _ = machine.apply(CommandEnvelope(namespace: "fuzz", session: 1, seq: 2, timestamp: 1, command: .setRules(text: Array(text.utf8))).encoded(), index: 2)
    return machine
}()

extension RealtimeUpgrade {
    static func result(_ head: HTTPHead) -> Result<RealtimeUpgrade, RESTError> {
        do throws(RESTError) {
            return .success(try parse(head, defaultNamespace: "fuzz"))
        } catch {
            return .failure(error)
        }
    }
}

func checkCommand(_ request: RESTRequest) {
    switch request.operation {
    case .put, .post, .patch, .delete:
        guard case .success(let command) = request.command(pushID: "-NfuzzPushID0000000a") else {
            require(false, "an accepted \(request.operation) has no command")
            return
        }
        let envelope = CommandEnvelope(namespace: request.namespace, session: 1, seq: 1, timestamp: 1, command: command)
        require(CommandEnvelope(decoding: envelope.encoded()) == envelope, "command does not round-trip")
        // A write the head and body checks accepted applies to an empty database (no rules):
        // what the client was told was valid is valid in the log too (a priority needs data at
        // its location, which only the log knows).
        var machine = StateMachine()
        let outcome = machine.apply(envelope.encoded(), index: 1)?.outcome
        switch outcome {
        case .ok?, .datastale?: break
        case .rejected(let e)? where e.code == .emptyLocation && request.isPriority: break
        default: require(false, "an accepted \(request.operation) at \(request.path) applied as \(String(describing: outcome))")
        }
    case .get, .stream, .options:
        break
    }
}
