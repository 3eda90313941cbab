/// Which endpoint a request is for, decided once from its method and target (docs/server.md,
/// "Routes"): the metrics, the realtime protocol's upgrade, an operator endpoint under
/// `/.banyan/`, or the Firebase data API. Pure and total: every target has a route, an unknown
/// operator endpoint included, so the connection handler and the operator API switch over
/// routes instead of matching strings.
public enum Route: Sendable, Equatable {
    /// `GET /metrics`: the Prometheus text.
    case metrics
    /// `/.ws` or `/.lp` (the protocol's transports; `RealtimeUpgrade` refuses what it must).
    case realtime
    /// An operator endpoint (`/.banyan/…`).
    case admin(AdminRoute)
    /// `/.settings/rules.json`: the namespace's security rules (`GET`, `PUT`; administrators).
    case rules
    /// `/.settings/quota.json`: the namespace's quota in data bytes (`GET`, `PUT`; administrators).
    case quota
    /// `/identitytoolkit.googleapis.com/…` and `/securetoken.googleapis.com/…`: the account
    /// service's endpoints, as the Firebase Auth emulator serves them (docs/accounts.md); and
    /// `/oauth2.googleapis.com/token`, where service accounts' libraries exchange their
    /// assertions (docs/security.md).
    case accounts
    /// Everything else: the Firebase REST API (`RESTRequest` parses and checks it).
    case data

    /// Operator endpoints (docs/operations.md).
    public enum AdminRoute: Sendable, Equatable {
        /// Whether even a `GET` of this route needs the operator's credentials (it reads data).
        public var readsData: Bool {
            switch self {
            case .backup, .log: true
            default: false
            }
        }

        /// The liveness and readiness probes: open to anyone, always (load balancers).
        public var isProbe: Bool {
            switch self {
            case .health, .ready: true
            default: false
            }
        }

        case status
        case health
        case ready
        /// `POST /.banyan/members` `{"id":…, "peer_address":…}`.
        case addMember
        /// `POST /.banyan/members/<id>/promote`.
        case promote(UInt64)
        /// `DELETE /.banyan/members/<id>`.
        case removeMember(UInt64)
        /// `POST /.banyan/transfer?to=<id>`; nil when `to` is missing or not a node id.
        case transfer(to: UInt64?)
        /// `POST`, `DELETE`, `GET /.banyan/drain`.
        case startDrain
        case stopDrain
        case drainState
        /// `GET /.banyan/backup`: an online, consistent backup streamed as it is written
        /// (docs/backup.md). Administrators only, like every route that reads data.
        case backup
        /// `GET /.banyan/log?from=<index>&max_bytes=<n>`: committed log entries from `from`, for
        /// continuous archiving (`banyan backup --follow`). Administrators only. Nil parameters
        /// are missing or malformed.
        case log(from: UInt64?, maxBytes: Int?)
        /// `GET /.banyan/tls`: the certificates in force and their expiry.
        case tlsStatus
        /// `POST /.banyan/tls/reload`: reload certificates, keys and trust bundle from their files.
        case tlsReload
        /// `GET`, `POST`, `DELETE /.banyan/faults`: the fault switch of a node started for local
        /// failover testing (docs/chaos.md).
        case faults
        case setFaults
        case clearFaults
        /// A member route whose id is not a node id.
        case badNodeID(String)
        /// No such endpoint for this method.
        case unknown
    }

    /// The route of a request. `uri` is the request target as sent (path and query).
    public static func of(method: String, uri: String) -> Route {
        let query = uri.utf8.firstIndex(of: UInt8(ascii: "?"))
        var path = query.map { uri[..<$0] } ?? Substring(uri)
        // Compared as UTF-8 bytes in place (every name here is ASCII), lengths first: `==` and
        // `hasPrefix` on strings compare `Character`s, and `elementsEqual` over a UTF-8 view
        // walks it generically; both cost more than the rest of routing (issue 14's profiles).
        let route: Route? = path.withUTF8 { bytes in
            func matches(_ name: StaticString, prefix: Bool) -> Bool {
                let count = name.utf8CodeUnitCount
                guard prefix ? bytes.count >= count : bytes.count == count else { return false }
                let name = name.utf8Start
                for i in 0..<count where bytes[i] != name[i] { return false }
                return true
            }
            func `is`(_ name: StaticString) -> Bool { matches(name, prefix: false) }
            func starts(_ name: StaticString) -> Bool { matches(name, prefix: true) }
            // Every special route starts "/." or "/m", "/i", "/o" or "/s": any other path is data.
            guard bytes.count >= 2 else { return .data }
            switch bytes[1] {
            case UInt8(ascii: "."), UInt8(ascii: "m"), UInt8(ascii: "i"), UInt8(ascii: "o"), UInt8(ascii: "s"): break
            default: return .data
            }
            if `is`("/metrics") && method == "GET" { return .metrics }
            if `is`("/.ws") || `is`("/.lp") { return .realtime }
            if `is`("/.settings/rules.json") || `is`("/.settings/rules") { return .rules }
            if `is`("/.settings/quota.json") || `is`("/.settings/quota") { return .quota }
            if starts("/identitytoolkit.googleapis.com/") || starts("/securetoken.googleapis.com/") || starts("/oauth2.googleapis.com/") { return .accounts }
            return starts("/.banyan/") ? nil : .data
        }
        if let route { return route }
        let parts = path.dropFirst("/.banyan/".count).split(separator: "/", omittingEmptySubsequences: false)
        return .admin(admin(method: method, parts, query: query.map { uri[uri.index(after: $0)...] } ?? ""))
    }

    private static func admin(method: String, _ parts: [Substring], query: Substring) -> AdminRoute {
        switch (method, parts.count, parts.first ?? "") {
        case ("GET", 1, "status"): return .status
        case ("GET", 1, "health"): return .health
        case ("GET", 1, "ready"): return .ready
        case ("POST", 1, "members"): return .addMember
        case ("POST", 1, "transfer"): return .transfer(to: parameter("to", in: query).flatMap { UInt64($0) })
        case ("POST", 1, "drain"): return .startDrain
        case ("DELETE", 1, "drain"): return .stopDrain
        case ("GET", 1, "drain"): return .drainState
        case ("GET", 1, "backup"): return .backup
        case ("GET", 1, "log"):
            let maxBytes = parameter("max_bytes", in: query).map { Int($0) } ?? Int?(4 << 20)
            return .log(from: parameter("from", in: query).flatMap { UInt64($0) }, maxBytes: maxBytes)
        case ("GET", 1, "tls"): return .tlsStatus
        case ("POST", 2, "tls") where parts[1] == "reload": return .tlsReload
        case ("GET", 1, "faults"): return .faults
        case ("POST", 1, "faults"): return .setFaults
        case ("DELETE", 1, "faults"): return .clearFaults
        case (_, 2..., "members"):
            guard let id = UInt64(parts[1]) else { return .badNodeID(String(parts[1].prefix(64))) }
            switch (method, parts.count) {
            case ("DELETE", 2): return .removeMember(id)
            case ("POST", 3) where parts[2] == "promote": return .promote(id)
            default: return .unknown
            }
        default: return .unknown
        }
    }

    /// The first value of a query parameter (no percent-decoding: operator parameters are ids).
    private static func parameter(_ name: String, in query: Substring) -> Substring? {
        for pair in query.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1)
            if kv.count == 2, kv[0] == name { return kv[1] }
        }
        return nil
    }
}
