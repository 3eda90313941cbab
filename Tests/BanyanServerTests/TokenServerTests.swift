import BanyanAuth
import BanyanBasics
@testable import BanyanServer
import BanyanTree
import Crypto
import Foundation
import Logging
import SwiftASN1
import Testing
import X509
import _CryptoExtras

/// Verified tokens on a running node (docs/security.md): an `auth:` section with a JWKS and a
/// database secrets file (temporary files, keys made here), then REST and WebSocket requests
/// under rules with ID tokens, custom tokens and the database secret.
@Suite(.serialized) struct TokenServerTests {
    static let key: _RSA.Signing.PrivateKey? = try? _RSA.Signing.PrivateKey(keySize: .bits2048)
    static let secret = "banyan-test-database-secret-0123456789"

    static func b64(_ text: String) -> String { Base64.encodeURL(Array(text.utf8)) }

    /// An ID token for project `demo`, signed with `key` (kid `k1`), issued now, expiring in
    /// `lifetime` seconds (negative: already expired).
    static func idToken(_ uid: String, lifetime: Int = 3600, key: _RSA.Signing.PrivateKey) throws -> String {
        let now = Int(Date().timeIntervalSince1970)
        let iat = min(now, now + lifetime - 60)
        let claims = #"{"iss":"https://securetoken.google.com/demo","aud":"demo","sub":"\#(uid)","iat":\#(iat),"exp":\#(now + lifetime),"firebase":{"sign_in_provider":"password"}}"#
        let input = b64(#"{"alg":"RS256","kid":"k1"}"#) + "." + b64(claims)
        let signature = try key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
    }

    /// A Firebase 2.x custom token for `uid` signed with the database secret.
    static func customToken(_ uid: String) -> String {
        let input = b64(#"{"alg":"HS256","typ":"JWT"}"#) + "." + b64(#"{"v":0,"iat":\#(Int(Date().timeIntervalSince1970)),"d":{"uid":"\#(uid)"}}"#)
        let mac = HMAC<SHA256>.authenticationCode(for: Array(input.utf8), using: SymmetricKey(data: Array(secret.utf8)))
        return input + "." + Base64.encodeURL(Array(mac))
    }

    /// Writes the key files into `dir` and returns the configuration's `auth:` section.
    static func authSection(_ dir: String, key: _RSA.Signing.PrivateKey, skew: Int = 300) throws -> String {
        let p = try key.publicKey.getKeyPrimitives()
        let jwks = #"{"keys":[{"kty":"RSA","kid":"k1","n":"\#(Base64.encodeURL(Array(p.modulus)))","e":"\#(Base64.encodeURL(Array(p.publicExponent)))"}]}"#
        try jwks.write(toFile: dir + "/jwks.json", atomically: true, encoding: .utf8)
        try "# rotated monthly\nold-secret-0123456789abcdef\n\(secret)\n".write(toFile: dir + "/secrets", atomically: true, encoding: .utf8)
        return "auth:\n  project_id: demo\n  jwks_file: \(dir)/jwks.json\n  database_secrets_file: \(dir)/secrets\n  clock_skew_seconds: \(skew)\n"
    }

    @Test("REST under rules: a verified ID token reads and writes its own data only, custom tokens and the database secret work, expired and bad tokens get 401")
    func restWithVerifiedTokens() async throws {
        let key = try #require(Self.key)
        let dir = try temporaryDirectory("tokens-rest")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let yaml = try Self.authSection(dir, key: key) + "development:\n  allow_unauthenticated: false\n"
        let node = try BanyanNode.start(config: try NodeConfig.parse(yaml: yaml, over: singleNodeConfig(dir)), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/public/a.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: RulesServerTests.rules).status == 200)

        let alice = "auth=" + (try Self.idToken("alice", key: key))
        #expect(try httpExchange(port: port, "PUT", "/users/alice.json?\(alice)", body: #"{"name":"A"}"#).status == 200)
        let mine = try httpExchange(port: port, "GET", "/users/alice.json?\(alice)")
        #expect(mine.status == 200 && mine.body == #"{"name":"A"}"#)
        let denied = try httpExchange(port: port, "PUT", "/users/bob.json?\(alice)", body: #"{"name":"B"}"#)
        #expect(denied.status == 401 && denied.body.contains("Permission denied"))
        #expect(try httpExchange(port: port, "GET", "/users/bob.json?\(alice)").status == 401)
        // The same token in an Authorization header.
        let raw = try RequestDeadlineTests.Raw(port: port)
        raw.send("GET /users/alice.json HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(try Self.idToken("alice", key: key))\r\nConnection: close\r\n\r\n")
        #expect(raw.receive(until: "", seconds: 30).text.hasPrefix("HTTP/1.1 200"))

        // Expired, forged (another key), unsigned and garbage tokens: 401 with the reason.
        let expired = try httpExchange(port: port, "GET", "/users/alice.json?auth=\(try Self.idToken("alice", lifetime: -3600, key: key))")
        #expect(expired.status == 401 && expired.body.contains("Auth token is expired."), "\(expired)")
        let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
        let forged = try httpExchange(port: port, "GET", "/users/alice.json?auth=\(try Self.idToken("alice", key: other))")
        #expect(forged.status == 401 && forged.body.contains("signature is invalid"), "\(forged)")
        let unsigned = try httpExchange(port: port, "GET", "/users/alice.json?auth=\(RulesServerTests.mockToken("alice"))")
        #expect(unsigned.status == 401 && unsigned.body.contains("'none'"), "\(unsigned)")
        #expect(try httpExchange(port: port, "GET", "/public.json?auth=garbage").status == 401)

        // A custom token signed with the second secret of the file; the secret as administrator.
        #expect(try httpExchange(port: port, "PUT", "/users/carol.json?auth=\(Self.customToken("carol"))", body: #"{"name":"C"}"#).status == 200)
        let all = try httpExchange(port: port, "GET", "/users.json?auth=\(Self.secret)")
        #expect(all.status == 200 && all.body == #"{"alice":{"name":"A"},"carol":{"name":"C"}}"#, "\(all)")
        #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(Self.secret)&auth_variable_override=%7B%22uid%22%3A%22bob%22%7D").status == 401)
    }

    @Test("the auth section: parsed, checked, and its files loaded with clear errors")
    func configuration() throws {
        let key = try #require(Self.key)
        let dir = try temporaryDirectory("tokens-config")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let c = try NodeConfig.parse(yaml: try Self.authSection(dir, key: key, skew: 0))
        #expect(c.auth.effectiveIssuer == "https://securetoken.google.com/demo" && c.auth.effectiveAudience == "demo" && c.auth.clockSkewSeconds == 0)
        let verifier = try #require(try c.loadTokenVerifier())
        #expect(verifier.keyIDs == ["k1"] && verifier.acceptsIDTokens && verifier.acceptsSecrets)
        #expect(try NodeConfig().loadTokenVerifier() == nil)
        for text in [
            "auth:\n  project: demo", "auth:\n  project_id: demo", "auth:\n  jwks_file: /x", "auth:\n  clock_skew_seconds: -1",
            "auth:\n  issuer: i\n  jwks_file: /x",
        ] {
            #expect(throws: ConfigError.self, "\(text)") { try NodeConfig.parse(yaml: text) }
        }
        try "{\"keys\":[]}".write(toFile: dir + "/empty.json", atomically: true, encoding: .utf8)
        for (yaml, message) in [
            ("auth:\n  project_id: demo\n  jwks_file: \(dir)/missing.json", "cannot read"),
            ("auth:\n  project_id: demo\n  jwks_file: \(dir)/empty.json", "no RSA signing key"),
            ("auth:\n  database_secrets_file: \(dir)/jwks.json", "line 1"),
        ] {
            do {
                _ = try NodeConfig.parse(yaml: yaml).loadTokenVerifier()
                Issue.record("\(yaml) loaded")
            } catch {
                #expect(error.message.contains(message), "\(error.message)")
            }
        }
    }
}

extension TokenServerTests {
    @Test("Google's x509 format with a real certificate (swift-certificates, RSA, SHA-256): its key verifies ID tokens")
    func x509Certificate() throws {
        let key = try #require(Self.key)
        let name = try DistinguishedName { CommonName("securetoken.system.gserviceaccount.com") }
        let certificate = try DevCertificates.sign(
            publicKey: Certificate.PublicKey(key.publicKey), subject: name, issuer: name, validityDays: 7, issuerKey: Certificate.PrivateKey(key),
            extensions: Certificate.Extensions())
        let pem = try certificate.serializeAsPEM().pemString.replacingOccurrences(of: "\n", with: "\\n")
        let keys = try KeyFiles.x509(Array(#"{"k1":"\#(pem)"}"#.utf8))
        let verifier = try TokenVerifier(settings: .init(projectID: "demo"), publicKeys: keys)
        let verified = try verifier.verify(try Self.idToken("dora", key: key), now: Int64(Date().timeIntervalSince1970 * 1000)).get()
        #expect(try JSONValue(parsing: try #require(verified.auth))["uid"] == .string("dora"))
    }
}

extension RealtimeServerTests {
    @Test("verified tokens on WebSocket: auth answers {auth, expires}; bad tokens invalid_token or expired_token; at expiry an ac push signs the connection out and its listens are revoked; an event stream ends with auth_revoked")
    func verifiedTokensOnSessions() throws {
        let key = try #require(TokenServerTests.key)
        let keyDir = try temporaryDirectory("rt-tokens-keys")
        defer { try? FileManager.default.removeItem(atPath: keyDir) }
        let section = try NodeConfig.parse(yaml: try TokenServerTests.authSection(keyDir, key: key, skew: 0))
        try withNode("rt-tokens", configure: { $0.auth = section.auth }) { port, _ in
            let ready = Date().addingTimeInterval(30)
            while Date() < ready, (try? http(port, "PUT", "/public/a.json?ns=rt&auth=owner", body: "1"))?.status != 200 { Thread.sleep(forTimeInterval: 0.1) }
            #expect(try http(port, "PUT", "/.settings/rules.json?ns=rt&auth=owner", body: RulesServerTests.rules).status == 200)
            #expect(try http(port, "PUT", "/users/alice.json?ns=rt&auth=owner", body: #"{"name":"A"}"#).status == 200)

            // An event stream opened with a token of three seconds ends with auth_revoked.
            let stream = try RequestDeadlineTests.Raw(port: port)
            let streamToken = try TokenServerTests.idToken("alice", lifetime: 3, key: key)
            stream.send("GET /users/alice.json?ns=rt&auth=\(streamToken) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")

            let (client, _) = try open(port)
            client.text(#"{"t":"d","d":{"r":1,"a":"auth","b":{"cred":"not-a-token"}}}"#)
            #expect(client.message()?.contains(#""r":1,"b":{"s":"invalid_token","d":"Could not parse auth token"#) == true)
            client.text(#"{"t":"d","d":{"r":2,"a":"auth","b":{"cred":"\#(try TokenServerTests.idToken("alice", lifetime: -10, key: key))"}}}"#)
            #expect(client.message()?.contains(#""r":2,"b":{"s":"expired_token","d":"Auth token is expired."}"#) == true)

            // A token with three seconds to live: signed in, its listen allowed...
            client.text(#"{"t":"d","d":{"r":3,"a":"auth","b":{"cred":"\#(try TokenServerTests.idToken("alice", lifetime: 3, key: key))"}}}"#)
            let answer = client.message() ?? ""
            #expect(answer.contains(#""r":3,"b":{"s":"ok","d":{"auth":{"uid":"alice","provider":"password","token":{"#), "\(answer)")
            #expect(answer.contains(#""expires":"#))
            client.text(#"{"t":"d","d":{"r":4,"a":"q","b":{"p":"/users/alice","h":""}}}"#)
            let started = client.messages(until: #""r":4"#)
            #expect(started.last?.contains(#""s":"ok""#) == true, "\(started)")
            // ...until it expires: ac, then the listen is revoked.
            let after = client.messages(until: #""a":"c""#, seconds: 10)
            #expect(after.first == #"{"t":"d","d":{"a":"ac","b":{"s":"expired_token","d":"Auth token is expired."}}}"#, "\(after)")
            #expect(after.last == #"{"t":"d","d":{"a":"c","b":{"p":"users/alice"}}}"#, "\(after)")
            let streamed = stream.receive(until: "auth_revoked", seconds: 10).text
            #expect(streamed.contains("event: put") && streamed.contains("event: auth_revoked"), "\(streamed)")
            client.text(#"{"t":"d","d":{"r":5,"a":"p","b":{"p":"/users/alice","d":{"name":"Z"}}}}"#)
            #expect(client.message() == #"{"t":"d","d":{"r":5,"b":{"s":"permission_denied","d":"Permission denied"}}}"#)
            // The database secret signs in as the administrator.
            client.text(#"{"t":"d","d":{"r":6,"a":"auth","b":{"cred":"\#(TokenServerTests.secret)"}}}"#)
            #expect(client.message() == #"{"t":"d","d":{"r":6,"b":{"s":"ok","d":{"auth":null,"expires":null}}}}"#)
            client.text(#"{"t":"d","d":{"r":7,"a":"p","b":{"p":"/users/alice","d":{"name":"Z"}}}}"#)
            #expect(client.message() == #"{"t":"d","d":{"r":7,"b":{"s":"ok","d":""}}}"#)
        }
    }
}
