public import BanyanListen
public import BanyanQuery
public import BanyanTree

/// One Server-Sent-Events stream (`GET` with `Accept: text/event-stream`; docs/rest.md), rendered
/// from the updates of its listen in the node's one listen core (`ListenCore`, shared with the
/// WebSocket protocol; docs/realtime.md): the first event is a `put` of the whole value at path
/// `/`; then a `put` of a location's new value (the path relative to the stream, `/` for the
/// stream's own location), or a `patch` when a multi-path update changed direct children of one
/// location (keys deeper than one level go as separate `put`s). A query stream's window is kept
/// by the listen core: children that enter, change or leave it get a `put` each (`null` when
/// leaving), changed children within it a `patch`. Priority streams listen to the whole location
/// and send what their rendering of it changed. Pure: the caller feeds it updates and trees and writes it bytes.
public struct SSEStream: Sendable {
    public let request: RESTRequest
    /// The last value sent: for query streams the window, for priority streams the rendering.
    private var window: Tree = .empty

    public init(request: RESTRequest) {
        self.request = request
    }

    /// Shallow and priority streams render the location themselves (the listen core keeps no
    /// such views): they listen to the whole location.
    public var rendersItself: Bool { request.shallow || request.isPriority }

    /// The query the stream's listen holds (nil: the whole location).
    public var listenParams: QueryParams? { rendersItself ? nil : request.query }

    public static func event(_ name: String, _ data: [UInt8]) -> [UInt8] {
        Array("event: \(name)\ndata: ".utf8) + data + Array("\n\n".utf8)
    }

    static func payload(path: String, data: [UInt8]) -> [UInt8] {
        Array("{\"path\":".utf8) + JSONWriter.bytes(Tree(.string(path))) + Array(",\"data\":".utf8) + data + [UInt8(ascii: "}")]
    }

    func json(_ subtree: Tree) -> [UInt8] { JSONWriter.bytes(subtree, format: request.export ? .export : .plain) }

    public static func keepAlive() -> [UInt8] { event("keep-alive", Array("null".utf8)) }

    public static func cancel(_ reason: String) -> [UInt8] { event("cancel", JSONWriter.bytes(Tree(.string(reason)))) }

    public static func authRevoked() -> [UInt8] { event("auth_revoked", Array("credential is no longer valid".utf8)) }

    /// The first event: the listen's first update (the whole value, or the window), or, for a
    /// stream that renders itself, its rendering of `tree` (the namespace's root).
    public mutating func start(first: ListenUpdate, tree: Tree) -> [UInt8] {
        if rendersItself {
            window = RESTRender.value(request, tree: tree)
            return Self.event("put", Self.payload(path: "/", data: json(window)))
        }
        guard case .put(_, let value) = first else { return update(first, tree: tree) }
        if listenParams != nil { window = value }
        return Self.event("put", Self.payload(path: "/", data: json(value)))
    }

    /// The events one update of the stream's listen causes; `tree` is the namespace's root after
    /// the write.
    public mutating func update(_ update: ListenUpdate, tree: Tree) -> [UInt8] {
        if rendersItself { return changes(to: RESTRender.value(request, tree: tree)) }
        let location = request.path
        if listenParams != nil {
            // A window: the listen core sends it whole when children enter or leave it (what a
            // tagged v5 listen needs); a stream sends only the children that changed.
            switch update {
            case .put(let path, let value) where path == location:
                return changes(to: value)
            case .merge(let path, let children) where path == location:
                for child in children { window = window.setting(child.tree, at: child.path) }
            default:
                break
            }
        }
        switch update {
        case let .put(path, value):
            return Self.event("put", Self.payload(path: relative(path, to: location), data: json(value)))
        case let .merge(path, children):
            if children.allSatisfy({ $0.path.count == 1 }) {
                // Null values must appear in a patch (they delete), so the object is written by hand.
                var data: [UInt8] = [UInt8(ascii: "{")]
                for (i, child) in children.sorted(by: { $0.path.segments[0] < $1.path.segments[0] }).enumerated() {
                    if i > 0 { data.append(UInt8(ascii: ",")) }
                    data += JSONWriter.bytes(Tree(.string(child.path.segments[0].string))) + [UInt8(ascii: ":")] + json(child.tree)
                }
                data.append(UInt8(ascii: "}"))
                return Self.event("patch", Self.payload(path: relative(path, to: location), data: data))
            }
            var out: [UInt8] = []
            for child in children {
                out += Self.event("put", Self.payload(path: relative(path.appending(child.path), to: location), data: json(child.tree)))
            }
            return out
        }
    }

    /// A path as the stream names it: relative to its location, `/` for the location itself.
    private func relative(_ path: Path, to location: Path) -> String {
        location.relative(path)?.description ?? "/"
    }

    /// Query and priority streams: what changed from the last value sent to `next`, a `put` per
    /// child that entered, changed or left (`null`), or one `put` of the whole value when either
    /// is not an object. O(window).
    private mutating func changes(to next: Tree) -> [UInt8] {
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
