import BanyanBasics
public import BanyanQuery
public import BanyanRules
public import BanyanStateMachine
public import BanyanTree

/// Who a request comes from, as the access decisions see it (docs/rules.md, "Enforcement").
public enum ClientIdentity: Sendable, Equatable {
    /// The administrator (the emulator's `owner` token under the development settings). Not
    /// judged by rules, unless `override` (`auth_variable_override`) names the client to judge
    /// its requests as.
    case administrator(override: ClientAuth?)
    /// A client, judged by the namespace's rules when it has some (else by the development
    /// settings).
    case client(ClientAuth)
    /// Credentials that are not accepted: the request is refused with this message.
    case refused(String)

    /// The `auth` a write command carries (nil: not judged).
    public var commandAuth: ClientAuth? {
        switch self {
        case .administrator(let override): return override
        case .client(let auth): return auth
        case .refused: return .signedOut
        }
    }

    /// The `auth` variable of a read decision, or nil when the request is not judged at all.
    public var readAuth: ClientAuth? { commandAuth }
}

/// Access decisions shared by REST, event streams and realtime sessions (pure).
public enum Access {
    /// The identity of a request's credentials. `override` is `auth_variable_override` (only an
    /// administrator may use it: JSON, `null` for a signed-out client). Under the development
    /// settings an unsigned token in the emulator's shape (a JWT with `"alg": "none"`, as the
    /// SDKs' `mockUserToken` makes) names its user. Any other token goes to `verify` when the node
    /// verifies tokens (docs/security.md): it answers a user, an administrator (a database secret,
    /// a custom token with `admin`), or a refusal with the reason. When `verify` answers nil (no
    /// verifier), other tokens count as signed out while unauthenticated access is allowed, and are
    /// refused otherwise.
    /// `unsignedAuth` reads an unsigned token (`unsignedTokenAuth`, or a cache of its answers).
    public static func identity(
        _ authorization: RESTRequest.Authorization, override: String?, acceptOwnerToken: Bool, developmentTokens: Bool,
        unsignedAuth: (String) -> [UInt8]? = unsignedTokenAuth, verify: (String) -> ClientIdentity? = { _ in nil }
    ) -> ClientIdentity {
        func administrator() -> ClientIdentity {
            guard let override else { return .administrator(override: nil) }
            guard let auth = overrideAuth(override) else {
                return .refused("auth_variable_override must be a JSON object or null")
            }
            return .administrator(override: auth)
        }
        switch authorization {
        case .owner where acceptOwnerToken:
            return administrator()
        case .none:
            return .client(.signedOut)
        case .owner, .other:
            let token: String
            if case .other(let t) = authorization { token = t } else { token = "owner" }
            if developmentTokens, let json = unsignedAuth(token) { return .client(.user(json: json)) }
            if case .other = authorization, let verified = verify(token) {
                if case .administrator = verified { return administrator() }
                return verified
            }
            return developmentTokens ? .client(.signedOut) : .refused("Unauthorized request.")
        }
    }

    /// `auth_variable_override`: an object becomes a user, `null` a signed-out client.
    static func overrideAuth(_ text: String) -> ClientAuth? {
        guard let value = try? JSONValue(parsing: text) else { return nil }
        switch value {
        case .null: return .signedOut
        case .object: return .user(json: Array(value.jsonString.utf8))
        default: return nil
        }
    }

    /// The claims of an unsigned emulator-style token (a JWT whose header says `"alg": "none"`
    /// and whose signature is empty, as the SDKs' `mockUserToken` makes), or nil. Bounded by
    /// the token's size (at most 16 KiB); split on bytes, since this runs per request.
    public static func unsignedClaims(_ token: String) -> JSONValue? {
        let parts = token.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard token.utf8.count <= 16 << 10, parts.count == 3, parts[2].isEmpty,
            let header = base64URLDecode(bytes: parts[0]), let payload = base64URLDecode(bytes: parts[1]),
            case .object(let h)? = try? JSONValue(parsing: header),
            h.first(where: { $0.0 == "alg" })?.1 == .string("none"),
            let claims = try? JSONValue(parsing: payload), case .object = claims
        else { return nil }
        return claims
    }

