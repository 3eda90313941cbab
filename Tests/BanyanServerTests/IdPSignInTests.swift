import BanyanAuth
import BanyanBasics
@testable import BanyanServer
import BanyanTree
import Crypto
import Foundation
import Testing
import _CryptoExtras

/// `accounts:signInWithIdp` on a running node (docs/accounts.md, "Sign-in with an identity
/// provider"): an OpenID Connect provider configured with a JWKS made here, its ID tokens
/// exchanged for the service's own, the account `<provider>:<sub>` made once and signed into
/// after, its tokens honoured under rules, and every bad token refused with nothing changed.
@Suite(.serialized) struct IdPSignInTests {
    static let issuer = "https://accounts.google.com"

    /// A provider ID token for `sub`, signed with `key` under kid `g1`.
    static func providerToken(
        sub: String = "1100220033", key: _RSA.Signing.PrivateKey, lifetime: Int = 3600, iss: String = issuer, aud: String = "web-client",
        header: String = #"{"alg":"RS256","kid":"g1","typ":"JWT"}"#, extra: String = #","email":"ada@example.com","email_verified":true,"name":"Ada L","picture":"https://p.example/ada.png""#
    ) throws -> String {
        let now = Int(Date().timeIntervalSince1970)
        let iat = min(now, now + lifetime - 60)
        let claims = #"{"iss":"\#(iss)","aud":"\#(aud)","sub":"\#(sub)","iat":\#(iat),"exp":\#(now + lifetime)\#(extra)}"#
        let input = TokenServerTests.b64(header) + "." + TokenServerTests.b64(claims)
        let signature = try key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
    }

    /// Writes `key`'s JWKS (kid `g1`) into `dir`; the provider's settings naming it.
    static func provider(_ dir: String, key: _RSA.Signing.PrivateKey) throws -> NodeConfig.OIDCProviderSettings {
        let p = try key.publicKey.getKeyPrimitives()
        let jwks = #"{"keys":[{"kty":"RSA","kid":"g1","use":"sig","n":"\#(Base64.encodeURL(Array(p.modulus)))","e":"\#(Base64.encodeURL(Array(p.publicExponent)))"}]}"#
        try jwks.write(toFile: dir + "/google.jwks", atomically: true, encoding: .utf8)
        return NodeConfig.OIDCProviderSettings(id: "google.com", issuer: issuer, audiences: ["web-client", "ios-client"], keysFile: dir + "/google.jwks")
    }

    /// Runs `body` with the client port of a node that accepts `key`'s tokens as google.com's.
    static func withProvider(_ name: String, key: _RSA.Signing.PrivateKey, development: Bool = true, _ body: (Int) async throws -> Void) async throws {
        let keys = try temporaryDirectory(name + "-keys")
        defer { try? FileManager.default.removeItem(atPath: keys) }
        let provider = try Self.provider(keys, key: key)
        try await AccountServerTests.withNode(name, configure: { c in
            c.development.allowUnauthenticated = development
            c.auth.oidcProviders = [provider]
        }) { port, _ in try await body(port) }
    }

