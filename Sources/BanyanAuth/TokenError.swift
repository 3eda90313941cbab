/// Why a token was refused. Every refusal is one of these; `reason` is the message a client is
/// given (REST: 401 `{"error": reason}`; WebSocket: `invalid_token`, or `expired_token` for
/// `.expired`, with the reason as its data).
public enum TokenError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Longer than `TokenLimits.maxTokenBytes` (the size it had).
    case tooLarge(Int)
    /// Not a JWT of the expected shape: parts, base64url, JSON, claim types (what was wrong).
    case malformed(String)
    /// The header's `alg` is not one this server accepts for such a token (`none`; RS256 with
    /// no keys configured; HS256 with no database secrets; anything else always).
    case algorithmNotAllowed(String)
    /// The header's `kid` names no configured key (nil: the header has no `kid`).
    case unknownKey(String?)
    /// The signature does not verify with the key (or with any database secret).
    case badSignature
    /// `exp` is past (allowing the clock skew).
    case expired
    /// `iat`, `nbf` or `auth_time` is in the future (beyond the clock skew).
    case notYetValid
    /// `iss` is not the configured issuer.
    case wrongIssuer
    /// `aud` is not (or does not contain) the configured audience.
    case wrongAudience
    /// `sub` (ID token) or `d.uid` (custom token) is missing, empty or too long.
    case invalidSubject

    /// The client-facing message.
    public var reason: String {
        switch self {
        case .tooLarge(let n): return "Auth token is too large (\(n) bytes; at most \(TokenLimits().maxTokenBytes))."
        case .malformed(let what): return "Could not parse auth token: \(what)."
        case .algorithmNotAllowed(let alg): return "Auth token algorithm '\(alg.prefix(40))' is not accepted."
        case .unknownKey(let kid?): return "Auth token is signed with an unknown key (kid '\(kid.prefix(80))')."
        case .unknownKey(nil): return "Auth token names no signing key (no kid)."
        case .badSignature: return "Auth token signature is invalid."
        case .expired: return "Auth token is expired."
        case .notYetValid: return "Auth token is not yet valid."
        case .wrongIssuer: return "Auth token has the wrong issuer."
        case .wrongAudience: return "Auth token has the wrong audience."
        case .invalidSubject: return "Auth token has no valid user id."
        }
    }

    public var description: String { reason }
}
