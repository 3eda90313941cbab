import BanyanQuery
@testable import BanyanREST
import BanyanRules
import BanyanStateMachine
import BanyanTree
import Testing

@Suite struct AccessTests {
    /// base64url without padding, as JWTs are written.
    static func b64(_ text: String) -> String {
        let table = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
        var out: [UInt8] = []
        let bytes = Array(text.utf8)
        var i = 0
        while i < bytes.count {
            let chunk = Array(bytes[i..<min(i + 3, bytes.count)])
            let n = (UInt32(chunk[0]) << 16) | (UInt32(chunk.count > 1 ? chunk[1] : 0) << 8) | UInt32(chunk.count > 2 ? chunk[2] : 0)
            for k in 0...chunk.count { out.append(table[Int((n >> UInt32(18 - 6 * k)) & 63)]) }
            i += 3
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func token(header: String = #"{"alg":"none"}"#, _ claims: String) -> String { b64(header) + "." + b64(claims) + "." }

    @Test("an unsigned emulator token names its user: uid from sub or user_id, the provider, every claim; anything else is not one")
    func unsignedTokens() throws {
        let json = try #require(Access.unsignedTokenAuth(Self.token(#"{"sub":"alice","firebase":{"sign_in_provider":"password"},"admin":true}"#)))
        let auth = try JSONValue(parsing: json)
        #expect(auth["uid"] == .string("alice") && auth["provider"] == .string("password") && auth["token"]?["admin"] == .bool(true))
        #expect(try JSONValue(parsing: #require(Access.unsignedTokenAuth(Self.token(#"{"user_id":"bob"}"#))))["provider"] == .string("custom"))
        #expect(Access.unsignedTokenAuth(Self.token(header: #"{"alg":"RS256"}"#, #"{"sub":"alice"}"#)) == nil)
        #expect(Access.unsignedTokenAuth(Self.token(#"{"name":"no uid"}"#)) == nil)
        #expect(Access.unsignedTokenAuth("owner") == nil)
        #expect(Access.unsignedTokenAuth("a.b") == nil)
        #expect(Access.unsignedTokenAuth("!!!." + Self.b64("{}") + ".") == nil)
        #expect(Access.base64URLDecode("aGk") == Array("hi".utf8))
        #expect(Access.base64URLDecode("aGk=") == Array("hi".utf8))
        #expect(Access.base64URLDecode("a*") == nil)
    }

    @Test("identities: owner is the administrator (judged as auth_variable_override when given); no token is signed out; other tokens depend on the development settings")
    func identities() {
        #expect(Access.identity(.owner, override: nil, acceptOwnerToken: true, developmentTokens: true) == .administrator(override: nil))
        #expect(Access.identity(.owner, override: "null", acceptOwnerToken: true, developmentTokens: true) == .administrator(override: .signedOut))
        #expect(Access.identity(.owner, override: #"{"uid":"x"}"#, acceptOwnerToken: true, developmentTokens: true) == .administrator(override: .user(json: Array(#"{"uid":"x"}"#.utf8))))
        if case .refused = Access.identity(.owner, override: "[1]", acceptOwnerToken: true, developmentTokens: true) {} else { Issue.record("an array override was accepted") }
        #expect(Access.identity(.none, override: nil, acceptOwnerToken: true, developmentTokens: false) == .client(.signedOut))
        #expect(Access.identity(.other("garbage"), override: nil, acceptOwnerToken: true, developmentTokens: true) == .client(.signedOut))
        if case .refused = Access.identity(.other("garbage"), override: nil, acceptOwnerToken: true, developmentTokens: false) {} else { Issue.record("garbage accepted") }
        // With the owner token off, `owner` is just another token.
        #expect(Access.identity(.owner, override: nil, acceptOwnerToken: false, developmentTokens: true) == .client(.signedOut))
        guard case .client(.user)? = Optional(Access.identity(.other(Self.token(#"{"sub":"a"}"#)), override: nil, acceptOwnerToken: true, developmentTokens: true)) else {
            Issue.record("a mock token did not name its user")
            return
        }
    }

    @Test("with a verifier: other tokens are its to decide; an administrator it names takes auth_variable_override; unsigned tokens stay development-only")
    func verifiedIdentities() {
        let user = ClientIdentity.client(.user(json: Array(#"{"uid":"v"}"#.utf8)))
        let verify: (String) -> ClientIdentity = { token in
            switch token {
            case "user-token": return user
            case "secret": return .administrator(override: nil)
            default: return .refused("Auth token signature is invalid.")
            }
        }
        func identity(_ token: String, override: String? = nil, development: Bool = false) -> ClientIdentity {
            Access.identity(.other(token), override: override, acceptOwnerToken: true, developmentTokens: development, verify: verify)
        }
        #expect(identity("user-token") == user)
        #expect(identity("user-token", override: "null") == user)
        #expect(identity("secret") == .administrator(override: nil))
        #expect(identity("secret", override: "null") == .administrator(override: .signedOut))
        #expect(identity("forged") == .refused("Auth token signature is invalid."))
        // Refused even while unauthenticated access is allowed: a configured verifier decides.
        #expect(identity("forged", development: true) == .refused("Auth token signature is invalid."))
        let mock = Self.token(#"{"sub":"m"}"#)
        if case .client(.user) = identity(mock, development: true) {} else { Issue.record("a mock token did not name its user in development") }
        #expect(identity(mock) == .refused("Auth token signature is invalid."))
        #expect(Access.identity(.owner, override: nil, acceptOwnerToken: true, developmentTokens: false, verify: verify) == .administrator(override: nil))
    }

    @Test("reads: without rules the development settings decide; with rules the decision is the rules'; writes wait for the log when rules exist")
    func decisions() throws {
        let rules = try Rules.parse(#"{"rules": {"open": {".read": true}, "q": {".read": "query.orderByChild == 'owner' && query.limitToFirst <= 10"}}}"#)
        let path = try Path(parsing: "/open/x")
        let closed = try Path(parsing: "/secret")
        let q = try Path(parsing: "/q")
        #expect(!Access.readDenied(.client(.signedOut), rules: nil, allowUnauthenticated: true, at: closed, query: nil, tree: .empty, now: 0))
        #expect(Access.readDenied(.client(.signedOut), rules: nil, allowUnauthenticated: false, at: closed, query: nil, tree: .empty, now: 0))
        #expect(!Access.readDenied(.administrator(override: nil), rules: rules, allowUnauthenticated: false, at: closed, query: nil, tree: .empty, now: 0))
        #expect(!Access.readDenied(.client(.signedOut), rules: rules, allowUnauthenticated: false, at: path, query: nil, tree: .empty, now: 0))
        #expect(Access.readDenied(.client(.signedOut), rules: rules, allowUnauthenticated: true, at: closed, query: nil, tree: .empty, now: 0))
        #expect(Access.readDenied(.administrator(override: .signedOut), rules: rules, allowUnauthenticated: true, at: closed, query: nil, tree: .empty, now: 0))
        // The query variable comes from the listen's parameters.
        var params = QueryParams()
        params.index = .child(try Path(parsing: "/owner"))
        params.limit = 5
        #expect(!Access.readDenied(.client(.signedOut), rules: rules, allowUnauthenticated: false, at: q, query: params, tree: .empty, now: 0))
        params.limit = 50
        #expect(Access.readDenied(.client(.signedOut), rules: rules, allowUnauthenticated: false, at: q, query: params, tree: .empty, now: 0))
        #expect(Access.readDenied(.client(.signedOut), rules: rules, allowUnauthenticated: false, at: q, query: nil, tree: .empty, now: 0))
        #expect(Access.writeRefused(.client(.signedOut), hasRules: false, allowUnauthenticated: false))
        #expect(!Access.writeRefused(.client(.signedOut), hasRules: true, allowUnauthenticated: false))
        #expect(!Access.writeRefused(.administrator(override: nil), hasRules: false, allowUnauthenticated: false))
        #expect(Access.writeRefused(.refused("x"), hasRules: true, allowUnauthenticated: true))
    }
}
