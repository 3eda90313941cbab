import BanyanAuth
import BanyanBasics
import BanyanREST
import BanyanStateMachine
@testable import BanyanServer
import BanyanTree
import Foundation
import Logging
import Testing
import _CryptoExtras

/// Service accounts on a running node (docs/security.md, "Service accounts"): the accounts
/// file written as `banyan service-account create` writes it, a node with closed rules and no
/// development access, then REST with the account's tokens, the token endpoint, and a
/// realtime session's `auth`.
@Suite(.serialized) struct ServiceAccountServerTests {
    static let key: ServiceAccountKey? = try? ServiceAccountKey.generate(account: "ops@banyan", tokenURI: "http://127.0.0.1/oauth2.googleapis.com/token", projectID: nil)

    /// Writes the accounts file into `dir` and returns the `auth:` section naming it.
    static func authSection(_ dir: String, key: ServiceAccountKey) throws -> String {
        let file = JSONValue.object([(key.account, .object([("keys", .array([try key.publicJWK()]))]))]).jsonString
        try file.write(toFile: dir + "/service-accounts.json", atomically: true, encoding: .utf8)
        return "auth:\n  service_accounts_file: \(dir)/service-accounts.json\n  service_account_audiences: [\"\(key.tokenURI)\"]\n"
    }

