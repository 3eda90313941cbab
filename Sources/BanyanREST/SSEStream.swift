public import BanyanQuery
public import BanyanStateMachine
public import BanyanTree

/// One Server-Sent-Events stream (`GET` with `Accept: text/event-stream`; docs/rest.md): the
/// first event is a `put` of the whole value at path `/`; then each applied write that touches
/// the location becomes a `put` (a set at or below it, with the path relative to the stream, or
/// `/` for a set above it) or a `patch` (a multi-path update whose keys are direct children of
/// one location). For a query stream, Banyan re-evaluates the window and sends a `put` per child
/// that entered, changed or left (`null`). Pure: the caller feeds it trees and writes it bytes.
public struct SSEStream: Sendable {
    public let request: RESTRequest
    /// The window last sent, for query streams.
    private var window: Tree = .empty

    public init(request: RESTRequest) {
        self.request = request
    }

    public static func event(_ name: String, _ data: [UInt8]) -> [UInt8] {
        Array("event: \(name)\ndata: ".utf8) + data + Array("\n\n".utf8)
    }

    static func payload(path: String, data: [UInt8]) -> [UInt8] {
        Array("{\"path\":".utf8) + JSONWriter.bytes(Tree(.string(path))) + Array(",\"data\":".utf8) + data + [UInt8(ascii: "}")]
    }

    func json(_ node: Tree) -> [UInt8] { JSONWriter.bytes(node, format: request.export ? .export : .plain) }

    public static func keepAlive() -> [UInt8] { event("keep-alive", Array("null".utf8)) }

    public static func cancel(_ reason: String) -> [UInt8] { event("cancel", JSONWriter.bytes(Tree(.string(reason)))) }

    public static func authRevoked() -> [UInt8] { event("auth_revoked", Array("credential is no longer valid".utf8)) }

    /// The first event: the whole value.
    public mutating func start(tree: Tree) -> [UInt8] {
        let value = RESTRender.value(request, tree: tree)
        window = value
        return Self.event("put", Self.payload(path: "/", data: json(value)))
    }

    /// After the state was replaced wholesale (a snapshot from the leader).
    public mutating func restart(tree: Tree) -> [UInt8] { start(tree: tree) }

    /// The events one applied write causes (none when it does not touch the stream).
    public mutating func applied(_ applied: StateMachine.Applied, tree: Tree) -> [UInt8] {
        guard applied.namespace == request.namespace, applied.outcome == .ok else { return [] }
        let location = request.path
        let touching = applied.written.filter { location.contains($0) || $0.contains(location) }
        guard !touching.isEmpty else { return [] }
        if request.query != nil || request.shallow || request.isPriority { return windowEvents(tree: tree) }
        // A write above the location replaces it whole.
        if touching.contains(where: { $0.contains(location) && $0 != location }) || touching.contains(location) {
            let value = tree.child(at: location)
            return Self.event("put", Self.payload(path: "/", data: json(value)))
        }
        // Writes below the location: one patch when they are children of one parent, else puts.
        if touching.count > 1, let parent = touching[0].parent, touching.allSatisfy({ $0.parent == parent }),
            let relative = location.relative(parent)
        {
            var children: [(ChildKey, Tree)] = []
            for path in touching {
                guard let key = path.last else { continue }
                children.append((key, tree.child(at: path)))
            }
            // Null values must appear in a patch (they delete), so write the object by hand.
            var data: [UInt8] = [UInt8(ascii: "{")]
            for (i, (key, node)) in children.sorted(by: { $0.0 < $1.0 }).enumerated() {
                if i > 0 { data.append(UInt8(ascii: ",")) }
                data += JSONWriter.bytes(Tree(.string(key.string))) + [UInt8(ascii: ":")] + json(node)
            }
            data.append(UInt8(ascii: "}"))
            return Self.event("patch", Self.payload(path: relative.description, data: data))
        }
        var out: [UInt8] = []
        for path in touching {
            guard let relative = location.relative(path) else { continue }
            out += Self.event("put", Self.payload(path: relative.description, data: json(tree.child(at: path))))
        }
        return out
    }

    /// Query, shallow and priority streams: compare the new window with the last one sent.
    private mutating func windowEvents(tree: Tree) -> [UInt8] {
        let next = RESTRender.value(request, tree: tree)
        defer { window = next }
        if next == window { return [] }
        guard next.hasChildren && window.hasChildren else {
            return Self.event("put", Self.payload(path: "/", data: json(next)))
        }
        var keys: [ChildKey] = []
        var seen = Set<ChildKey>()
        window.children.forEach { k, _ in if seen.insert(k).inserted { keys.append(k) } }
        next.children.forEach { k, _ in if seen.insert(k).inserted { keys.append(k) } }
        var out: [UInt8] = []
        for key in keys.sorted() {
            let before = window.child(key)
            let after = next.child(key)
            if before != after {
                out += Self.event("put", Self.payload(path: "/" + key.string, data: json(after)))
            }
        }
        return out
    }
}
