import BanyanBasics
public import BanyanQuery
public import BanyanStateMachine
public import BanyanTree

/// The parts of an HTTP request the REST layer reads.
public struct HTTPHead: Sendable {
    public var method: String
    /// Path and query as received (percent-encoded).
    public var uri: String
    public var headers: [(name: String, value: String)]

    public init(method: String, uri: String, headers: [(name: String, value: String)]) {
        self.method = method
        self.uri = uri
        self.headers = headers
    }

    public func header(_ name: String) -> String? {
        // A plain loop, for the reason `Target.param` gives.
        for i in headers.indices where HTTPHead.isHeader(headers[i].name, name) { return headers[i].value }
        return nil
    }

    /// Whether two header names are equal ignoring ASCII case (no allocation: this runs several
    /// times for every request).
    public static func isHeader(_ a: String, _ b: String) -> Bool {
        guard a.utf8.count == b.utf8.count else { return false }
        // Native strings: over their bytes in place (iterating two UTF-8 views cost more).
        let inPlace = a.utf8.withContiguousStorageIfAvailable { x in
            b.utf8.withContiguousStorageIfAvailable { y in
                for i in 0..<x.count where x[i] != y[i] {
                    guard Self.lower(x[i]) == Self.lower(y[i]) else { return false }
                }
                return true
            }
        }
        if let inPlace = inPlace ?? nil { return inPlace }
        for (x, y) in zip(a.utf8, b.utf8) where x != y {
            guard Self.lower(x) == Self.lower(y) else { return false }
        }
        return true
    }

    @inline(__always) private static func lower(_ c: UInt8) -> UInt8 {
        c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z") ? c | 0x20 : c
    }
}

/// A failed request, rendered as Firebase renders errors: `{\n  "error" : "…"\n}`.
public struct RESTError: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: Int
    public var message: String

    public init(_ status: Int, _ message: String) {
        self.status = status
        self.message = message
    }

    public var description: String { "\(status): \(message)" }

    static func badRequest(_ message: String) -> RESTError { RESTError(400, message) }
    static let invalidJSON = RESTError(400, "Invalid data; couldn't parse JSON object, array, or value.")
}

/// A parsed Firebase REST request (docs/rest.md).
public struct RESTRequest: Sendable {
    public enum Operation: Sendable, Equatable {
        case get
        /// GET with `Accept: text/event-stream`.
        case stream
        case put
        case post
        case patch
        case delete
        /// A CORS preflight.
        case options
    }

    public enum Print: Sendable, Equatable {
        case normal
        case pretty
        case silent
    }

    public enum Consistency: Sendable, Equatable {
        /// ReadIndex: reflects every write acknowledged before the request (the default).
        case linearizable
        /// This node's state, possibly behind the leader (`consistency=stale`, a Banyan extension).
        case stale
    }

    public enum Authorization: Sendable, Equatable {
        case none
        /// `Authorization: Bearer owner` or `auth=owner`: the administrator, as in the emulator.
        case owner
        case other(String)
    }

    public var namespace: String
    /// The location (for a `.priority` write, the value whose priority is set).
    public var path: Path
    /// The request path ends in `/.priority`.
    public var isPriority: Bool
    public var operation: Operation
    public var print: Print = .normal
    public var export = false
    public var shallow = false
    /// The query, when ordering, ranges or limits were given.
    public var query: QueryParams?
    public var wantsETag = false
    public var ifMatch: String?
    public var ifNoneMatch: String?
    public var consistency: Consistency = .linearizable
    /// The `timeout` parameter, in milliseconds (at most 15 minutes).
    public var timeoutMilliseconds: Int?
    /// The `at` parameter (Banyan's own): read the location as it was at this committed log
    /// index, from the node's retained history (docs/backup.md, "Reads of the past").
    public var atIndex: UInt64?
    /// The largest write body accepted (`writeSizeLimit`).
    public var writeSizeLimit: Int?
    public var authorization: Authorization = .none
    /// `auth_variable_override` (administrators only): the `auth` the rules judge the request as.
    public var authOverride: String?
    /// JSONP callback name (GET).
    public var callback: String?
    /// `download`: serve the value as an attachment with this file name.
    public var download: String?
    /// The request body (writes).
    public var body: [UInt8] = []
    /// A `PATCH`'s items as validation found them (each value's own bytes), so that building the
    /// command does not read the body's members again (on the event loop, after a worker
    /// validated a large body).
    var updateItems: [Command.UpdateItem]?