    /// One request with extra header lines; the status and body.
    static func exchange(_ port: Int, _ method: String, _ path: String, headers: String = "", body: String = "") throws -> (status: Int, body: String) {
        let raw = try RequestDeadlineTests.Raw(port: port)
        raw.send("\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(headers)Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
        let text = raw.receive(until: "", seconds: 30).text
        let status = text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        return (status, text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? "")
    }

    static var now: Int64 { Int64(Date().timeIntervalSince1970) }

    @Test("a service account's token is the administrator on REST (bearer, auth=, access_token=) under closed rules; the token endpoint exchanges an assertion; forged, foreign and expired tokens get 401")
    func rest() async throws {
        let key = try #require(Self.key)
        let dir = try temporaryDirectory("service-accounts")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let yaml = try Self.authSection(dir, key: key) + "development:\n  allow_unauthenticated: false\n  accept_owner_token: false\n"
        let node = try BanyanNode.start(config: try NodeConfig.parse(yaml: yaml, over: singleNodeConfig(dir)), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let token = try key.token(now: Self.now)
        let bearer = "Authorization: Bearer \(token)\r\n"
        let ready = await eventually({ ((try? Self.exchange(port, "PUT", "/.settings/rules.json", headers: bearer, body: #"{"rules":{".read":false,".write":false}}"#))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)

        let written = try Self.exchange(port, "PUT", "/vault/a.json", headers: bearer, body: #"{"n":1}"#)
        #expect(written.status == 200, "\(written)")
        #expect(try Self.exchange(port, "GET", "/vault/a/n.json?auth=\(token)").body == "1")
        // Rules deny everyone else; the owner token is off.
        #expect(try Self.exchange(port, "GET", "/vault/a.json").status == 401)
        #expect(try Self.exchange(port, "GET", "/vault/a.json?auth=owner").status == 401)

        // The token endpoint, as oauth2client calls it: a form with the assertion.
        let assertion = try key.token(now: Self.now, scope: "https://www.googleapis.com/auth/firebase.database")
        let form = "grant_type=\(ServiceAccountTokenEndpoint.grantType.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")&assertion=\(assertion)"
        let exchanged = try Self.exchange(port, "POST", "/oauth2.googleapis.com/token", headers: "Content-Type: application/x-www-form-urlencoded\r\n", body: form)
        #expect(exchanged.status == 200, "\(exchanged)")
        let answer = try JSONValue(parsing: Array(exchanged.body.utf8))
        guard case .string(let access)? = answer["access_token"], case .int(let expiresIn)? = answer["expires_in"] else {
            Issue.record("no access token in \(exchanged.body)")
            return
        }
        #expect((3590...3600).contains(expiresIn))
        #expect(try Self.exchange(port, "GET", "/vault/a/n.json?access_token=\(access)").body == "1")
        let get = try Self.exchange(port, "GET", "/oauth2.googleapis.com/token")
        #expect(get.status == 405 && get.body.contains(#""error":"invalid_request""#), "\(get)")
        let big = try Self.exchange(port, "POST", "/oauth2.googleapis.com/token", body: String(repeating: "a", count: 70_000))
        #expect(big.status == 413 && big.body.contains(#""error":"invalid_request""#), "\(big)")

        // Another key under the account's name and kid, a kid the node does not know, an
        // expired token, an assertion for another audience: refused at the endpoint and as
        // credentials, and nothing changes.
        let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
        let forged = try ServiceAccountKey(account: key.account, keyID: key.keyID, tokenURI: key.tokenURI, projectID: nil, privateKey: other).token(now: Self.now)
        let foreign = try ServiceAccountKey(account: key.account, keyID: "0123", tokenURI: key.tokenURI, projectID: nil, privateKey: other).token(now: Self.now)
        let expired = try key.token(now: Self.now - 7200)
        let elsewhere = try key.token(now: Self.now, audience: "https://elsewhere.example/token")
        for (name, bad, reason) in [
            ("forged", forged, TokenError.badSignature.reason), ("foreign", foreign, TokenError.unknownKey("0123").reason), ("expired", expired, TokenError.expired.reason),
            ("elsewhere", elsewhere, TokenError.wrongAudience.reason),
        ] {
            let refused = try Self.exchange(port, "PUT", "/vault/a.json", headers: "Authorization: Bearer \(bad)\r\n", body: "0")
            #expect(refused.status == 401 && refused.body.contains(reason), "\(name): \(refused)")
            let grant = try Self.exchange(port, "POST", "/oauth2.googleapis.com/token", body: "grant_type=\(ServiceAccountTokenEndpoint.grantType)&assertion=\(bad)")
            #expect(grant.status == 400 && grant.body.contains(#""error":"invalid_grant""#), "\(name): \(grant)")
        }
        #expect(try Self.exchange(port, "GET", "/vault/a.json", headers: bearer).body == #"{"n":1}"#)

        // A realtime session's `auth` with the token: the administrator, until its exp.
        let session = node.http.credentials.session(token, now: Self.now * 1000)
        guard case .signedIn(let identity, _, let validUntil) = session else {
            Issue.record("the token did not sign a session in: \(session)")
            return
        }
        #expect(identity == .administrator(override: nil) && validUntil != nil)
        guard case .refused(status: "invalid_token", _) = node.http.credentials.session(forged, now: Self.now * 1000) else {
            Issue.record("a forged token signed a session in")
            return
        }
    }

    @Test("with an operator token configured, the rules endpoint takes it or a service account's token, nothing else")
    func rulesWithOperatorToken() async throws {
        let key = try #require(Self.key)
        let dir = try temporaryDirectory("service-accounts-operator")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let operatorToken = "operator-token-0123456789abcdef"
        try operatorToken.write(toFile: dir + "/admin-token", atomically: true, encoding: .utf8)
        let yaml = try Self.authSection(dir, key: key) + "admin_token_file: \(dir)/admin-token\ndevelopment:\n  allow_unauthenticated: false\n  accept_owner_token: false\n"
        let node = try BanyanNode.start(config: try NodeConfig.parse(yaml: yaml, over: singleNodeConfig(dir)), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let rules = #"{"rules":{".read":false,".write":false}}"#
        let bearer = "Authorization: Bearer \(try key.token(now: Self.now))\r\n"
        #expect(await eventually({ ((try? Self.exchange(port, "PUT", "/.settings/rules.json", headers: bearer, body: rules))?.status ?? 0) == 200 }, seconds: 30))
        #expect(try Self.exchange(port, "GET", "/.settings/rules.json", headers: "Authorization: Bearer \(operatorToken)\r\n").status == 200)
        let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
        let forged = try ServiceAccountKey(account: key.account, keyID: key.keyID, tokenURI: key.tokenURI, projectID: nil, privateKey: other).token(now: Self.now)
        #expect(try Self.exchange(port, "GET", "/.settings/rules.json", headers: "Authorization: Bearer \(forged)\r\n").status == 401)
        #expect(try Self.exchange(port, "GET", "/.settings/rules.json").status == 401)
    }

    @Test("on a development node with service accounts, a token no verifier knows still counts as signed out on REST; a realtime auth names what is accepted")
    func developmentNode() throws {
        let key = try #require(Self.key)
        let file = JSONValue.object([(key.account, .object([("keys", .array([try key.publicJWK()]))]))]).jsonString
        var credentials = Credentials(development: NodeConfig.DevelopmentSettings(), verifier: nil)
        credentials.serviceAccounts = try ServiceAccounts(settings: .init(audiences: [key.tokenURI]), file: Array(file.utf8))
        let now = Self.now * 1000
        let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
        let unknown = try ServiceAccountKey(account: "x", keyID: "bsa-unknown", tokenURI: key.tokenURI, projectID: nil, privateKey: other).token(now: Self.now)
        #expect(credentials.identity(.other(unknown), override: nil, now: now) == .client(.signedOut))
        #expect(credentials.identity(.other(try key.token(now: Self.now)), override: nil, now: now) == .administrator(override: nil))
        guard case .refused(_, let reason) = credentials.session(unknown, now: now) else {
            Issue.record("an unknown token signed a session in")
            return
        }
        #expect(reason.contains("only its service accounts' tokens"), "\(reason)")
        // Off development, the same token is refused with the reason.
        var closed = NodeConfig.DevelopmentSettings()
        closed.allowUnauthenticated = false
        var strict = Credentials(development: closed, verifier: nil)
        strict.serviceAccounts = credentials.serviceAccounts
        #expect(strict.identity(.other(unknown), override: nil, now: now) == .refused(TokenError.unknownKey("bsa-unknown").reason))
    }

    @Test("configuration: the file needs its audiences and they need it; an unusable file and a kid shared with the ID-token keys are refused at start")
    func configuration() throws {
        let key = try #require(Self.key)
        let dir = try temporaryDirectory("service-accounts-config")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        _ = try Self.authSection(dir, key: key)
        func error(_ yaml: String) -> String? {
            do {
                let node = try BanyanNode.start(config: try NodeConfig.parse(yaml: yaml, over: singleNodeConfig(dir)), logger: Logger(label: "test"))
                node.shutdown()
                return nil
            } catch {
                return "\(error)"
            }
        }
        #expect(error("auth:\n  service_accounts_file: \(dir)/service-accounts.json\n")?.contains("needs auth.service_account_audiences") == true)
        #expect(error("auth:\n  service_account_audiences: [x]\n")?.contains("auth.service_accounts_file is not") == true)
        let plain = "auth:\n  service_accounts_file: \(dir)/service-accounts.json\n  service_account_audiences: [http://db.example.com/oauth2.googleapis.com/token]\n"
        #expect(error(plain)?.contains("is plain HTTP to a host other than loopback") == true)
        try "{}".write(toFile: dir + "/empty.json", atomically: true, encoding: .utf8)
        #expect(error("auth:\n  service_accounts_file: \(dir)/empty.json\n  service_account_audiences: x\n")?.contains("names no service account") == true)
        #expect(error("auth:\n  service_accounts_file: \(dir)/missing.json\n  service_account_audiences: x\n")?.contains("cannot read") == true)
        // The same key as an ID-token key too.
        let jwks = JSONValue.object([("keys", .array([try key.publicJWK()]))]).jsonString
        try jwks.write(toFile: dir + "/jwks.json", atomically: true, encoding: .utf8)
        let both = "auth:\n  project_id: demo\n  jwks_file: \(dir)/jwks.json\n  service_accounts_file: \(dir)/service-accounts.json\n  service_account_audiences: x\n"
        #expect(error(both)?.contains("is an ID-token key too") == true)
    }
}

extension RealtimeServerTests {
    @Test("a service account's token on WebSocket: auth signs the connection in as the administrator (rules do not apply); a forged one is invalid_token")
    func serviceAccountOnSessions() throws {
        let key = try #require(ServiceAccountServerTests.key)
        let keyDir = try temporaryDirectory("rt-service-account-keys")
        defer { try? FileManager.default.removeItem(atPath: keyDir) }
        let section = try NodeConfig.parse(yaml: try ServiceAccountServerTests.authSection(keyDir, key: key))
        try withNode("rt-service-account", configure: { $0.auth = section.auth }) { port, _ in
            let ready = Date().addingTimeInterval(30)
            while Date() < ready, (try? http(port, "PUT", "/.settings/rules.json?ns=rt&auth=owner", body: #"{"rules":{".read":false,".write":false}}"#))?.status != 200 {
                Thread.sleep(forTimeInterval: 0.1)
            }
            let (client, _) = try open(port)
            client.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/vault","d":1}}}"#)
            #expect(client.message() == #"{"t":"d","d":{"r":1,"b":{"s":"permission_denied","d":"Permission denied"}}}"#)
            let other = try #require(try? _RSA.Signing.PrivateKey(keySize: .bits2048))
            let forged = try ServiceAccountKey(account: key.account, keyID: key.keyID, tokenURI: key.tokenURI, projectID: nil, privateKey: other).token(now: ServiceAccountServerTests.now)
            client.text(#"{"t":"d","d":{"r":2,"a":"auth","b":{"cred":"\#(forged)"}}}"#)
            #expect(client.message() == #"{"t":"d","d":{"r":2,"b":{"s":"invalid_token","d":"Auth token signature is invalid."}}}"#)
            client.text(#"{"t":"d","d":{"r":3,"a":"auth","b":{"cred":"\#(try key.token(now: ServiceAccountServerTests.now))"}}}"#)
            let answer = client.message() ?? ""
            #expect(answer.contains(#""r":3,"b":{"s":"ok","d":{"auth":null,"expires":"#), "\(answer)")
            client.text(#"{"t":"d","d":{"r":4,"a":"p","b":{"p":"/vault","d":2}}}"#)
            #expect(client.messages(until: #""r":4"#).last == #"{"t":"d","d":{"r":4,"b":{"s":"ok","d":""}}}"#)
            #expect(try http(port, "GET", "/vault.json?ns=rt&auth=owner").body == "2")
        }
    }
}
