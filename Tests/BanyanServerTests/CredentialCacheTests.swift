import BanyanAuth
import BanyanBasics
import BanyanREST
@testable import BanyanServer
import BanyanStateMachine
import BanyanTree
import Crypto
import Synchronization
import Testing
import _CryptoExtras

/// The node's cache of verified tokens (`CredentialCache` through `Credentials`): a hit names the
/// same identity as the verification did, and nothing is served that a verification at that
/// time would refuse.
@Suite struct CredentialCacheTests {
    static let key: _RSA.Signing.PrivateKey? = try? _RSA.Signing.PrivateKey(keySize: .bits2048)
    static let other: _RSA.Signing.PrivateKey? = try? _RSA.Signing.PrivateKey(keySize: .bits2048)
    /// 2026-11-27, in seconds and milliseconds.
    static let t: Int64 = 1_795_700_000
    static let now = t * 1000

    static func b64(_ text: String) -> String { Base64.encodeURL(Array(text.utf8)) }

    static func idToken(_ uid: String, exp: Int64, key: _RSA.Signing.PrivateKey) throws -> String {
        let claims = #"{"iss":"https://securetoken.google.com/demo","aud":"demo","sub":"\#(uid)","iat":\#(t),"exp":\#(exp),"firebase":{"sign_in_provider":"password"}}"#
        let input = b64(#"{"alg":"RS256","kid":"k1"}"#) + "." + b64(claims)
        let signature = try key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
    }

    static func credentials() throws -> Credentials {
        let key = try #require(Self.key)
        let p = try key.publicKey.getKeyPrimitives()
        let verifier = try TokenVerifier(
            settings: .init(projectID: "demo"), jwks: [KeyFiles.RSAComponents(keyID: "k1", modulus: Array(p.modulus), exponent: Array(p.publicExponent))])
        var development = NodeConfig.DevelopmentSettings()
        development.allowUnauthenticated = false
        return Credentials(development: development, verifier: verifier)
    }

    static func uid(_ identity: ClientIdentity) -> String? {
        guard case .client(.user(json: let json)) = identity, case .string(let uid)? = (try? JSONValue(parsing: json))?["uid"] else { return nil }
        return uid
    }

    @Test("an RS256 ID token: verified once, the same identity served from the cache until its exp plus skew, then refused as expired")
    func idTokenHitsAndExpiry() throws {
        let credentials = try Self.credentials()
        let token = try Self.idToken("alice", exp: Self.t + 3600, key: try #require(Self.key))
        let first = credentials.identityAndExpiry(.other(token), override: nil, now: Self.now)
        #expect(Self.uid(first.identity) == "alice")
        #expect(credentials.cache.count == 1)
        let second = credentials.identityAndExpiry(.other(token), override: nil, now: Self.now + 1000)
        #expect(second.identity == first.identity && second.validUntil == first.validUntil)
        let validUntil = try #require(first.validUntil)
        let skew = try #require(credentials.verifier).settings.clockSkew
        #expect(validUntil == (Self.t + 3600) * 1000 + skew)
        #expect(Self.uid(credentials.identity(.other(token), override: nil, now: validUntil - 1)) == "alice")
        guard case .refused(let reason) = credentials.identity(.other(token), override: nil, now: validUntil) else {
            Issue.record("an expired token was served")
            return
        }
        #expect(reason == TokenError.expired.reason)
        #expect(credentials.cache.count == 0)
    }

    @Test("a wrongly signed token is refused every time and never enters the cache")
    func badSignatureNotCached() throws {
        let credentials = try Self.credentials()
        let forged = try Self.idToken("mallory", exp: Self.t + 3600, key: try #require(Self.other))
        for _ in 0..<3 {
            guard case .refused = credentials.identity(.other(forged), override: nil, now: Self.now) else {
                Issue.record("a forged token was accepted")
                return
            }
        }
        #expect(credentials.cache.count == 0)
        guard case .refused(let reason) = credentials.session(forged, now: Self.now).refusal else {
            Issue.record("a forged token signed a session in")
            return
        }
        #expect(reason == TokenError.badSignature.reason)
        #expect(credentials.cache.count == 0)
    }

    @Test("an emulator token is read once; the owner token and an override are not cached")
    func emulatorTokens() throws {
        let credentials = Credentials(development: NodeConfig.DevelopmentSettings(), verifier: nil)
        let token = Self.b64(#"{"alg":"none","typ":"JWT"}"#) + "." + Self.b64(#"{"sub":"c7","exp":0}"#) + "."
        let first = credentials.identity(.other(token), override: nil, now: Self.now)
        #expect(Self.uid(first) == "c7")
        #expect(credentials.cache.count == 1)
        // The clock does not matter for an unsigned token (the emulator ignores its exp).
        #expect(credentials.identity(.other(token), override: nil, now: 0) == first)
        #expect(credentials.identity(.owner, override: #"{"uid":"x"}"#, now: Self.now) == .administrator(override: .user(json: Array(#"{"uid":"x"}"#.utf8))))
        #expect(credentials.cache.count == 1)
    }

    @Test("an account-service token is served from the cache only while its key is accepted unchanged: a rotation or retirement ends it")
    func accountKeyRotation() throws {
        let keys = Mutex<[String: AccountTokens.Key]>([:])
        let k1 = AccountTokens.Key(id: "banyan-k1", secret: Array("first-secret-0123456789abcdef0123".utf8), project: "demo")
        keys.withLock { $0[k1.id] = k1 }
        var credentials = Credentials(development: NodeConfig.DevelopmentSettings(), verifier: nil)
        credentials.accountKey = { kid, _ in keys.withLock { $0[kid] } }
        credentials.accountProjects = ["demo"]
        let subject = AccountTokens.Subject(
            uid: "bob", email: nil, emailVerified: false, displayName: nil, provider: "anonymous", claims: nil, authTime: Self.t)
        let token = AccountTokens.idToken(subject, key: k1, now: Self.t)
        #expect(Self.uid(credentials.identity(.other(token), override: nil, now: Self.now)) == "bob")
        #expect(credentials.cache.count == 1)
        #expect(Self.uid(credentials.identity(.other(token), override: nil, now: Self.now + 1)) == "bob")
        // The same kid now names another secret: the cached entry is not served.
        keys.withLock { $0[k1.id] = AccountTokens.Key(id: k1.id, secret: Array("rotated-secret-0123456789abcdef01".utf8), project: "demo") }
        guard case .refused(let reason) = credentials.identity(.other(token), override: nil, now: Self.now + 2) else {
            Issue.record("a token of a replaced key was served")
            return
        }
        #expect(reason == TokenError.badSignature.reason)
        // Back, then retired: refused as an unknown key.
        keys.withLock { $0[k1.id] = k1 }
        #expect(Self.uid(credentials.identity(.other(token), override: nil, now: Self.now + 3)) == "bob")
        keys.withLock { $0[k1.id] = nil }
        guard case .refused = credentials.identity(.other(token), override: nil, now: Self.now + 4) else {
            Issue.record("a token of a retired key was served")
            return
        }
        guard case .refused = credentials.session(token, now: Self.now + 5).refusal else {
            Issue.record("a token of a retired key signed a session in")
            return
        }
    }

    @Test("the cache's bound holds under many distinct tokens")
    func bound() throws {
        var credentials = Credentials(development: NodeConfig.DevelopmentSettings(), verifier: nil)
        credentials.cache = CredentialCache(maxEntries: 16)
        for i in 0..<200 {
            let token = Self.b64(#"{"alg":"none"}"#) + "." + Self.b64(#"{"sub":"u\#(i)"}"#) + "."
            #expect(Self.uid(credentials.identity(.other(token), override: nil, now: Self.now)) == "u\(i)")
        }
        #expect(credentials.cache.count == 16)
    }
}

extension Credentials.Session {
    /// The refusal's reason, as `.refused(reason)`; nil when signed in.
    var refusal: ClientIdentity? {
        if case .refused(_, let reason) = self { return .refused(reason) }
        return nil
    }
}
