import BanyanBasics
@testable import BanyanServer
import BanyanTree
import Foundation
import Logging
import Testing

/// The account service's endpoints on a running node (docs/accounts.md): answers and errors in
/// the Identity Toolkit's shape, bad input, refresh tokens and reset codes, key rotation, and the
/// ID tokens it issues honoured on REST and WebSocket.
@Suite(.serialized) struct AccountServerTests {
    static let base = "/identitytoolkit.googleapis.com/v1"

    /// One exchange with optional headers: status and the body parsed as JSON (null if not).
    static func call(_ port: Int, _ method: String, _ path: String, body: String = "", headers: String = "") throws -> (status: Int, json: JSONValue) {
        let connection = try RequestDeadlineTests.Raw(port: port)
        connection.send("\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(headers)Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
        let text = connection.receive(until: "", seconds: 30).text
        let status = text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? 0
        let answer = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
        return (status, (try? JSONValue(parsing: answer)) ?? .null)
    }

    static func post(_ port: Int, _ op: String, _ body: String, admin: Bool = false) throws -> (status: Int, json: JSONValue) {
        try call(port, "POST", "\(base)/accounts:\(op)?key=k", body: body, headers: admin ? "Authorization: Bearer owner\r\n" : "")
    }

    static func code(_ json: JSONValue) -> String? {
        guard case .string(let m)? = json["error"]?["message"] else { return nil }
        return m.components(separatedBy: " : ").first
    }

    static func string(_ json: JSONValue, _ key: String) -> String {
        if case .string(let s)? = json[key] { return s }
        return ""
    }

    /// Runs `body` with the client port and data directory of a single node with a fast
    /// password hash (scrypt N = 2^10) and a reset-code file, once it takes writes.
    static func withNode(_ name: String, configure: (inout NodeConfig) -> Void = { _ in }, _ body: (Int, String) async throws -> Void) async throws {
        let dir = try temporaryDirectory(name)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var config = singleNodeConfig(dir)
        config.accounts.scryptLogN = 10
        config.accounts.resetCodeFile = dir + "/reset-codes.jsonl"
        configure(&config)
        let node = try BanyanNode.start(config: config, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        let ready = await eventually({ ((try? httpExchange(port: port, "PUT", "/ready.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30)
        #expect(ready)
        try await body(port, dir)
    }

    @Test("sign-up, sign-in and their errors in the Identity Toolkit's shape; bad input is refused before anything is proposed")
    func signUpAndErrors() async throws {
        try await Self.withNode("accounts-errors") { port, dir in

            let up = try Self.post(port, "signUp", #"{"email":"Ada@Example.com","password":"lovelace1","returnSecureToken":true}"#)
            #expect(up.status == 200 && Self.string(up.json, "kind") == "identitytoolkit#SignupNewUserResponse", "\(up)")
            #expect(!Self.string(up.json, "idToken").isEmpty && !Self.string(up.json, "refreshToken").isEmpty && Self.string(up.json, "expiresIn") == "3600")

            let again = try Self.post(port, "signUp", #"{"email":"ada@example.COM","password":"another1"}"#)
            #expect(again.status == 400)
            #expect(
                again.json.jsonString
                    == #"{"error":{"code":400,"message":"EMAIL_EXISTS","errors":[{"message":"EMAIL_EXISTS","domain":"global","reason":"invalid"}]}}"#)
            let cases: [(String, String, String)] = [
                ("signUp", #"{"email":"not-an-email","password":"lovelace1"}"#, "INVALID_EMAIL"),
                ("signUp", #"{"email":"a b@x.y","password":"lovelace1"}"#, "INVALID_EMAIL"),
                ("signUp", "{\"email\":\"\(String(repeating: "a", count: 300))@x.y\",\"password\":\"lovelace1\"}", "INVALID_EMAIL"),
                ("signUp", #"{"email":"short@x.y","password":"12345"}"#, "WEAK_PASSWORD"),
                ("signUp", #"{"email":"nopass@x.y"}"#, "MISSING_PASSWORD"),
                ("signUp", #"{"email":12,"password":"lovelace1"}"#, "INVALID_ARGUMENT"),
                ("signUp", #"{"email":"x@y.z""#, "INVALID_ARGUMENT"),
                ("signUp", "[1,2]", "INVALID_ARGUMENT"),
                ("signUp", String(repeating: "[", count: 100) + String(repeating: "]", count: 100), "INVALID_ARGUMENT"),
                ("signInWithPassword", #"{"email":"ada@example.com","password":"wrong-one"}"#, "INVALID_PASSWORD"),
                ("signInWithPassword", #"{"email":"nobody@example.com","password":"lovelace1"}"#, "EMAIL_NOT_FOUND"),
                ("signInWithPassword", #"{"email":"ada@example.com"}"#, "MISSING_PASSWORD"),
                ("signInWithCustomToken", #"{"token":"not.a.token"}"#, "INVALID_CUSTOM_TOKEN"),
                ("lookup", #"{"idToken":"garbage"}"#, "INVALID_ID_TOKEN"),
                ("sendOobCode", #"{"requestType":"VERIFY_EMAIL","email":"ada@example.com"}"#, "OPERATION_NOT_ALLOWED"),
                ("resetPassword", #"{"oobCode":"forged.code","newPassword":"whatever1"}"#, "INVALID_OOB_CODE"),
            ]
            for (op, body, expected) in cases {
                let answer = try Self.post(port, op, body)
                #expect(answer.status == 400 && Self.code(answer.json) == expected, "\(op) \(body.prefix(60)): \(answer)")
            }
            let huge = try Self.post(port, "signUp", "{\"displayName\":\"\(String(repeating: "x", count: 70_000))\"}")
            #expect(huge.status == 413 && Self.code(huge.json) == "INVALID_ARGUMENT", "\(huge.status)")
            // Administrator endpoints need administrator credentials.
            let anonymousAdmin = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan/accounts", body: #"{"email":"x@y.z"}"#)
            #expect(anonymousAdmin.status == 403 && Self.code(anonymousAdmin.json) == "INSUFFICIENT_PERMISSION")
            let list = try Self.call(port, "GET", "\(Self.base)/projects/demo-banyan/accounts:batchGet?maxResults=5000", headers: "Authorization: Bearer owner\r\n")
            #expect(list.status == 400 && Self.code(list.json) == "INVALID_ARGUMENT")
            let listed = try Self.call(port, "GET", "\(Self.base)/projects/demo-banyan/accounts:batchGet?maxResults=10", headers: "Authorization: Bearer owner\r\n")
            guard case .array(let users)? = listed.json["users"] else { Issue.record("no users: \(listed)"); return }
            #expect(users.count == 1 && users.first?["passwordHash"] == .string("UkVEQUNURUQ="), "the hash itself never leaves the node")
            #expect(try Self.call(port, "POST", "\(Self.base)/projects/Bad.Project/accounts:lookup", body: "{}").status == 400)
            #expect(try Self.call(port, "POST", "\(Self.base)/accounts:nonsense", body: "{}").status == 404)
            // A failed sign-up changed nothing: the email is still free for a good one.
            #expect(try Self.post(port, "signUp", #"{"email":"short@x.y","password":"123456"}"#).status == 200)
        }
    }

    @Test("refresh tokens: forged, of another account, after a password change, of a disabled account, with a wrong grant type; reset codes go to the hook and work once")
    func refreshAndReset() async throws {
        try await Self.withNode("accounts-refresh") { port, dir in
            func refresh(_ form: String) throws -> (status: Int, json: JSONValue) {
                try Self.call(port, "POST", "/securetoken.googleapis.com/v1/token?key=k", body: form, headers: "Content-Type: application/x-www-form-urlencoded\r\n")
            }
            let ada = try Self.post(port, "signUp", #"{"email":"ada@x.y","password":"lovelace1"}"#).json
            let grace = try Self.post(port, "signUp", #"{"email":"grace@x.y","password":"cobol1959"}"#).json
            let token = Self.string(ada, "refreshToken")
            let refreshed = try refresh("grant_type=refresh_token&refresh_token=\(token)")
            #expect(refreshed.status == 200 && Self.string(refreshed.json, "user_id") == Self.string(ada, "localId"), "\(refreshed)")
            // JSON bodies are accepted too.
            let json = try Self.call(
                port, "POST", "/securetoken.googleapis.com/v1/token", body: #"{"grant_type":"refresh_token","refresh_token":"\#(token)"}"#,
                headers: "Content-Type: application/json\r\n")
            #expect(json.status == 200)
            #expect(Self.code(try refresh("grant_type=password&refresh_token=\(token)").json) == "INVALID_GRANT_TYPE")
            #expect(Self.code(try refresh("grant_type=refresh_token").json) == "MISSING_REFRESH_TOKEN")
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(token.dropLast(3))AAA").json) == "INVALID_REFRESH_TOKEN")
            // Ada's payload under Grace's signature: refused.
            let graceMAC = Self.string(grace, "refreshToken").split(separator: ".").last ?? ""
            let spliced = "\(token.split(separator: ".").first ?? "").\(graceMAC)"
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(spliced)").json) == "INVALID_REFRESH_TOKEN")
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(String(repeating: "A", count: 10_000))").json) == "INVALID_REFRESH_TOKEN")

            // A reset code, delivered to the file hook.
            #expect(try Self.post(port, "sendOobCode", #"{"requestType":"PASSWORD_RESET","email":"ADA@x.y"}"#).status == 200)
            let line = (try? String(contentsOfFile: dir + "/reset-codes.jsonl", encoding: .utf8)) ?? ""
            let code = Self.string((try? JSONValue(parsing: line.trimmingCharacters(in: .newlines))) ?? .null, "oobCode")
            #expect(!code.isEmpty, "\(line)")
            let attrs = try FileManager.default.attributesOfItem(atPath: dir + "/reset-codes.jsonl")
            #expect((attrs[.posixPermissions] as? Int) == 0o600)
            let checked = try Self.post(port, "resetPassword", #"{"oobCode":"\#(code)"}"#)
            #expect(checked.status == 200 && Self.string(checked.json, "email") == "ada@x.y")
            #expect(Self.code(try Self.post(port, "resetPassword", #"{"oobCode":"\#(code)","newPassword":"12"}"#).json) == "WEAK_PASSWORD")
            try await Task.sleep(nanoseconds: 1_100_000_000)  // validSince has a second's resolution
            #expect(try Self.post(port, "resetPassword", #"{"oobCode":"\#(code)","newPassword":"babbage-2"}"#).status == 200)
            #expect(Self.code(try Self.post(port, "resetPassword", #"{"oobCode":"\#(code)","newPassword":"babbage-3"}"#).json) == "INVALID_OOB_CODE", "a code works once")
            #expect(Self.code(try Self.post(port, "signInWithPassword", #"{"email":"ada@x.y","password":"lovelace1"}"#).json) == "INVALID_PASSWORD")
            #expect(try Self.post(port, "signInWithPassword", #"{"email":"ada@x.y","password":"babbage-2"}"#).status == 200)
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(token)").json) == "INVALID_REFRESH_TOKEN", "the new password ended the old refresh tokens")

            // Revoking (an administrator's validSince, firebase-admin's revokeRefreshTokens) gives the
            // account a new refresh key: an anonymous account's token is no longer even sealed
            // with the account's key (so one forged with the old key, whatever its issue time,
            // is refused too), and a token issued after it works.
            let anonymous = try Self.post(port, "signUp", #"{"returnSecureToken":true}"#).json
            let anonymousToken = Self.string(anonymous, "refreshToken")
            #expect(try refresh("grant_type=refresh_token&refresh_token=\(anonymousToken)").status == 200)
            let now = Int(Date().timeIntervalSince1970)
            #expect(try Self.post(port, "update", #"{"localId":"\#(Self.string(anonymous, "localId"))","validSince":"\#(now)"}"#, admin: true).status == 200)
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(anonymousToken)").json) == "INVALID_REFRESH_TOKEN", "a new refresh key")

            // A disabled account: no sign-in, no refresh.
            let graceToken = Self.string(grace, "refreshToken")
            let disable = try Self.post(port, "update", #"{"localId":"\#(Self.string(grace, "localId"))","disableUser":true}"#, admin: true)
            #expect(disable.status == 200, "\(disable)")
            #expect(Self.code(try refresh("grant_type=refresh_token&refresh_token=\(graceToken)").json) == "USER_DISABLED")
            #expect(Self.code(try Self.post(port, "signInWithPassword", #"{"email":"grace@x.y","password":"cobol1959"}"#).json) == "USER_DISABLED")
            // A user's update with a non-administrator's request and no token is refused.
            #expect(Self.code(try Self.post(port, "update", #"{"localId":"x","disableUser":false}"#).json) == "INSUFFICIENT_PERMISSION")
        }
    }

    @Test("the service's ID tokens are honoured on REST and WebSocket under rules; after a key rotation old tokens still work and new ones name the new key")
    func tokensOnRESTAndWebSocket() async throws {
        try await Self.withNode("accounts-tokens", configure: { $0.development.allowUnauthenticated = false }) { port, _ in
            #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: RulesServerTests.rules).status == 200)
            let admin = try Self.post(port, "signUp", #"{"localId":"alice","email":"alice@x.y","password":"wonderland"}"#, admin: true)
            #expect(admin.status == 200 && Self.string(admin.json, "localId") == "alice", "\(admin)")
            let signedIn = try Self.post(port, "signInWithPassword", #"{"email":"alice@x.y","password":"wonderland"}"#).json
            let idToken = Self.string(signedIn, "idToken")
            #expect(try httpExchange(port: port, "PUT", "/users/alice.json?auth=\(idToken)", body: #"{"name":"A"}"#).status == 200)
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(idToken)").status == 200)
            #expect(try httpExchange(port: port, "PUT", "/users/bob.json?auth=\(idToken)", body: "1").status == 401)
            // A token whose claims were changed (uid bob) under alice's signature.
            let parts = idToken.split(separator: ".").map(String.init)
            let claims = String(decoding: Base64.decode(parts[1].utf8) ?? [], as: UTF8.self).replacingOccurrences(of: "alice", with: "bob")
            let forged = parts[0] + "." + Base64.encodeURL(Array(claims.utf8)) + "." + parts[2]
            let refused = try httpExchange(port: port, "GET", "/users/bob.json?auth=\(forged)")
            #expect(refused.status == 401 && refused.body.contains("signature is invalid"), "\(refused)")

            // The same token signs a realtime connection in.
            let client = try RealtimeServerTests.Client(port: port, target: "/.ws?v=5&ns=default")
            _ = client.head()
            _ = client.message()
            client.text(#"{"t":"d","d":{"r":1,"a":"auth","b":{"cred":"\#(idToken)"}}}"#)
            let answer = client.message() ?? ""
            #expect(answer.contains(#""s":"ok","d":{"auth":{"uid":"alice","provider":"password""#), "\(answer)")

            // Rotation: the previous key stays accepted; new tokens name the new key.
            let rotated = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan:rotateSigningKey", body: "{}", headers: "Authorization: Bearer owner\r\n")
            #expect(rotated.status == 200, "\(rotated)")
            #expect(try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan:rotateSigningKey", body: "{}").status == 403)
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(idToken)").status == 200, "a token of the previous key")
            let fresh = Self.string(try Self.post(port, "signInWithPassword", #"{"email":"alice@x.y","password":"wonderland"}"#).json, "idToken")
            let header = String(decoding: Base64.decode(String(fresh.split(separator: ".").first ?? "").utf8) ?? [], as: UTF8.self)
            #expect(header.contains(Self.string(rotated.json, "kid")), "\(header)")
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(fresh)").status == 200)
            // A second rotation while the replaced key is still accepted would drop it early.
            let again = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan:rotateSigningKey", body: "{}", headers: "Authorization: Bearer owner\r\n")
            #expect(again.status == 400 && Self.code(again.json) == "ROTATION_TOO_SOON", "\(again)")
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(idToken)").status == 200, "the first key is still accepted")
            // The user's own lookup with its token.
            let lookup = try Self.post(port, "lookup", #"{"idToken":"\#(fresh)"}"#)
            if case .array(let users)? = lookup.json["users"] { #expect(users.first?["localId"] == .string("alice")) } else { Issue.record("\(lookup)") }
        }
    }

    @Test("an emergency rotation (retainReplaced false) ends the replaced key's ID tokens at once, on REST, WebSocket and the account service; refresh gives working ones")
    func emergencyRotation() async throws {
        try await Self.withNode("accounts-emergency", configure: { $0.development.allowUnauthenticated = false }) { port, _ in
            #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: RulesServerTests.rules).status == 200)
            #expect(try Self.post(port, "signUp", #"{"localId":"alice","email":"alice@x.y","password":"wonderland"}"#, admin: true).status == 200)
            let signedIn = try Self.post(port, "signInWithPassword", #"{"email":"alice@x.y","password":"wonderland"}"#).json
            let leaked = Self.string(signedIn, "idToken")
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(leaked)").status == 200, "verified once (and cached)")

            let bad = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan:rotateSigningKey", body: #"{"retainReplaced":"no"}"#, headers: "Authorization: Bearer owner\r\n")
            #expect(bad.status == 400, "\(bad)")
            let rotated = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan:rotateSigningKey", body: #"{"retainReplaced":false}"#, headers: "Authorization: Bearer owner\r\n")
            #expect(rotated.status == 200 && rotated.json["previousAcceptedForMs"] == .int(0), "\(rotated)")
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(leaked)").status == 401, "the replaced key's token, cached or not")
            #expect(Self.code(try Self.post(port, "lookup", #"{"idToken":"\#(leaked)"}"#).json) != nil, "refused by the account service too")
            let client = try RealtimeServerTests.Client(port: port, target: "/.ws?v=5&ns=default")
            _ = client.head()
            _ = client.message()
            client.text(#"{"t":"d","d":{"r":1,"a":"auth","b":{"cred":"\#(leaked)"}}}"#)
            let answer = client.message() ?? ""
            #expect(answer.contains(#""r":1"#) && !answer.contains(#""s":"ok""#), "refused on WebSocket: \(answer)")

            // The session's refresh token still works and gives a token of the new key.
            let refreshed = try Self.call(
                port, "POST", "/securetoken.googleapis.com/v1/token", body: "grant_type=refresh_token&refresh_token=\(Self.string(signedIn, "refreshToken"))",
                headers: "Content-Type: application/x-www-form-urlencoded\r\n")
            #expect(refreshed.status == 200, "\(refreshed)")
            #expect(try httpExchange(port: port, "GET", "/users/alice.json?auth=\(Self.string(refreshed.json, "id_token"))").status == 200)
        }
    }

    @Test("only the configured projects are served to non-administrators, and the database honours only their tokens")
    func otherProjects() async throws {
        try await Self.withNode("accounts-projects", configure: { $0.development.allowUnauthenticated = false; $0.accounts.allowSignUp = true }) { port, _ in
            #expect(try httpExchange(port: port, "PUT", "/.settings/rules.json?auth=owner", body: RulesServerTests.rules).status == 200)
            // Anyone naming another project: refused, nothing created.
            let up = try Self.call(port, "POST", "\(Self.base)/projects/throwaway/accounts:signUp?key=k", body: #"{"email":"alice@x.y","password":"wonderland"}"#)
            #expect(up.status == 400 && Self.code(up.json) == "INVALID_PROJECT_ID", "\(up)")
            // The configured project works without naming it and naming it.
            let real = try Self.call(port, "POST", "\(Self.base)/projects/demo-banyan/accounts:signUp?key=k", body: #"{"localId":"x","email":"alice@x.y","password":"wonderland"}"#)
            #expect(real.status == 200, "\(real)")
            let uid = Self.string(real.json, "localId")
            // An administrator may keep accounts of another project; its tokens claim the same
            // uid and email but the database does not honour them.
            let owner = "Authorization: Bearer owner\r\n"
            let made = try Self.call(port, "POST", "\(Self.base)/projects/throwaway/accounts", body: #"{"localId":"\#(uid)","email":"alice@x.y","password":"wonderland"}"#, headers: owner)
            #expect(made.status == 200, "\(made)")
            let other = try Self.call(port, "POST", "\(Self.base)/projects/throwaway/accounts:signInWithPassword", body: #"{"email":"alice@x.y","password":"wonderland"}"#, headers: owner)
            let otherToken = Self.string(other.json, "idToken")
            #expect(other.status == 200 && !otherToken.isEmpty, "\(other)")
            let honoured = try httpExchange(port: port, "PUT", "/users/\(uid).json?auth=\(Self.string(real.json, "idToken"))", body: #"{"name":"A"}"#)
            #expect(honoured.status == 200, "\(honoured)")
            let refused = try httpExchange(port: port, "PUT", "/users/\(uid).json?auth=\(otherToken)", body: #"{"name":"B"}"#)
            #expect(refused.status == 401, "another project's token: \(refused)")
            #expect(try httpExchange(port: port, "GET", "/users/\(uid).json?auth=\(otherToken)").status == 401)
        }
    }

    @Test("public sign-up is off by default outside development; reset codes need the file there and are rate-limited per address")
    func productionDefaults() async throws {
        try await Self.withNode("accounts-production", configure: { $0.development.allowUnauthenticated = false; $0.accounts.resetCodeFile = nil }) { port, _ in
            let up = try Self.post(port, "signUp", #"{"email":"ada@x.y","password":"lovelace1"}"#)
            #expect(up.status == 400 && Self.code(up.json) == "OPERATION_NOT_ALLOWED", "\(up)")
            #expect(try Self.post(port, "signUp", #"{"email":"ada@x.y","password":"lovelace1"}"#, admin: true).status == 200)
            let reset = try Self.post(port, "sendOobCode", #"{"requestType":"PASSWORD_RESET","email":"ada@x.y"}"#)
            #expect(reset.status == 400 && Self.code(reset.json) == "OPERATION_NOT_ALLOWED", "no code in the log outside development: \(reset)")
        }
        try await Self.withNode("accounts-reset-limit") { port, _ in
            #expect(try Self.post(port, "signUp", #"{"email":"ada@x.y","password":"lovelace1"}"#).status == 200)
            for _ in 0..<3 { #expect(try Self.post(port, "sendOobCode", #"{"requestType":"PASSWORD_RESET","email":"ada@x.y"}"#).status == 200) }
            let limited = try Self.post(port, "sendOobCode", #"{"requestType":"PASSWORD_RESET","email":"ADA@x.y"}"#)
            #expect(limited.status == 429 && Self.code(limited.json) == "TOO_MANY_ATTEMPTS_TRY_LATER", "\(limited)")
        }
    }

    @Test("wrong passwords are limited per account and per client address; past a limit even the right one is refused, without a hash")
    func failedSignInLimits() async throws {
        try await Self.withNode("accounts-guess-limit", configure: { $0.accounts.failedSignInsPerAccount = 3; $0.accounts.failedSignInsPerClient = 5 }) { port, _ in
            for who in ["ada", "bob", "cy"] {
                #expect(try Self.post(port, "signUp", #"{"email":"\#(who)@x.y","password":"right-one"}"#).status == 200)
            }
            func signIn(_ who: String, _ password: String) throws -> (status: Int, json: JSONValue) {
                try Self.post(port, "signInWithPassword", #"{"email":"\#(who)@x.y","password":"\#(password)"}"#)
            }
            for _ in 0..<3 { #expect(Self.code(try signIn("ada", "guess").json) == "INVALID_PASSWORD") }
            let locked = try signIn("ADA", "right-one")
            #expect(locked.status == 429 && Self.code(locked.json) == "TOO_MANY_ATTEMPTS_TRY_LATER", "the account's limit, whatever the case of the email: \(locked)")
            #expect(try signIn("bob", "right-one").status == 200, "another account is not locked")
            // The client has 3 failures; two more reach its limit of 5, over every account.
            for _ in 0..<2 { #expect(Self.code(try signIn("bob", "guess").json) == "INVALID_PASSWORD") }
            let client = try signIn("cy", "right-one")
            #expect(client.status == 429 && Self.code(client.json) == "TOO_MANY_ATTEMPTS_TRY_LATER", "the address's limit: \(client)")
            #expect(Self.code(try signIn("nobody", "guess").json) == "TOO_MANY_ATTEMPTS_TRY_LATER", "refused before the account is even looked up")
        }
    }

    @Test("the rate limiter's memory is bounded and its windows end")
    func rateLimiter() {
        let limiter = RateLimiter(perMinute: 2, capacity: 3)
        #expect(limiter.allow("a", now: 0) && limiter.allow("a", now: 1) && !limiter.allow("a", now: 2))
        #expect(limiter.allow("a", now: 60_001), "a new window")
        #expect(limiter.allow("b", now: 10) && limiter.allow("c", now: 10))
        #expect(!limiter.allow("d", now: 20), "full, nothing expired")
        #expect(limiter.allow("d", now: 70_011) && limiter.count <= 3)

        let failures = RateLimiter(perMinute: 2, capacity: 2)
        #expect(!failures.exhausted("k", now: 0))
        failures.note("k", now: 0)
        failures.note("k", now: 1)
        #expect(failures.exhausted("k", now: 2) && failures.exhausted("k", now: 59_999), "checking counts nothing")
        #expect(!failures.exhausted("k", now: 60_000), "the window ends")
        failures.note("x", now: 10)
        failures.note("y", now: 10)
        #expect(failures.count <= 2 && !failures.exhausted("y", now: 11), "full: a new key is not counted, memory stays bounded")
    }

    @Test("an email whose escaped index key would not fit in a path is INVALID_EMAIL")
    func escapedEmailBound() async throws {
        #expect(throws: AccountError.self) { try AccountService.checkEmail(String(repeating: "%", count: 252) + "@%") }
        #expect(throws: Never.self) { try AccountService.checkEmail("a%b@x.y") }
        try await Self.withNode("accounts-escaped") { port, _ in
            let up = try Self.post(port, "signUp", "{\"email\":\"\(String(repeating: "%", count: 252))@%\",\"password\":\"lovelace1\"}")
            #expect(up.status == 400 && Self.code(up.json) == "INVALID_EMAIL", "\(up)")
        }
    }

    @Test("tokens are issued no earlier than the account's validSince (stamped by the leader's clock), so a fresh token is never refused")
    func issuedAtValidSince() async throws {
        try await Self.withNode("accounts-skew") { port, _ in
            let up = try Self.post(port, "signUp", #"{"email":"ada@x.y","password":"lovelace1"}"#)
            let uid = Self.string(up.json, "localId")
            // validSince ahead of this node's clock, as a leader whose clock runs ahead stamps it.
            let ahead = NodeRuntime.wallClock() / 1000 + 100
            #expect(try Self.post(port, "update", #"{"localId":"\#(uid)","validSince":"\#(ahead)"}"#, admin: true).status == 200)
            let signedIn = try Self.post(port, "signInWithPassword", #"{"email":"ada@x.y","password":"lovelace1"}"#)
            let lookup = try Self.post(port, "lookup", #"{"idToken":"\#(Self.string(signedIn.json, "idToken"))"}"#)
            #expect(lookup.status == 200, "\(lookup)")
            let refreshed = try Self.call(
                port, "POST", "/securetoken.googleapis.com/v1/token", body: "grant_type=refresh_token&refresh_token=\(Self.string(signedIn.json, "refreshToken"))",
                headers: "Content-Type: application/x-www-form-urlencoded\r\n")
            #expect(refreshed.status == 200, "\(refreshed)")
        }
    }

    @Test("an account request whose Content-Length exceeds the service's bound is refused from its head, before the body is read")
    func oversizedBodyRefusedAtHead() async throws {
        try await Self.withNode("accounts-length") { port, _ in
            let connection = try RequestDeadlineTests.Raw(port: port)
            connection.send("POST \(Self.base)/accounts:signUp?key=k HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n{")
            let text = connection.receive(until: "}}", seconds: 5).text
            #expect(text.hasPrefix("HTTP/1.1 413"), "\(text.prefix(200))")
            #expect(text.contains("INVALID_ARGUMENT"), "the Identity Toolkit's error shape")
        }
    }
}
