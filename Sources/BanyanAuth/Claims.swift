public import BanyanTree

/// What a verified credential is, as the server needs it.
public struct VerifiedToken: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// An RS256 ID token checked against the configured public keys.
        case idToken
        /// A Firebase 2.x custom token (HS256, signed with a database secret).
        case customToken
        /// A database secret itself.
        case databaseSecret
        /// A token signed with a service account's key (`ServiceAccounts`), naming the account.
        case serviceAccount(String)
    }

    public var kind: Kind
    /// Not judged by rules: a custom token with `"admin": true`, a database secret, or a
    /// service account's token.
    public var administrator: Bool
    /// The rules' `auth` variable as JSON (`{"uid", "provider", "token", …}`); nil for a
    /// database secret, and for an administrator's custom token without `d`.
    public var auth: [UInt8]?
    /// The token's `exp`, in milliseconds since the epoch (nil: it never expires).
    public var expires: Int64?
    /// When the server stops honouring it: `expires` plus the clock skew allowed.
    public var validUntil: Int64?

    public init(kind: Kind, administrator: Bool, auth: [UInt8]?, expires: Int64?, validUntil: Int64?) {
        self.kind = kind
        self.administrator = administrator
        self.auth = auth
        self.expires = expires
        self.validUntil = validUntil
    }
}

/// The claim checks of each kind of token, on claims whose signature was already verified.
/// Pure: `now` (milliseconds since the epoch) is an input.
public enum Claims {
    /// An ID token's claims (Firebase's rules for verifying ID tokens): `iss` and `aud` as
    /// configured (`aud` may be an array containing it), `exp` not past and `iat` (and `nbf`,
    /// `auth_time` when present) not future, each allowing `skew` milliseconds; `sub` a
    /// non-empty string of at most 128 bytes. The `auth` is `{"uid": sub, "provider":
    /// firebase.sign_in_provider (else "custom"), "token": all claims}`.
    public static func checkIDToken(
        _ claims: JSONValue, issuer: String, audience: String, skew: Int64, now: Int64
    ) throws(TokenError) -> VerifiedToken {
        let (sub, exp) = try checkOpenIDClaims(claims, issuer: issuer, audiences: [audience], skew: skew, now: now)
        var provider = "custom"
        if case .string(let p)? = claims["firebase"]?["sign_in_provider"] { provider = p }
        let auth = JSONValue.object([("uid", .string(sub)), ("provider", .string(provider)), ("token", claims)])
        return VerifiedToken(kind: .idToken, administrator: false, auth: Array(auth.jsonString.utf8), expires: exp, validUntil: exp &+ skew)
    }

    /// The checks every OpenID Connect ID token gets (Core 1.0, section 3.1.3.7): `iss` exactly
    /// `issuer`; `aud` one of `audiences`, or an array holding one of them; `exp` not past and
    /// `iat` (and `nbf`, `auth_time` when present) not future, each allowing `skew`
    /// milliseconds; `sub` a non-empty string of at most 128 bytes. Answers `sub` and `exp`
    /// (milliseconds).
    public static func checkOpenIDClaims(
        _ claims: JSONValue, issuer: String, audiences: [String], skew: Int64, now: Int64
    ) throws(TokenError) -> (subject: String, expires: Int64) {
        guard case .string(let iss)? = claims["iss"], iss.utf8.elementsEqual(issuer.utf8) else { throw .wrongIssuer }
        switch claims["aud"] {
        case .string(let aud)? where names(aud, audiences): break
        case .array(let auds)? where auds.contains(where: { if case .string(let a) = $0 { names(a, audiences) } else { false } }): break
        default: throw .wrongAudience
        }
        guard let exp = try time(claims, "exp") else { throw .malformed("exp is missing") }
        guard let iat = try time(claims, "iat") else { throw .malformed("iat is missing") }
        try checkWindow(exp: exp, notBefore: [iat, try time(claims, "nbf"), try time(claims, "auth_time")], skew: skew, now: now)
        guard case .string(let sub)? = claims["sub"], !sub.isEmpty, sub.utf8.count <= 128 else { throw .invalidSubject }
        return (sub, exp)
    }

