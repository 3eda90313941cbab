import BanyanAuth
import BanyanBasics
import BanyanTree
import Crypto
import Testing
import _CryptoExtras

/// Service accounts (docs/security.md, "Service accounts"): keys made here, the file the nodes
/// read, the tokens the key signs, each way a token can be wrong, and the token endpoint.
@Suite struct ServiceAccountsTests {
    static let uri = "http://127.0.0.1:9000/oauth2.googleapis.com/token"
    /// One key for the suite (key generation is slow in debug builds).
    static let admin: ServiceAccountKey? = try? ServiceAccountKey.generate(account: "admin@banyan", tokenURI: uri, projectID: "demo")
    static let t: Int64 = 1_795_700_000
    static let now: Int64 = t * 1000

    static func file(_ key: ServiceAccountKey) throws -> [UInt8] {
        Array(JSONValue.object([(key.account, .object([("keys", .array([try key.publicJWK()]))]))]).jsonString.utf8)
    }

    static func accounts(_ key: ServiceAccountKey) throws -> ServiceAccounts {
        try ServiceAccounts(settings: .init(audiences: [uri]), file: try file(key))
    }

    /// A token with these claims, signed by `key` (header `kid` = its key id unless given).
    static func signed(_ claims: String, key: ServiceAccountKey, header: String? = nil) throws -> String {
        let input = TokenFactory.b64(header ?? #"{"alg":"RS256","kid":"\#(key.keyID)"}"#) + "." + TokenFactory.b64(claims)
        let signature = try key.privateKey.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
    }

    static func refusal(_ result: Result<VerifiedToken, TokenError>?) -> TokenError? {
        if case .failure(let e)? = result { return e }
        return nil
    }

    @Test("a token the key signs is the administrator, named by its account; the key file reads back as written")
    func accepted() throws {
        let key = try #require(Self.admin)
        let accounts = try Self.accounts(key)
        #expect(accounts.accountNames == ["admin@banyan"])
        #expect(accounts.keyIDs == [key.keyID] && key.keyID.hasPrefix("bsa-") && key.keyID.utf8.count == 36)
        let token = try key.token(now: Self.t)
        let verified = try #require(try accounts.verifyIfOwned(token, now: Self.now)?.get())
        #expect(verified.kind == .serviceAccount("admin@banyan") && verified.administrator && verified.auth == nil)
        #expect(verified.expires == (Self.t + 3600) * 1000)

        // Google's shape, read back: same account, key id, token_uri and key.
        let text = key.fileText
        #expect(text.contains(#""type":"service_account""#) && text.contains("-----BEGIN PRIVATE KEY-----"))
        let reread = try ServiceAccountKey(file: Array(text.utf8))
        #expect(reread.account == key.account && reread.keyID == key.keyID && reread.tokenURI == Self.uri && reread.projectID == "demo")
        #expect(try accounts.verify(try reread.token(now: Self.t, lifetime: 60), now: Self.now).get().administrator)
        // Another audience the operator lists.
        let wider = try ServiceAccounts(settings: .init(audiences: ["banyan", Self.uri]), file: try Self.file(key))
        #expect(try wider.verify(try key.token(now: Self.t, audience: "banyan"), now: Self.now).get().administrator)
    }

    @Test("refused: another account's name, a different sub, the wrong audience, over an hour, expired, future, another key, other algorithms")
    func refusals() throws {
        let key = try #require(Self.admin)
        let accounts = try Self.accounts(key)
        func claims(iss: String = "admin@banyan", sub: String? = "admin@banyan", aud: String = #""\#(Self.uri)""#, iat: Int64 = Self.t, exp: Int64 = Self.t + 3600) -> String {
            #"{"iss":"\#(iss)",\#(sub.map { #""sub":"\#($0)","# } ?? "")"aud":\#(aud),"iat":\#(iat),"exp":\#(exp)}"#
        }
        func check(_ token: String) -> TokenError? { Self.refusal(accounts.verify(token, now: Self.now)) }
        // No sub is fine (oauth2client sends none); an audience array holding ours is fine.
        #expect(check(try Self.signed(claims(sub: nil), key: key)) == nil)
        #expect(check(try Self.signed(claims(aud: #"["x","\#(Self.uri)"]"#), key: key)) == nil)

        #expect(check(try Self.signed(claims(iss: "root@banyan"), key: key)) == .wrongIssuer)
        #expect(check(try Self.signed(claims(sub: "someone"), key: key)) == .invalidSubject)
        #expect(check(try Self.signed(claims(aud: #""https://elsewhere/token""#), key: key)) == .wrongAudience)
        #expect(check(try Self.signed(claims(aud: #"["x"]"#), key: key)) == .wrongAudience)
        if case .malformed(let why)? = check(try Self.signed(claims(exp: Self.t + 3601), key: key)) {
            #expect(why.contains("at most 3600 seconds"))
        } else {
            Issue.record("a token living 3601 s was not refused as malformed")
        }
        #expect(check(try Self.signed(claims(iat: Self.t - 7200, exp: Self.t - 3600), key: key)) == .expired)
        #expect(check(try Self.signed(claims(iat: Self.t + 3600, exp: Self.t + 3700), key: key)) == .notYetValid)
        #expect(check(try Self.signed(#"{"iss":"admin@banyan","aud":"\#(Self.uri)","iat":\#(Self.t)}"#, key: key)) == .malformed("exp is missing"))

        // Signed by another key under this key's kid: the signature fails.
        let other = try #require(TokenFactory.otherRSA)
        let impostor = ServiceAccountKey(account: key.account, keyID: key.keyID, tokenURI: Self.uri, projectID: nil, privateKey: other)
        #expect(check(try impostor.token(now: Self.t)) == .badSignature)
        // A kid the file does not hold: not a service account's token at all.
        let stranger = ServiceAccountKey(account: key.account, keyID: "not-a-kid", tokenURI: Self.uri, projectID: nil, privateKey: other)
        #expect(accounts.verifyIfOwned(try stranger.token(now: Self.t), now: Self.now) == nil)
        #expect(check(try stranger.token(now: Self.t)) == .unknownKey("not-a-kid"))
        #expect(accounts.verifyIfOwned("not a token", now: Self.now) == nil)

        // The algorithm is never the token's to choose: HS256 keyed with the public modulus,
        // and `none`, under a valid kid.
        let hs = TokenFactory.hs256(claims(), secret: Array(try key.privateKey.publicKey.getKeyPrimitives().modulus), header: #"{"alg":"HS256","kid":"\#(key.keyID)"}"#)
        #expect(Self.refusal(accounts.verifyIfOwned(hs, now: Self.now)) == .algorithmNotAllowed("HS256"))
        let none = TokenFactory.b64(#"{"alg":"none","kid":"\#(key.keyID)"}"#) + "." + TokenFactory.b64(claims()) + "."
        #expect(Self.refusal(accounts.verifyIfOwned(none, now: Self.now)) == .algorithmNotAllowed("none"))
    }

    @Test("the accounts file: JWKS only (Google's {kid: PEM} refused); refused without an audience, with a shared kid, a banyan- kid, or nothing in it")
    func accountsFile() throws {
        let key = try #require(Self.admin)
        let pem = key.privateKey.publicKey.pemRepresentation
        let google = Array(JSONValue.object([("svc@proj.iam.gserviceaccount.com", .object([(key.keyID, .string(pem))]))]).jsonString.utf8)
        func refused(_ audiences: [String], _ file: [UInt8]) -> String? {
            do {
                _ = try ServiceAccounts(settings: .init(audiences: audiences), file: file)
                return nil
            } catch {
                return error.message
            }
        }
        #expect(refused([Self.uri], google)?.contains("expected a JWKS") == true)
        let prefixed = ServiceAccountKey(account: "a", keyID: "banyan-1", tokenURI: Self.uri, projectID: nil, privateKey: key.privateKey)
        #expect(refused([Self.uri], try Self.file(prefixed))?.contains("names the account service's keys") == true)
        // Google's JWKS for its accounts: refused by the key id's shape.
        let googleJWKS = ServiceAccountKey(account: "svc@proj.iam.gserviceaccount.com", keyID: "0123456789abcdef0123456789abcdef01234567", tokenURI: Self.uri, projectID: nil, privateKey: key.privateKey)
        #expect(refused([Self.uri], try Self.file(googleJWKS))?.contains("is a Google service-account key's") == true)
        #expect(ServiceAccounts.isGoogleKeyID("0123456789abcdef0123456789abcdef01234567") && !ServiceAccounts.isGoogleKeyID(key.keyID))
        #expect(!ServiceAccounts.isGoogleKeyID("0123456789ABCDEF0123456789abcdef01234567") && !ServiceAccounts.isGoogleKeyID("0123"))
        // Audiences: plain HTTP only to loopback.
        for safe in ["https://db.example.com/oauth2.googleapis.com/token", "banyan", "http://127.0.0.1:9000/x", "http://localhost/x", "http://[::1]:80/x", "HTTP://127.1.2.3"] {
            #expect(ServiceAccounts.isSafeAudience(safe), "\(safe)")
        }
        for unsafe in ["http://db.example.com/token", "http://10.0.0.1:9000/oauth2.googleapis.com/token", "http://127.0.0.1.evil.example/x", "http://user@db.example.com/", "http://localhost.evil/x"] {
            #expect(!ServiceAccounts.isSafeAudience(unsafe), "\(unsafe)")
        }
        #expect(refused([], try Self.file(key))?.contains("audience") == true)
        #expect(refused([""], try Self.file(key))?.contains("audience") == true)
        #expect(refused([Self.uri], Array("[]".utf8))?.contains("JSON object") == true)
        #expect(refused([Self.uri], Array("{}".utf8))?.contains("names no service account") == true)
        let jwk = try key.publicJWK()
        let shared = JSONValue.object([("a", .object([("keys", .array([jwk]))])), ("b", .object([("keys", .array([jwk]))]))])
        #expect(refused([Self.uri], Array(shared.jsonString.utf8))?.contains("belongs to both a and b") == true)
        #expect(refused([Self.uri], Array(#"{"a":{"keys":[{"kty":"RSA","kid":"k","n":"AQAB","e":"AQAB"}]}}"#.utf8)) != nil)
        #expect(refused([Self.uri], Array(#"{"a":"pem"}"#.utf8))?.contains("a: expected a JWKS") == true)

        // Key files that are not one.
        #expect(throws: KeyFileError.self) { try ServiceAccountKey(file: Array(#"{"type":"authorized_user"}"#.utf8)) }
        #expect(throws: KeyFileError.self) { try ServiceAccountKey(file: Array(#"{"client_email":"a","private_key_id":"k","token_uri":"u","private_key":"x"}"#.utf8)) }
    }

    @Test("the token endpoint: an assertion is exchanged for itself as the access token; every bad request gets OAuth's error")
    func tokenEndpoint() throws {
        let key = try #require(Self.admin)
        let accounts = try Self.accounts(key)
        let assertion = try key.token(now: Self.t - 600, scope: "https://www.googleapis.com/auth/firebase.database")
        let ok = ServiceAccountTokenEndpoint.answer(
            fields: [("grant_type", ServiceAccountTokenEndpoint.grantType), ("assertion", assertion)], accounts: accounts, now: Self.now)
        #expect(ok.status == 200)
        #expect(ok.body["access_token"] == .string(assertion) && ok.body["token_type"] == .string("Bearer") && ok.body["expires_in"] == .int(3000))

        func error(_ fields: [(String, String)], _ accounts: ServiceAccounts?) -> String? {
            let a = ServiceAccountTokenEndpoint.answer(fields: fields, accounts: accounts, now: Self.now)
            guard a.status == 400, case .string(let code)? = a.body["error"], a.body["error_description"] != nil else { return nil }
            return code
        }
        let grant = ("grant_type", ServiceAccountTokenEndpoint.grantType)
        #expect(error([], accounts) == "invalid_request")
        #expect(error([("grant_type", "refresh_token"), ("assertion", assertion)], accounts) == "unsupported_grant_type")
        #expect(error([grant], accounts) == "invalid_request")
        #expect(error([grant, ("assertion", assertion)], nil) == "invalid_grant")
        #expect(error([grant, grant, ("assertion", assertion)], accounts) == "invalid_request")
        #expect(error([grant, ("assertion", "x"), ("assertion", assertion)], accounts) == "invalid_request")
        // A future iat within the skew: honoured until exp plus the skew (an hour after iat),
        // checked again then: refused past that.
        let early = try key.token(now: Self.t + 200)
        let verified = try accounts.verify(early, now: Self.now).get()
        #expect(verified.expires == (Self.t + 3800) * 1000 && verified.validUntil == (Self.t + 4100) * 1000)
        #expect(Self.refusal(accounts.verify(early, now: (Self.t + 4100) * 1000)) == .expired)
        #expect(Self.refusal(accounts.verify(early, now: (Self.t + 4099) * 1000)) == nil)
        #expect(error([grant, ("assertion", "garbage")], accounts) == "invalid_grant")
        #expect(error([grant, ("assertion", try key.token(now: Self.t - 7200))], accounts) == "invalid_grant")
    }
}