    /// The `auth` object of an unsigned emulator-style token: `{"uid", "provider", "token"}`
    /// from its claims (`sub` or `user_id` is the uid; `firebase.sign_in_provider` the provider).
    /// Nil when it is not such a token, or names no user.
    public static func unsignedTokenAuth(_ token: String) -> [UInt8]? {
        guard case .object(let claims)? = unsignedClaims(token) else { return nil }
        func claim(_ name: String) -> JSONValue? { claims.first { $0.0 == name }?.1 }
        guard case .string(let uid)? = claim("sub") ?? claim("user_id") ?? claim("uid"), !uid.isEmpty else { return nil }
        var provider = "custom"
        if case .object(let firebase)? = claim("firebase"), case .string(let p)? = firebase.first(where: { $0.0 == "sign_in_provider" })?.1 {
            provider = p
        }
        let auth = JSONValue.object([("uid", .string(uid)), ("provider", .string(provider)), ("token", .object(claims))])
        return Array(auth.jsonString.utf8)
    }

    /// Base64url without padding (and tolerant of it), as JWTs use; nil on any other character.
    public static func base64URLDecode(_ text: Substring) -> [UInt8]? { Base64.decode(text.utf8) }

    /// The same, over bytes.
    public static func base64URLDecode(bytes text: some Collection<UInt8>) -> [UInt8]? { Base64.decode(text) }

    /// The `auth` variable of a decision.
    public static func authValue(_ auth: ClientAuth) -> JSONValue? {
        switch auth {
        case .signedOut: return nil
        case .user(let json): return (try? JSONValue(parsing: json)) ?? .null
        }
    }

    /// A read (or listen) decision: nil when allowed or not judged. `rules` nil: the development
    /// settings decide (`allowUnauthenticated`).
    public static func readDenied(
        _ identity: ClientIdentity, rules: Rules?, allowUnauthenticated: Bool, at path: Path, query: QueryParams?, tree: Tree, now: Int64
    ) -> Bool {
        switch identity {
        case .refused: return true
        case .administrator(nil): return false
        case .administrator(let auth?), .client(let auth):
            guard let rules else {
                if case .administrator = identity { return false }
                return !allowUnauthenticated
            }
            let context = RulesRequestContext(auth: authValue(auth), time: now)
            return !rules.decideRead(at: path, query: rulesQuery(query), context: context, tree: tree).allowed
        }
    }

    /// Whether a write may be submitted: the development settings decide for a namespace without
    /// rules; with rules, the state machine judges it at its place in the log.
    public static func writeRefused(_ identity: ClientIdentity, hasRules: Bool, allowUnauthenticated: Bool) -> Bool {
        switch identity {
        case .refused: return true
        case .administrator: return false
        case .client: return !hasRules && !allowUnauthenticated
        }
    }

    /// The rules' `query` variable for a query.
    public static func rulesQuery(_ query: QueryParams?) -> RulesQuery {
        guard let query else { return RulesQuery() }
        var q = RulesQuery()
        switch query.index {
        case .priority: q.orderBy = .priority
        case .key: q.orderBy = .key
        case .value: q.orderBy = .value
        case .child(let path, _): q.orderBy = .child(path.segments.map(\.string).joined(separator: "/"))
        }
        func leaf(_ endpoint: QueryParams.Endpoint?) -> Leaf? {
            guard let post = endpoint?.post else { return nil }
            if query.index == .key, case .key(let k) = post.name { return .string(k.string) }
            return post.value.leaf
        }
        q.startAt = leaf(query.start)
        q.endAt = leaf(query.end)
        if let s = query.start, let e = query.end, s == e { q.equalTo = leaf(s) }
        if let limit = query.limit {
            switch query.anchor {
            case .first: q.limitToFirst = limit
            case .last: q.limitToLast = limit
            }
        }
        return q
    }
}