    /// Whether `value` is one of `candidates`, byte for byte.
    static func names(_ value: String, _ candidates: [String]) -> Bool { candidates.contains { $0.utf8.elementsEqual(value.utf8) } }

    /// How long a custom token without `exp` stays valid after its `iat`: 24 hours, the
    /// Firebase 2.x token generator's default.
    public static let defaultCustomTokenLifetime: Int64 = 24 * 3600 * 1000

    /// A Firebase 2.x custom token's claims: `"v": 0`, `iat` not future, `exp` (default
    /// `iat` + 24 h) not past, `nbf` when present, each allowing `skew` milliseconds; `admin`
    /// and `debug` booleans when present. Unless `"admin": true`, `d` is an object whose `uid`
    /// is a non-empty string of at most 256 bytes. The `auth` is `d`'s members, plus
    /// `"provider": "custom"` and `"token"` (all claims) unless `d` has those keys.
    public static func checkCustomToken(_ claims: JSONValue, skew: Int64, now: Int64) throws(TokenError) -> VerifiedToken {
        guard case .int(0)? = claims["v"] else { throw .malformed("a custom token needs \"v\": 0") }
        guard let iat = try time(claims, "iat") else { throw .malformed("iat is missing") }
        let exp = try time(claims, "exp") ?? iat &+ defaultCustomTokenLifetime
        try checkWindow(exp: exp, notBefore: [iat, try time(claims, "nbf")], skew: skew, now: now)
        var administrator = false
        switch claims["admin"] {
        case nil: break
        case .bool(let b)?: administrator = b
        default: throw .malformed("admin is not a boolean")
        }
        switch claims["debug"] {
        case nil, .bool?: break
        default: throw .malformed("debug is not a boolean")
        }
        var auth: [UInt8]?
        switch claims["d"] {
        case .object(var members)?:
            if case .string(let uid)? = claims["d"]?["uid"], !uid.isEmpty, uid.utf8.count <= 256 {
                // A valid uid.
            } else if !administrator {
                throw .invalidSubject
            }
            if !members.contains(where: { $0.0 == "provider" }) { members.append(("provider", .string("custom"))) }
            if !members.contains(where: { $0.0 == "token" }) { members.append(("token", claims)) }
            auth = Array(JSONValue.object(members).jsonString.utf8)
        case nil, .null?:
            guard administrator else { throw .invalidSubject }
        default:
            throw .malformed("d is not an object")
        }
        return VerifiedToken(kind: .customToken, administrator: administrator, auth: auth, expires: exp, validUntil: exp &+ skew)
    }

    /// Refuses a token whose `exp` is at or before `now - skew`, or one of whose not-before
    /// times is after `now + skew`.
    static func checkWindow(exp: Int64, notBefore: [Int64?], skew: Int64, now: Int64) throws(TokenError) {
        guard exp > now &- skew else { throw .expired }
        for case let t? in notBefore where t > now &+ skew { throw .notYetValid }
    }

    /// A NumericDate claim (seconds since the epoch, integral or not) in milliseconds; nil when
    /// absent, malformed when not a number of a plausible size.
    static func time(_ claims: JSONValue, _ name: String) throws(TokenError) -> Int64? {
        let limit: Int64 = 1 << 40  // seconds: about 34,000 years
        switch claims[name] {
        case nil: return nil
        case .int(let s)? where s >= 0 && s < limit: return s * 1000
        case .double(let s)? where s.isFinite && s >= 0 && s < Double(limit): return Int64((s * 1000).rounded(.down))
        default: throw .malformed("\(name) is not a time in seconds")
        }
    }
}