    public var isPost: Bool { operation == .post }

    /// The largest `timeout` Firebase accepts.
    public static let maxTimeoutMilliseconds = 15 * 60 * 1000
    /// Byte limits for `writeSizeLimit` (Firebase names time budgets; Banyan maps them to body
    /// sizes, see docs/rest.md).
    public static let writeSizeLimits: [String: Int] = [
        "tiny": 64 << 10, "small": 1 << 20, "medium": 10 << 20, "large": 64 << 20, "unlimited": Int.max,
    ]

    public static func parse(
        _ head: HTTPHead, body: [UInt8], defaultNamespace: String, maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
    ) -> Result<RESTRequest, RESTError> {
        do throws(RESTError) {
            return .success(try parseThrowing(head, body: body, defaultNamespace: defaultNamespace, maxUpdatePaths: maxUpdatePaths))
        } catch {
            return .failure(error)
        }
    }

    /// The same, for a target already split (`target(of:)`): the connection handler splits it
    /// once, for the check at the head and for this parse.
    public static func parse(
        _ head: HTTPHead, target: Target, body: [UInt8], defaultNamespace: String, maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
    ) -> Result<RESTRequest, RESTError> {
        do throws(RESTError) {
            return .success(try parseThrowing(head, target: target, body: body, defaultNamespace: defaultNamespace, maxUpdatePaths: maxUpdatePaths))
        } catch {
            return .failure(error)
        }
    }

    /// A request target split into its path (still percent-encoded) and its decoded query
    /// parameters, in order.
    public struct Target: Sendable {
        public var rawPath: Substring
        public var params: [(String, String)]

        /// A parameter's value; the last one when it is repeated. A plain loop: `last(where:)`
        /// over an array of tuples looked up the tuple's type metadata on every call (about
        /// 150 instructions a lookup, a dozen lookups a request).
        public func param(_ name: String) -> String? {
            var i = params.endIndex
            while i > params.startIndex {
                i -= 1
                if params[i].0 == name { return params[i].1 }
            }
            return nil
        }
    }

    /// Splits a request target (path and query); throws on a query string that does not parse.
    public static func target(of uri: String) throws(RESTError) -> Target {
        let (rawPath, rawQuery) = splitURI(uri)
        return Target(rawPath: rawPath, params: try parseQuery(rawQuery))
    }

