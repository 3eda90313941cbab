public import BanyanTree
import BanyanBasics

/// Bounds on what a token may make the server parse.
public struct TokenLimits: Sendable, Equatable {
    /// The whole token, in bytes (header, claims and signature, base64url).
    public var maxTokenBytes = 16 << 10
    /// The decoded header, in bytes.
    public var maxHeaderBytes = 1024
    /// Nesting of the claims object (the object itself is level 1).
    public var maxClaimsDepth = 16
    public init() {}
}

/// A JSON Web Token (RFC 7519) in compact form, taken apart but not yet trusted: nothing here
/// checks the signature or any claim. Pure.
public struct JWT: Sendable, Equatable {
    /// The header's `alg`.
    public var algorithm: String
    /// The header's `kid`, if any.
    public var keyID: String?
    /// The claims (always a JSON object).
    public var claims: JSONValue
    /// What the signature signs: the ASCII bytes of `header.claims` as sent.
    public var signingInput: [UInt8]
    /// The decoded signature (empty for an unsigned token).
    public var signature: [UInt8]

    /// Decodes `token`, or says why it is not a JWT within `limits`.
    public static func decode(_ token: String, limits: TokenLimits = TokenLimits()) throws(TokenError) -> JWT {
        let size = token.utf8.count
        guard size <= limits.maxTokenBytes else { throw .tooLarge(size) }
        let parts = Substring(token).splitting(atByte: UInt8(ascii: "."), omittingEmpty: false)
        guard parts.count == 3 else { throw .malformed("a token has three parts separated by '.'") }
        guard let headerBytes = Base64.decode(parts[0].utf8), headerBytes.count <= limits.maxHeaderBytes else {
            throw .malformed("the header is not base64url of at most \(limits.maxHeaderBytes) bytes")
        }
        guard let claimBytes = Base64.decode(parts[1].utf8) else { throw .malformed("the claims are not base64url") }
        guard let signature = Base64.decode(parts[2].utf8) else { throw .malformed("the signature is not base64url") }
        guard case .object(let header)? = try? JSONValue(parsing: headerBytes, maxDepth: 4) else {
            throw .malformed("the header is not a JSON object")
        }
        guard case .string(let algorithm)? = header.first(where: { $0.0 == "alg" })?.1 else {
            throw .malformed("the header has no alg")
        }
        var keyID: String?
        switch header.first(where: { $0.0 == "kid" })?.1 {
        case nil: break
        case .string(let kid)?: keyID = kid
        default: throw .malformed("the header's kid is not a string")
        }
        let claims: JSONValue
        do {
            claims = try JSONValue(parsing: claimBytes, maxDepth: limits.maxClaimsDepth)
        } catch {
            throw .malformed("the claims are not JSON within \(limits.maxClaimsDepth) levels")
        }
        guard case .object = claims else { throw .malformed("the claims are not a JSON object") }
        let input = Array(parts[0].utf8) + [UInt8(ascii: ".")] + Array(parts[1].utf8)
        return JWT(algorithm: algorithm, keyID: keyID, claims: claims, signingInput: input, signature: signature)
    }
}