    static func signIn(_ port: Int, token: String, provider: String = "google.com", extra: String = "") throws -> (status: Int, json: JSONValue) {
        try AccountServerTests.post(
            port, "signInWithIdp",
            #"{"postBody":"id_token=\#(token)&providerId=\#(provider)\#(extra)","requestUri":"http://localhost","returnSecureToken":true,"returnIdpCredential":true}"#)
    }

    static func users(_ port: Int) throws -> [JSONValue] {
        let page = try AccountServerTests.call(port, "GET", "\(AccountServerTests.base)/accounts:batchGet?maxResults=100", headers: "Authorization: Bearer owner\r\n")
        if case .array(let users)? = page.json["users"] { return users }
        return []
    }

    static func claims(_ idToken: String) -> JSONValue {
        let parts = idToken.split(separator: ".")
        guard parts.count == 3, let bytes = Base64.decode(parts[1].utf8) else { return .null }
        return (try? JSONValue(parsing: bytes)) ?? .null
    }

    static let rules = """
        {
          "rules": {
            "users": {
              "$uid": {
                ".read": "auth != null && auth.uid == $uid",
                ".write": "auth != null && auth.uid == $uid && auth.provider == 'google.com' && auth.token.firebase.sign_in_provider == 'google.com' && auth.token.email_verified == true"
              }
            }
          }
        }
        """

    @Test("first sign-in makes google:<sub> with the provider's fields, the second signs into it; its tokens work under rules, refresh and lookup")
    func signInAndUse() async throws {
        let key = try #require(TokenServerTests.key)
        try await Self.withProvider("idp-signin", key: key, development: false) { port in
            #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: Self.rules).status == 200)
            let token = try Self.providerToken(key: key)
            let first = try Self.signIn(port, token: token)
            #expect(first.status == 200, "\(first)")
            let j = first.json
            #expect(j["kind"] == .string("identitytoolkit#VerifyAssertionResponse") && j["localId"] == .string("google:1100220033"))
            #expect(j["isNewUser"] == .bool(true) && j["providerId"] == .string("google.com") && j["federatedId"] == .string("https://accounts.google.com/1100220033"))
            #expect(j["email"] == .string("ada@example.com") && j["emailVerified"] == .bool(true) && j["displayName"] == .string("Ada L"))
            #expect(j["photoUrl"] == .string("https://p.example/ada.png") && j["oauthIdToken"] == .string(token) && j["expiresIn"] == .string("3600"))
            if case .string(let raw)? = j["rawUserInfo"] { #expect(try JSONValue(parsing: raw)["sub"] == .string("1100220033")) } else { Issue.record("no rawUserInfo") }
            let idToken = AccountServerTests.string(j, "idToken")
            let c = Self.claims(idToken)
            #expect(c["sub"] == .string("google:1100220033") && c["email"] == .string("ada@example.com") && c["email_verified"] == .bool(true))
            #expect(c["name"] == .string("Ada L") && c["picture"] == .string("https://p.example/ada.png"))
            #expect(c["firebase"]?["sign_in_provider"] == .string("google.com"))
            #expect(c["firebase"]?["identities"] == .object([("google.com", .array([.string("1100220033")])), ("email", .array([.string("ada@example.com")]))]))

            // The service's token works as auth= under rules on auth.uid and the provider.
            let auth = "auth=\(idToken)"
            #expect(try httpExchange(port: port, "PUT", "/users/google:1100220033.json?\(auth)", body: #"{"name":"A"}"#).status == 200)
            let mine = try httpExchange(port: port, "GET", "/users/google:1100220033.json?\(auth)")
            #expect(mine.status == 200 && mine.body == #"{"name":"A"}"#, "\(mine)")
            #expect(try httpExchange(port: port, "PUT", "/users/1100220033.json?\(auth)", body: "1").status == 401)
            // The provider's own token is not a credential of the database.
            #expect(try httpExchange(port: port, "GET", "/users/google:1100220033.json?auth=\(token)").status == 401)

            // A second sign-in (a later token with a new name) is the same account, its profile refreshed.
            let later = try Self.providerToken(key: key, aud: "ios-client", extra: #","email":"ada@example.com","email_verified":true,"name":"Ada Lovelace""#)
            let second = try Self.signIn(port, token: later)
            #expect(second.status == 200 && second.json["localId"] == .string("google:1100220033") && second.json["isNewUser"] == .bool(false), "\(second)")
            #expect(second.json["displayName"] == .string("Ada Lovelace") && second.json["photoUrl"] == nil)
            #expect(try Self.users(port).count == 1)

            // lookup: the provider's user info.
            let lookup = try AccountServerTests.post(port, "lookup", #"{"idToken":"\#(AccountServerTests.string(second.json, "idToken"))"}"#)
            guard case .array(let users)? = lookup.json["users"], let user = users.first else {
                Issue.record("\(lookup)")
                return
            }
            #expect(user["localId"] == .string("google:1100220033") && user["email"] == .string("ada@example.com") && user["emailVerified"] == .bool(true))
            guard case .array(let infos)? = user["providerUserInfo"], let info = infos.first else {
                Issue.record("\(user)")
                return
            }
            #expect(infos.count == 1 && info["providerId"] == .string("google.com") && info["rawId"] == .string("1100220033"))
            #expect(info["federatedId"] == .string("https://accounts.google.com/1100220033") && user["photoUrl"] == nil)
            #expect(info["email"] == .string("ada@example.com") && info["displayName"] == .string("Ada Lovelace"))

            // A refreshed token still says how the session signed in.
            let form = "grant_type=refresh_token&refresh_token=\(AccountServerTests.string(second.json, "refreshToken"))"
            let refreshed = try AccountServerTests.call(
                port, "POST", "/securetoken.googleapis.com/v1/token", body: form, headers: "Content-Type: application/x-www-form-urlencoded\r\n")
            #expect(refreshed.status == 200, "\(refreshed)")
            let r = Self.claims(AccountServerTests.string(refreshed.json, "id_token"))
            #expect(r["firebase"]?["sign_in_provider"] == .string("google.com") && r["sub"] == .string("google:1100220033"))

            // The provider's email is not the account's in the index: no password sign-in finds it,
            // and a password account may have it.
            let password = try AccountServerTests.post(port, "signInWithPassword", #"{"email":"ada@example.com","password":"whatever1"}"#)
            #expect(AccountServerTests.code(password.json) == "EMAIL_NOT_FOUND", "\(password)")

            // A sub with characters keys cannot hold is escaped in the uid; rawId keeps it as it is.
            let dotted = try Self.signIn(port, token: try Self.providerToken(sub: "001234.ab/c", key: key))
            #expect(dotted.json["localId"] == .string("google:001234%2Eab%2Fc") && dotted.json["federatedId"] == .string("https://accounts.google.com/001234.ab/c"), "\(dotted)")

            // A disabled account cannot sign in.
            let disable = try AccountServerTests.post(port, "update", #"{"localId":"google:1100220033","disableUser":true}"#, admin: true)
            #expect(disable.status == 200, "\(disable)")
            let refused = try Self.signIn(port, token: later)
            #expect(refused.status == 400 && AccountServerTests.code(refused.json) == "USER_DISABLED", "\(refused)")
        }
    }

    @Test("each bad token or request is refused in the Identity Toolkit's shape and makes no account")
    func refusals() async throws {
        let key = try #require(TokenServerTests.key)
        let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
        try await Self.withProvider("idp-refusals", key: key) { port in
            let good = try Self.providerToken(key: key)
            let parts = good.split(separator: ".").map(String.init)
            let unsigned = TokenServerTests.b64(#"{"alg":"none"}"#) + "." + parts[1] + "."
            let hmac = TokenServerTests.b64(#"{"alg":"HS256","kid":"g1"}"#) + "." + parts[1] + "." + parts[2]
            let cases: [(String, String, String)] = [
                ("alg none", try Self.signIn(port, token: unsigned).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("HS256", try Self.signIn(port, token: hmac).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("another key", try Self.signIn(port, token: try Self.providerToken(key: other)).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("wrong issuer", try Self.signIn(port, token: try Self.providerToken(key: key, iss: "https://evil.example")).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("wrong audience", try Self.signIn(port, token: try Self.providerToken(key: key, aud: "someone-else")).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("expired", try Self.signIn(port, token: try Self.providerToken(key: key, lifetime: -3600)).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("no sub", try Self.signIn(port, token: try Self.providerToken(sub: "", key: key)).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("too long a uid", try Self.signIn(port, token: try Self.providerToken(sub: String(repeating: "9", count: 125), key: key)).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("oversize", try Self.signIn(port, token: try Self.providerToken(key: key, extra: #","pad":"\#(String(repeating: "p", count: 17_000))""#)).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("garbage", try Self.signIn(port, token: "garbage").json.jsonString, "INVALID_IDP_RESPONSE"),
                ("nonce not answered", try Self.signIn(port, token: good, extra: "&nonce=n-1").json.jsonString, "INVALID_IDP_RESPONSE"),
                ("provider not configured", try Self.signIn(port, token: good, provider: "facebook.com").json.jsonString, "OPERATION_NOT_ALLOWED"),
                ("access token only", try AccountServerTests.post(port, "signInWithIdp", #"{"postBody":"access_token=x&providerId=google.com","requestUri":"http://localhost"}"#).json.jsonString, "INVALID_IDP_RESPONSE"),
                ("no requestUri", try AccountServerTests.post(port, "signInWithIdp", #"{"postBody":"id_token=\#(good)&providerId=google.com"}"#).json.jsonString, "MISSING_REQUEST_URI"),
                ("linking", try AccountServerTests.post(port, "signInWithIdp", #"{"postBody":"id_token=\#(good)&providerId=google.com","requestUri":"http://localhost","idToken":"x"}"#).json.jsonString, "OPERATION_NOT_ALLOWED"),
            ]
            for (name, answer, code) in cases {
                #expect(answer.contains(#""message":"\#(code)"#) && answer.contains(#""code":400"#), "\(name): \(answer)")
            }
            #expect(try Self.users(port).isEmpty, "a refused sign-in made an account")
            // The good token still works afterwards.
            #expect(try Self.signIn(port, token: good).status == 200)
            #expect(try Self.users(port).count == 1)
        }
    }

    @Test("auth.oidc_providers: parsed, checked at start, and its key files loaded with errors naming the setting and the file")
    func configuration() throws {
        let key = try #require(TokenServerTests.key)
        let dir = try temporaryDirectory("idp-config")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        _ = try Self.provider(dir, key: key)
        let yaml = """
            auth:
              clock_skew_seconds: 60
              oidc_providers:
                - id: google.com
                  issuer: https://accounts.google.com
                  audience: web-client
                  keys_file: \(dir)/google.jwks
                - id: oidc.example
                  issuer: https://id.example
                  audience: [a, b]
                  keys_file: \(dir)/google.jwks
                  clock_skew_seconds: 5
                  uid_prefix: example
            """
        let c = try NodeConfig.parse(yaml: yaml)
        #expect(c.auth.oidcProviders.map(\.id) == ["google.com", "oidc.example"] && c.auth.oidcProviders[1].audiences == ["a", "b"])
        let providers = try c.loadOIDCProviders()
        #expect(providers["google.com"]?.settings.clockSkew == 60_000 && providers["oidc.example"]?.settings.clockSkew == 5_000)
        #expect(providers["google.com"]?.keyIDs == ["g1"] && providers["google.com"]?.settings.audiences == ["web-client"])
        #expect(providers["google.com"]?.settings.uidPrefix == "google" && providers["oidc.example"]?.settings.uidPrefix == "example")
        #expect(try NodeConfig().loadOIDCProviders().isEmpty)

        func entry(_ lines: String) -> String { "auth:\n  oidc_providers:\n    - " + lines.split(separator: "\n").joined(separator: "\n      ") }
        let file = "keys_file: \(dir)/google.jwks"
        for (text, message) in [
            (entry("issuer: i\naudience: a\n\(file)"), "needs an id"),
            (entry("id: g\naudience: a\n\(file)"), "needs an issuer"),
            (entry("id: g\nissuer: i\n\(file)"), "needs an audience"),
            (entry("id: g\nissuer: i\naudience: []\n\(file)"), "needs an audience"),
            (entry("id: g\nissuer: i\naudience: a"), "needs a keys_file"),
            (entry("id: g\nissuer: i\naudience: a\n\(file)\nscopes: x"), "unknown key auth.oidc_providers[0].scopes"),
            (entry("id: password\nissuer: i\naudience: a\n\(file)"), "must be 1 to 64"),
            (entry("id: a:b\nissuer: i\naudience: a\n\(file)"), "must be 1 to 64"),
            (entry("id: g\nissuer: i\naudience: a\n\(file)\nclock_skew_seconds: 7200"), "clock_skew_seconds"),
            (entry("id: g\nissuer: i\naudience: a\n\(file)\nuid_prefix: a.b"), "uid_prefix 'a.b'"),
            (entry("id: oidc.a\nissuer: i\naudience: a\n\(file)") + "\n    - " + "id: oidc.b\n      issuer: j\n      audience: b\n      \(file)", "uid prefix 'oidc' is another provider's"),
            (entry("id: g\nissuer: i\naudience: a\n\(file)") + "\n    - " + "id: g\n      issuer: j\n      audience: b\n      \(file)", "appears twice"),
            ("auth:\n  oidc_providers: google.com", "must be a list"),
        ] {
            do {
                _ = try NodeConfig.parse(yaml: text)
                Issue.record("accepted: \(text)")
            } catch {
                #expect(error.message.contains(message), "\(text): \(error.message)")
            }
        }
        try "{\"keys\":[]}".write(toFile: dir + "/empty.json", atomically: true, encoding: .utf8)
        for (keysFile, message) in [("\(dir)/missing.json", "cannot read the file"), ("\(dir)/empty.json", "no RSA signing key")] {
            do {
                _ = try NodeConfig.parse(yaml: entry("id: g\nissuer: i\naudience: a\nkeys_file: \(keysFile)")).loadOIDCProviders()
                Issue.record("loaded \(keysFile)")
            } catch {
                #expect(error.message.contains(message) && error.message.contains(keysFile) && error.message.contains("oidc_providers[0]"), "\(error.message)")
            }
        }
    }
}