    static func parseThrowing(
        _ head: HTTPHead, target given: Target? = nil, body: [UInt8], defaultNamespace: String,
        maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
    ) throws(RESTError) -> RESTRequest {
        let target: Target
        if let given { target = given } else { target = try Self.target(of: head.uri) }
        let rawPath = target.rawPath
        let params = target.params
        func param(_ name: String) -> String? { target.param(name) }

        // Method (POST may carry an override, for clients that cannot send PATCH or DELETE).
        var method = head.method.uppercased()
        if method == "POST", let override = head.header("X-HTTP-Method-Override")?.uppercased() {
            guard ["PUT", "PATCH", "DELETE", "POST"].contains(override) else {
                throw .badRequest("X-HTTP-Method-Override must be PUT, PATCH or DELETE")
            }
            method = override
        }
        let operation: Operation
        switch method {
        case "GET", "HEAD":
            let accept = head.header("Accept") ?? ""
            operation = accept.lowercased().contains("text/event-stream") ? .stream : .get
        case "PUT": operation = .put
        case "POST": operation = .post
        case "PATCH": operation = .patch
        case "DELETE": operation = .delete
        case "OPTIONS": operation = .options
        default: throw RESTError(405, "Method \(head.method) is not supported; use GET, PUT, POST, PATCH or DELETE.")
        }

        let namespace = try Self.namespace(head, param, defaultNamespace: defaultNamespace)

        // Path.
        let (path, isPriority) = try parsePath(rawPath)
        var request = RESTRequest(namespace: namespace, path: path, isPriority: isPriority, operation: operation)
        if operation == .options { return request }

        // Output options.
        switch param("print") {
        case nil: break
        case "pretty": request.print = .pretty
        case "silent": request.print = .silent
        case let other?: throw .badRequest("print must be 'pretty' or 'silent', not '\(other)'.")
        }
        switch param("format") {
        case nil: break
        case "export": request.export = true
        case let other?: throw .badRequest("format must be 'export', not '\(other)'.")
        }
        switch param("shallow") {
        case nil, "false": break
        case "true": request.shallow = true
        case let other?: throw .badRequest("shallow must be 'true' or 'false', not '\(other)'.")
        }
        switch param("consistency") {
        case nil, "linearizable": break
        case "stale": request.consistency = .stale
        case let other?: throw .badRequest("consistency must be 'linearizable' or 'stale', not '\(other)'.")
        }
        if let t = param("timeout") { request.timeoutMilliseconds = try parseTimeout(t) }
        if let at = param("at") {
            guard let index = UInt64(at), index > 0 else { throw .badRequest("at must be a log index (a whole number, 1 or more), not '\(at)'.") }
            guard operation == .get else { throw .badRequest("at reads the past: it goes with GET only.") }
            request.atIndex = index
        }
        if let w = param("writeSizeLimit") {
            guard let limit = writeSizeLimits[w] else {
                throw .badRequest("writeSizeLimit must be one of tiny, small, medium, large, unlimited; not '\(w)'.")
            }
            request.writeSizeLimit = limit
        }
        if let cb = param("callback") {
            guard !cb.isEmpty, cb.utf8.count <= 128, cb.unicodeScalars.allSatisfy({ $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "_$.".unicodeScalars.contains($0)) }) else {
                throw .badRequest("callback must be a JavaScript function name.")
            }
            request.callback = cb
        }
        if let d = param("download") {
            request.download = String(d.unicodeScalars.filter { $0.isASCII && $0 != "\"" && $0 != "\\" && $0.value >= 0x20 }.map(Character.init))
        }

        // Credentials.
        request.authorization = Self.authorization(head, param)
        request.authOverride = param("auth_variable_override")

        // Conditional requests.
        if let e = head.header("X-Firebase-ETag") { request.wantsETag = e.lowercased() == "true" }
        request.ifMatch = head.header("if-match").map(unquote)
        request.ifNoneMatch = head.header("if-none-match").map(unquote)
        if request.ifMatch != nil {
            guard operation == .put || operation == .delete else {
                throw .badRequest("if-match is only supported with PUT and DELETE.")
            }
        }
        if request.shallow && (request.wantsETag || request.ifNoneMatch != nil) {
            throw .badRequest("ETags are not supported with shallow.")
        }

        // The query.
        request.query = try parseQueryParams(params, shallow: request.shallow)
        if request.query != nil && operation != .get && operation != .stream {
            throw .badRequest("Query parameters are only supported with GET.")
        }
        if request.shallow && operation != .get {
            throw .badRequest("shallow is only supported with GET.")
        }

