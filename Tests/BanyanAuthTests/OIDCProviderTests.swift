import BanyanAuth
import BanyanBasics
import BanyanTree
import Crypto
import Testing
import _CryptoExtras

/// A provider's ID tokens as `accounts:signInWithIdp` verifies them (keys made here): what is
/// accepted and, for each way a token can be wrong, the reason it is refused.
@Suite struct OIDCProviderTests {
    static let t = TokenVerifierTests.t
    static let now = TokenVerifierTests.now
    static let issuer = "https://accounts.google.com"

    static func claims(
        sub: String? = "1100220033", iat: Int64 = t, exp: Int64? = nil, iss: String = issuer, aud: String = #""web-client""#, extra: String = ""
    ) -> String {
        var members = [#""iss":"\#(iss)""#, #""aud":\#(aud)"#, #""iat":\#(iat)"#, #""exp":\#(exp ?? iat + 3600)"#]
        if let sub { members.append(#""sub":"\#(sub)""#) }
        if !extra.isEmpty { members.append(extra) }
        return "{" + members.joined(separator: ",") + "}"
    }

    static func provider(audiences: [String] = ["web-client", "ios-client"], keys: String? = nil) throws -> OIDCProvider {
        let file = try keys ?? TokenFactory.jwks(try #require(TokenFactory.rsa))
        return try OIDCProvider(settings: .init(id: "google.com", issuer: issuer, audiences: audiences), keys: Array(file.utf8))
    }

    static func refusal(_ result: Result<OIDCIdentity, TokenError>) -> TokenError? {
        if case .failure(let e) = result { return e }
        return nil
    }

    @Test("a valid token names its provider, subject and profile claims; any configured audience, alone or in an array, is accepted")
    func valid() throws {
        let key = try #require(TokenFactory.rsa)
        let p = try Self.provider()
        let profile = #""email":"ada@example.com","email_verified":true,"name":"Ada L","given_name":"Ada","family_name":"L","picture":"https://p.example/a.png""#
        let identity = try p.verify(try TokenFactory.rs256(Self.claims(extra: profile), key: key), now: Self.now).get()
        #expect(identity.provider == "google.com" && identity.subject == "1100220033" && identity.expires == (Self.t + 3600) * 1000)
        #expect(identity.email == "ada@example.com" && identity.emailVerified && identity.name == "Ada L" && identity.picture == "https://p.example/a.png")
        #expect(identity.givenName == "Ada" && identity.familyName == "L")
        let second = try p.verify(try TokenFactory.rs256(Self.claims(aud: #""ios-client""#), key: key), now: Self.now).get()
        #expect(second.email == nil && !second.emailVerified && second.name == nil)
        #expect(try p.verify(try TokenFactory.rs256(Self.claims(aud: #"["other","ios-client"]"#), key: key), now: Self.now).get().subject == "1100220033")
        // Some providers send email_verified as a string.
        let stringly = try p.verify(try TokenFactory.rs256(Self.claims(extra: #""email":"a@b.c","email_verified":"true""#), key: key), now: Self.now).get()
        #expect(stringly.emailVerified)
    }

    @Test("refused: alg none, HS256, RS512, unknown kid, another key, tampered claims, wrong iss or aud, expired, not yet valid, no sub, oversize")
    func refusals() throws {
        let key = try #require(TokenFactory.rsa)
        let other = try #require(TokenFactory.otherRSA)
        let p = try Self.provider()
        func verdict(_ token: String) -> TokenError? { Self.refusal(p.verify(token, now: Self.now)) }
        let good = Self.claims()
        #expect(verdict(TokenFactory.b64(#"{"alg":"none"}"#) + "." + TokenFactory.b64(good) + ".") == .algorithmNotAllowed("none"))
        #expect(verdict(TokenFactory.hs256(good, secret: Array("web-client".utf8))) == .algorithmNotAllowed("HS256"))
        #expect(verdict(try TokenFactory.rs256(good, key: key, header: #"{"alg":"RS512","kid":"k1"}"#)) == .algorithmNotAllowed("RS512"))
        #expect(verdict(try TokenFactory.rs256(good, kid: "k9", key: key)) == .unknownKey("k9"))
        #expect(verdict(try TokenFactory.rs256(good, key: key, header: #"{"alg":"RS256"}"#)) == .unknownKey(nil))
        #expect(verdict(try TokenFactory.rs256(good, key: other)) == .badSignature)
        let parts = try TokenFactory.rs256(good, key: key).split(separator: ".").map(String.init)
        let tampered = parts[0] + "." + TokenFactory.b64(Self.claims(sub: "1100220034")) + "." + parts[2]
        #expect(verdict(tampered) == .badSignature)
        #expect(verdict(try TokenFactory.rs256(Self.claims(iss: "https://evil.example"), key: key)) == .wrongIssuer)
        #expect(verdict(try TokenFactory.rs256(Self.claims(iss: Self.issuer + "/"), key: key)) == .wrongIssuer)
        #expect(verdict(try TokenFactory.rs256(Self.claims(aud: #""someone-else""#), key: key)) == .wrongAudience)
        #expect(verdict(try TokenFactory.rs256(Self.claims(aud: #"["someone-else"]"#), key: key)) == .wrongAudience)
        #expect(verdict(try TokenFactory.rs256(Self.claims(iat: Self.t - 7200), key: key)) == .expired)
        #expect(verdict(try TokenFactory.rs256(Self.claims(iat: Self.t + 600), key: key)) == .notYetValid)
        #expect(verdict(try TokenFactory.rs256(Self.claims(extra: #""nbf":\#(Self.t + 600)"#), key: key)) == .notYetValid)
        #expect(verdict(try TokenFactory.rs256(Self.claims(sub: nil), key: key)) == .invalidSubject)
        #expect(verdict(try TokenFactory.rs256(Self.claims(sub: ""), key: key)) == .invalidSubject)
        #expect(verdict(try TokenFactory.rs256(Self.claims(sub: String(repeating: "x", count: 129)), key: key)) == .invalidSubject)
        let huge = try TokenFactory.rs256(Self.claims(extra: #""pad":"\#(String(repeating: "p", count: 20_000))""#), key: key)
        if case .tooLarge? = verdict(huge) {} else { Issue.record("an oversize token was not refused as too large") }
        if case .malformed? = verdict("not.a-token") {} else { Issue.record("garbage was not refused as malformed") }
        // Within the skew: accepted.
        #expect(verdict(try TokenFactory.rs256(Self.claims(iat: Self.t - 3700), key: key)) == nil)
    }

    @Test("the key file: a JWKS, Google's certificates JSON, or a bare PEM key (any kid); unusable files are refused with the reason")
    func keyFiles() throws {
        let key = try #require(TokenFactory.rsa)
        let token = try TokenFactory.rs256(Self.claims(), kid: "whatever", key: key)
        let pem = key.publicKey.pemRepresentation
        let bare = try Self.provider(keys: pem)
        #expect(bare.keyIDs == ["*"])
        #expect(try bare.verify(token, now: Self.now).get().subject == "1100220033")
        let escaped = pem.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\\n")
        let google = try Self.provider(keys: #"{"whatever":"\#(escaped)"}"#)
        #expect(google.keyIDs == ["whatever"])
        #expect(try google.verify(token, now: Self.now).get().subject == "1100220033")
        #expect(Self.refusal(try Self.provider().verify(token, now: Self.now)) == .unknownKey("whatever"))
        for (file, reason) in [
            (#"{"keys":[]}"#, "no RSA signing key"), ("not a key", "no PEM block"), ("{}", "expected a JSON object"),
            ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "neither a certificate nor a public key"),
            ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n", "not an RSA public key"),
        ] {
            #expect(throws: KeyFileError.self, "\(file)") { try Self.provider(keys: file) }
            do {
                _ = try Self.provider(keys: file)
            } catch let error as KeyFileError {
                #expect(error.message.contains(reason), "\(error.message)")
            }
        }
        #expect(throws: KeyFileError.self) { try Self.provider(audiences: []) }
        #expect(throws: KeyFileError.self) { try Self.provider(audiences: [""]) }
    }

    @Test("a request's nonce must be the token's nonce, raw or as its hex SHA-256; no nonce asked, none required")
    func nonce() throws {
        let key = try #require(TokenFactory.rsa)
        let p = try Self.provider()
        let hashed = SHA256.hash(data: Array("n-0123".utf8)).map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined()
        let raw = try p.verify(try TokenFactory.rs256(Self.claims(extra: #""nonce":"n-0123""#), key: key), now: Self.now).get()
        let digest = try p.verify(try TokenFactory.rs256(Self.claims(extra: #""nonce":"\#(hashed)""#), key: key), now: Self.now).get()
        let none = try p.verify(try TokenFactory.rs256(Self.claims(), key: key), now: Self.now).get()
        #expect(raw.answers(nonce: "n-0123") && digest.answers(nonce: "n-0123") && none.answers(nonce: nil) && raw.answers(nonce: nil))
        #expect(!raw.answers(nonce: "n-0124") && !none.answers(nonce: "n-0123"))
    }
}