        // The body.
        switch operation {
        case .put, .post, .patch:
            if let limit = request.writeSizeLimit, body.count > limit {
                throw .badRequest("Write too large: \(body.count) bytes exceed writeSizeLimit (\(limit) bytes).")
            }
            request.updateItems = try validateBody(body, request: request, maxUpdatePaths: maxUpdatePaths)
            request.body = body
        default:
            break
        }
        if isPriority && operation != .put && operation != .get && operation != .stream {
            throw .badRequest("Only PUT and GET are supported at a .priority location.")
        }
        if isPriority && request.ifMatch != nil {
            // A compare-and-set replaces a value; a priority is set with its value (as a realtime
            // transaction cannot set a priority alone).
            throw .badRequest("if-match is not supported at a .priority location: write the value with its priority.")
        }
        if isPriority && operation == .put {
            // The log reads the location as the realtime protocol does: `.priority` is one level
            // more, so the node it names may be at most 31 levels deep.
            do { _ = try WritePath(parsing: WritePath(path: request.path, isPriority: true).description) } catch { throw .badRequest("Invalid path: \(error.message)") }
        }
        return request
    }

    // MARK: - Writes

    /// The state-machine command for a write. POST stores the body under `pushID`.
    public func command(pushID: String) -> Result<Command, RESTError> {
        let location = path.description + (isPriority ? (path.isRoot ? ".priority" : "/.priority") : "")
        switch operation {
        case .put:
            if let ifMatch { return .success(.compareAndSet(path: location, expectedHash: Self.expectedHash(ifMatch), json: body)) }
            return .success(.set(path: location, json: body))
        case .post:
            guard let key = try? ChildKey(validating: pushID) else { return .failure(RESTError(500, "bad push id")) }
            return .success(.set(path: path.appending(key).description, json: body))
        case .delete:
            if let ifMatch { return .success(.compareAndSet(path: location, expectedHash: Self.expectedHash(ifMatch), json: Array("null".utf8))) }
            return .success(.set(path: location, json: Array("null".utf8)))
        case .patch:
            // The validated body: each value's own bytes go into the command (no re-encoding).
            if let updateItems { return .success(.update(path: path.description, entries: updateItems)) }
            guard case let members?? = try? JSONValue.members(rawIn: body) else {
                return .failure(.badRequest("PATCH needs a JSON object whose keys are paths."))
            }
            return .success(.update(path: path.description, entries: members.map { Command.UpdateItem(path: $0.key, json: Array(body[$0.value])) }))
        case .get, .stream, .options:
            return .failure(RESTError(500, "not a write"))
        }
    }

    /// The ETag of a value: its Firebase hash, or `null_etag` for no data.
    public static func etag(_ subtree: Tree) -> String { subtree.isEmpty ? "null_etag" : subtree.hashString }

    static func expectedHash(_ etag: String) -> String { etag == "null_etag" ? "" : etag }

    /// Checks a write's body; for a `PATCH`, returns its items.
    static func validateBody(_ body: [UInt8], request: RESTRequest, maxUpdatePaths: Int) throws(RESTError) -> [Command.UpdateItem]? {
        guard !body.isEmpty else { throw .invalidJSON }
        // Server values are placeholders here; they resolve when the write applies.
        let context = ServerValueContext(timestamp: 0)
        do {
            switch request.operation {
            case .patch:
                // The shared check (WriteValidation): values delimited, not decoded, and read
                // once each; the overlap check O(n log n) in the number of keys.
                do throws(WriteValidation.Problem) {
                    return try WriteValidation.updateItems(body, at: request.path, maxPaths: maxUpdatePaths)
                } catch {
                    switch error {
                    case .invalidJSON: throw RESTError.invalidJSON
                    case .notAnObject: throw RESTError.badRequest("PATCH needs a JSON object whose keys are paths.")
                    case let .invalidKey(key, e): throw RESTError.badRequest("Invalid key \"\(key)\" in PATCH: \(e.message)")
                    case let .overlappingPaths(a, b): throw RESTError.badRequest("Invalid data; PATCH paths \"\(a)\" and \"\(b)\" overlap.")
                    case .tooManyPaths: throw RESTError.badRequest(error.description)
                    case .invalidValue(let e): throw e
                    }
                }
            case .post:
                _ = try TreeReader.read(body, at: request.path.appending(ChildKey(unchecked: "-PUSHIDPLACEHOLDER00")), serverValues: context)
            default:
                // The shared check: at `.priority` the value must be a priority.
                do throws(WriteValidation.Problem) {
                    try WriteValidation.value(body, at: WritePath(path: request.path, isPriority: request.isPriority))
                } catch {
                    guard case .invalidValue(let e) = error else { throw RESTError.invalidJSON }
                    throw e
                }
            }
            return nil
        } catch let e as RESTError {
            throw e
        } catch let e as TreeError {
            if e.code == .invalidJSON || e.code == .duplicateKey { throw RESTError.badRequest("Invalid data; couldn't parse JSON object, array, or value. \(e.message)") }
            throw RESTError.badRequest(e.message)
        } catch {
            throw RESTError.invalidJSON
        }
    }

    // MARK: - URI parsing

    static func splitURI(_ uri: String) -> (path: Substring, query: Substring) {
        let noFragment = uri[..<(uri.utf8.firstIndex(of: UInt8(ascii: "#")) ?? uri.endIndex)]
        guard let mark = noFragment.utf8.firstIndex(of: UInt8(ascii: "?")) else { return (noFragment, "") }
        return (noFragment[..<mark], noFragment[noFragment.utf8.index(after: mark)...])
    }

    static func parsePath(_ raw: Substring) throws(RESTError) -> (Path, Bool) {
        // Compared as bytes (the suffix is ASCII): `hasSuffix` compares `Character`s.
        let bytes = raw.utf8
        guard bytes.count >= 5, bytes.suffix(5).elementsEqual(".json".utf8) else {
            throw RESTError(404, "Not found: REST requests name a location ending in .json, such as /users/ada.json.")
        }
        var trimmed = raw[..<bytes.index(bytes.endIndex, offsetBy: -5)]
        let parsed = trimmed.withUTF8 { bytes -> Result<(segments: [ChildKey], isPriority: Bool), RESTError> in
            let pieces = bytes.ranges(separatedBy: UInt8(ascii: "/"), omittingEmpty: true)
            func text(_ range: Range<Int>) -> String { String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self) }
            var segments: [ChildKey] = []
            segments.reserveCapacity(pieces.count)
            var isPriority = false
            for (i, piece) in pieces.enumerated() {
                guard let decoded = decode(UnsafeBufferPointer(rebasing: bytes[piece]), plusIsSpace: false) else {
                    return .failure(.badRequest("Invalid path: bad percent-encoding in \"\(text(piece))\"."))
                }
                if i == pieces.count - 1 && decoded == ".priority" {
                    isPriority = true
                    continue
                }
                do throws(TreeError) {
                    segments.append(try ChildKey(validating: decoded, path: "/" + pieces.map(text).joined(separator: "/")))
                } catch {
                    return .failure(.badRequest("Invalid path: \(error.message)"))
                }
            }
            return .success((segments, isPriority))
        }
        let (segments, isPriority) = try parsed.get()
        let path = Path(segments: segments)
        do throws(TreeError) { try path.checkLimits() } catch { throw .badRequest("Invalid path: \(error.message)") }
        return (path, isPriority)
    }

    /// The namespace a request names: `ns`, else the Host's first label, else the default.
    static func namespace(_ head: HTTPHead, _ param: (String) -> String?, defaultNamespace: String) throws(RESTError) -> String {
        let namespace: String
        if let ns = param("ns") {
            namespace = ns
        } else if let host = head.header("Host"), let label = hostLabel(host) {
            namespace = label
        } else {
            namespace = defaultNamespace
        }
        guard isValidNamespace(namespace) else {
            throw .badRequest("Invalid namespace \"\(namespace)\": use 1 to 63 letters, digits, '-' or '_'.")
        }
        return namespace
    }

    /// The namespace and credentials of a request from its head alone (before its body is read).
    public static func access(in head: HTTPHead, defaultNamespace: String) -> (namespace: String, authorization: Authorization, override: String?)? {
        guard let target = try? target(of: head.uri) else { return nil }
        return access(in: head, target: target, defaultNamespace: defaultNamespace)
    }

    /// The same, for a target already split.
    public static func access(
        in head: HTTPHead, target: Target, defaultNamespace: String
    ) -> (namespace: String, authorization: Authorization, override: String?)? {
        let param: (String) -> String? = { name in target.param(name) }
        guard let namespace = try? Self.namespace(head, param, defaultNamespace: defaultNamespace) else { return nil }
        return (namespace, authorization(head, param), param("auth_variable_override"))
    }

    /// The credentials a request head carries: the `Authorization` header, else `auth=` or
    /// `access_token=`.
    static func authorization(_ head: HTTPHead, _ param: (String) -> String?) -> Authorization {
        if let auth = head.header("Authorization") {
            let token = auth.hasPrefix("Bearer ") ? String(auth.dropFirst(7)) : auth
            return token == "owner" ? .owner : .other(token)
        } else if let token = param("auth") ?? param("access_token") {
            return token == "owner" ? .owner : .other(token)
        }
        return .none
    }

    /// The credentials of a request from its head alone, before any body is read (so a request
    /// that will be refused is refused without reading a body of up to `max_body_bytes`). A query
    /// string that does not parse carries none.
    public static func authorization(in head: HTTPHead) -> Authorization {
        let (_, rawQuery) = splitURI(head.uri)
        let params = (try? parseQuery(rawQuery)) ?? []
        return authorization(head) { name in params.last { $0.0 == name }?.1 }
    }

    public static func parseQuery(_ raw: Substring) throws(RESTError) -> [(String, String)] {
        if raw.isEmpty { return [] }
        var copy = raw
        // Over the bytes in place (Substring views cost several times more; issue 14's profile).
        let parsed = copy.withUTF8 { bytes -> Result<[(String, String)], RESTError> in
            var out: [(String, String)] = []
            for pair in bytes.ranges(separatedBy: UInt8(ascii: "&"), omittingEmpty: true) {
                let equals = bytes[pair].firstIndex(of: UInt8(ascii: "="))
                let key = pair.lowerBound..<(equals ?? pair.upperBound)
                let value = equals.map { ($0 + 1)..<pair.upperBound } ?? pair.upperBound..<pair.upperBound
                guard let k = decode(UnsafeBufferPointer(rebasing: bytes[key]), plusIsSpace: true),
                    let v = decode(UnsafeBufferPointer(rebasing: bytes[value]), plusIsSpace: true)
                else {
                    let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[pair]), as: UTF8.self)
                    return .failure(.badRequest("Invalid query string: bad percent-encoding in \"\(text)\"."))
                }
                out.append((k, v))
            }
            return .success(out)
        }
        return try parsed.get()
    }

    /// Percent-decodes UTF-8 bytes, which must be valid UTF-8 (a piece of a `String` cut at ASCII
    /// bytes); nil on a bad escape or when the decoded bytes are not UTF-8.
    static func decode(_ bytes: UnsafeBufferPointer<UInt8>, plusIsSpace: Bool) -> String? {
        // Most segments and parameters have nothing to decode (and are valid already).
        guard bytes.contains(where: { $0 == UInt8(ascii: "%") || ($0 == UInt8(ascii: "+") && plusIsSpace) }) else {
            return String(decoding: bytes, as: UTF8.self)
        }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        func hex(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        var i = 0
        while i < bytes.count {
            let c = bytes[i]
            if c == UInt8(ascii: "%") {
                guard i + 2 < bytes.count, let h = hex(bytes[i + 1]), let l = hex(bytes[i + 2]) else { return nil }
                out.append(h << 4 | l)
                i += 3
                continue
            }
            out.append(c == UInt8(ascii: "+") && plusIsSpace ? UInt8(ascii: " ") : c)
            i += 1
        }
        return String(validating: out, as: UTF8.self)
    }

    /// The first DNS label of a Host header; nil for IP literals (they name no database).
    public static func hostLabel(_ host: String) -> String? {
        var h = Substring(host)
        if h.hasPrefix("[") { return nil }  // IPv6 literal
        if let colon = h.lastIndex(of: ":") { h = h[..<colon] }
        if !h.isEmpty && h.allSatisfy({ $0.isNumber || $0 == "." }) { return nil }  // IPv4 literal
        guard let label = h.split(separator: ".").first, !label.isEmpty else { return nil }
        return String(label)
    }

    /// A namespace name: 1 to 63 ASCII letters, digits, '-' or '_' (also checked for the
    /// server's `default_namespace`).
    public static func isValidNamespace(_ ns: String) -> Bool {
        !ns.isEmpty && ns.utf8.count <= 63
            && ns.utf8.allSatisfy { b in
                (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z"))
                    || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")) || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
            }
    }

    static func unquote(_ s: String) -> String {
        var t = Substring(s.trimmingSpaces())
        if t.hasPrefix("W/") { t = t.dropFirst(2) }
        if t.count >= 2, t.hasPrefix("\""), t.hasSuffix("\"") { t = t.dropFirst().dropLast() }
        return String(t)
    }

    static func parseTimeout(_ t: String) throws(RESTError) -> Int {
        let units: [(String, Int)] = [("ms", 1), ("min", 60_000), ("s", 1000)]
        for (suffix, scale) in units where t.hasSuffix(suffix) {
            guard let n = Int(t.dropLast(suffix.count)), n >= 0, n <= maxTimeoutMilliseconds / scale else { break }
            return n * scale
        }
        throw .badRequest("timeout must be a number with ms, s or min, at most 15min; not '\(t)'.")
    }

    // MARK: - Query parameters

    static let queryNames: Set<String> = ["orderBy", "startAt", "startAfter", "endAt", "endBefore", "equalTo", "limitToFirst", "limitToLast"]

    static func parseQueryParams(_ params: [(String, String)], shallow: Bool) throws(RESTError) -> QueryParams? {
        var given: [String: String] = [:]
        for (k, v) in params where queryNames.contains(k) { given[k] = v }
        guard !given.isEmpty else { return nil }
        var query = Query()
        do {
            if let orderBy = given["orderBy"] {
                guard case .string(let index)? = try? JSONValue(parsing: orderBy) else {
                    throw RESTError.badRequest("orderBy must be a valid JSON encoded path")
                }
                switch index {
                case "$key": query = try query.orderByKey()
                case "$value": query = try query.orderByValue()
                case "$priority": query = try query.orderByPriority()
                default: query = try query.orderByChild(index)
                }
            } else if shallow && given["startAt"] == nil && given["endAt"] == nil && given["equalTo"] == nil && given["endBefore"] == nil {
                // firebase-tools pages with shallow + limitToFirst + startAfter, ordered by key.
                query = try query.orderByKey()
            } else {
                throw RESTError.badRequest("orderBy must be defined when other query parameters are defined")
            }
            if let v = given["startAt"] {
                let (value, key) = try bound(v, "startAt")
                query = try query.startAt(value, key: key)
            }
            if let v = given["startAfter"] {
                let (value, key) = try bound(v, "startAfter")
                query = try query.startAfter(value, key: key)
            }
            if let v = given["endAt"] {
                let (value, key) = try bound(v, "endAt")
                query = try query.endAt(value, key: key)
            }
            if let v = given["endBefore"] {
                let (value, key) = try bound(v, "endBefore")
                query = try query.endBefore(value, key: key)
            }
            if let v = given["equalTo"] {
                let (value, key) = try bound(v, "equalTo")
                query = try query.equalTo(value, key: key)
            }
            if given["limitToFirst"] != nil && given["limitToLast"] != nil {
                throw RESTError.badRequest("limitToFirst and limitToLast cannot both be given")
            }
            if let v = given["limitToFirst"] { query = try query.limitToFirst(try limit(v, "limitToFirst")) }
            if let v = given["limitToLast"] { query = try query.limitToLast(try limit(v, "limitToLast")) }
        } catch let e as RESTError {
            throw e
        } catch let e as QueryError {
            throw .badRequest(e.message)
        } catch {
            throw .badRequest("\(error)")
        }
        return query.params
    }

    static func limit(_ text: String, _ name: String) throws(RESTError) -> Int {
        guard let n = Int(text), n >= 0, n <= Int(Int32.max) else {
            throw .badRequest("\(name) must be a non-negative integer")
        }
        return n
    }

    /// A range bound: a JSON primitive, optionally followed by `,"<key>"` (the JS REST client's
    /// key tie-breaker).
    static func bound(_ text: String, _ name: String) throws(RESTError) -> (Tree, String?) {
        if let subtree = primitive(text) { return (subtree, nil) }
        // Split at the first comma outside a string.
        var inString = false
        var escaped = false
        for (i, c) in text.utf8.enumerated() {
            if escaped {
                escaped = false
                continue
            }
            if inString {
                if c == UInt8(ascii: "\\") { escaped = true } else if c == UInt8(ascii: "\"") { inString = false }
                continue
            }
            if c == UInt8(ascii: "\"") { inString = true }
            if c == UInt8(ascii: ",") {
                let head = String(decoding: text.utf8.prefix(i), as: UTF8.self)
                let tail = String(decoding: text.utf8.dropFirst(i + 1), as: UTF8.self)
                if let value = primitive(head), case .string(let key)? = try? JSONValue(parsing: tail) { return (value, key) }
                break
            }
        }
        throw .badRequest("\(name) must be a JSON primitive (quote strings), optionally followed by ,\"key\"")
    }

    static func primitive(_ text: String) -> Tree? {
        guard let value = try? JSONValue(parsing: text, maxDepth: 1) else { return nil }
        switch value {
        case .null: return .empty
        case .bool(let b): return Tree(.bool(b))
        case .int(let i): return Tree(.int(i))
        case .double(let d): return Tree(.double(d))
        case .string(let s): return Tree(.string(s))
        case .array, .object: return nil
        }
    }
}

extension StringProtocol {
    func trimmingSpaces() -> Substring {
        var s = Substring(self)
        while s.first == " " || s.first == "\t" { s = s.dropFirst() }
        while s.last == " " || s.last == "\t" { s = s.dropLast() }
        return s
    }
}
