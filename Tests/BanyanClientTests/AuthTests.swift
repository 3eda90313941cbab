@_spi(Testing) import BanyanClient
import BanyanServer
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Logging
import Testing

/// `Auth` against a real node's account service (in process): sign-up and sign-in with their
/// errors, the database connection under rules with the user's token, token refresh (scheduled,
/// forced, and after the database refused the credential), sign-out dropping access, password
/// and email changes, password reset through the node's reset-code file, and deletion.
@Suite(.serialized) struct AuthTests {
    typealias R = DatabaseTests.Recorder

    /// A node with the account service (a fast password hash, reset codes to a file), once it
    /// takes writes: the client port and the data directory.
    /// `configure` may change the settings and put files in the directory first.
    static func withAccountsNode(
        configure: (inout NodeConfig, String) throws -> Void = { _, _ in }, _ body: (Int, String) async throws -> Void
    ) async throws {
        let dir = NSTemporaryDirectory() + "banyan-sdk-auth-\(UInt64.random(in: 0...UInt64.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var c = NodeConfig()
        c.dataDirectory = dir + "/data"
        c.clientAddress = HostPort(host: "127.0.0.1", port: 0)
        c.peerAddress = HostPort(host: "127.0.0.1", port: 0)
        c.accounts.scryptLogN = 10
        c.accounts.resetCodeFile = dir + "/reset-codes.jsonl"
        try configure(&c, dir)
        let node = try BanyanNode.start(config: c, logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = Int(node.clientAddress.split(separator: ":").last ?? "") ?? 0
        let admin = try Database(url: "http://127.0.0.1:\(port)?ns=ready", authToken: "owner")
        defer { admin.shutdown() }
        _ = try await DatabaseTests.bounded { try await admin.reference(withPath: "ready").setValue(true) }
        try await body(port, dir)
    }

    /// Rules: each user reads and writes only `/users/<own uid>`.
    static let ownRecordRules = #"{"rules":{"users":{"$uid":{".read":"auth != null && auth.uid === $uid",".write":"auth != null && auth.uid === $uid"}}}}"#

    static func setRules(_ port: Int, ns: String, _ rules: String) async throws {
        var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(port)/.settings/rules.json?ns=\(ns)&auth=owner")))
        request.httpMethod = "PUT"
        request.httpBody = Data(rules.utf8)
        #expect(try await DatabaseTests.status(request) == 200)
    }

    /// The latest reset code the node wrote for `email`.
    static func resetCode(_ dir: String, _ email: String) -> String? {
        let text = (try? String(contentsOfFile: dir + "/reset-codes.jsonl", encoding: .utf8)) ?? ""
        for line in text.split(separator: "\n").reversed() {
            guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any], object["email"] as? String == email else { continue }
            return object["oobCode"] as? String
        }
        return nil
    }

    /// The code of a thrown `AuthError` (or a description of what else came).
    static func code(_ body: () async throws -> Void) async -> String {
        do {
            try await body()
            return "ok"
        } catch let error as AuthError {
            return error.code
        } catch {
            return "not an AuthError: \(error)"
        }
    }

    /// A write's outcome: "ok" or the error's code.
    static func write(_ ref: DatabaseReference, _ value: Any) async -> String {
        let box = UncheckedValue(value)
        do {
            _ = try await DatabaseTests.bounded { try await ref.setValue(box.value) }
            return "ok"
        } catch {
            return (error as? DatabaseError)?.code ?? "\(error)"
        }
    }

    struct UncheckedValue: @unchecked Sendable {
        let value: Any
        init(_ value: Any) { self.value = value }
    }

    @Test("sign-up, sign-in (password, anonymous, custom token) and sign-out, with the toolkit's error codes and the auth-state listener")
    func signUpSignInAndErrors() async throws {
        try await Self.withAccountsNode { port, _ in
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=auth")
            defer { db.shutdown() }
            let auth = Auth(database: db)
            let states = R()
            auth.addStateDidChangeListener { _, user in states.add(user.map { "in \($0.uid)" } ?? "out") }
            #expect(await states.wait { $0 == "out" })

            let ada = try await DatabaseTests.bounded { try await auth.createUser(withEmail: "Ada@X.y", password: "lovelace1") }
            #expect(ada.email?.lowercased() == "ada@x.y" && !ada.uid.isEmpty && !ada.isAnonymous && ada.providerID == "password")
            #expect(auth.currentUser?.uid == ada.uid)
            #expect(await states.wait { $0 == "in \(ada.uid)" }, "\(states.all)")

            #expect(await Self.code { _ = try await auth.createUser(withEmail: "ada@x.y", password: "another1") } == "EMAIL_EXISTS")
            #expect(await Self.code { _ = try await auth.createUser(withEmail: "short@x.y", password: "12345") } == "WEAK_PASSWORD")
            #expect(await Self.code { _ = try await auth.createUser(withEmail: "not-an-email", password: "lovelace1") } == "INVALID_EMAIL")
            #expect(auth.currentUser?.uid == ada.uid, "a failed call leaves the session")

            auth.signOut()
            #expect(auth.currentUser == nil)
            #expect(await states.wait { _ in states.all.last == "out" }, "\(states.all)")
            #expect(await Self.code { _ = try await auth.signIn(withEmail: "ada@x.y", password: "wrong-one") } == "INVALID_PASSWORD")
            #expect(await Self.code { _ = try await auth.signIn(withEmail: "nobody@x.y", password: "lovelace1") } == "EMAIL_NOT_FOUND")
            do {
                _ = try await auth.signIn(withEmail: "ada@x.y", password: "wrong-one")
                Issue.record("a wrong password signed in")
            } catch let error as AuthError {
                #expect(error.status == 400 && error.firebase2xCode == .InvalidPassword, "\(error)")
            }

            let again = try await DatabaseTests.bounded { try await auth.signIn(withEmail: "ADA@x.y", password: "lovelace1") }
            #expect(again.uid == ada.uid)

            let anonymous = try await DatabaseTests.bounded { try await auth.signInAnonymously() }
            #expect(anonymous.isAnonymous && anonymous.uid != ada.uid && anonymous.email == nil)
            #expect(await states.wait { $0 == "in \(anonymous.uid)" })

            // An unsigned custom token, as firebase-admin makes for the emulator (a development
            // node takes them).
            func b64(_ s: String) -> String {
                Data(s.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                    .replacingOccurrences(of: "=", with: "")
            }
            let custom = b64(#"{"alg":"none","typ":"JWT"}"#) + "." + b64(#"{"uid":"custom-ada","claims":{"role":"editor"}}"#) + "."
            let customUser = try await DatabaseTests.bounded { try await auth.signIn(withCustomToken: custom) }
            #expect(customUser.uid == "custom-ada" && customUser.providerID == "custom")
            #expect(await Self.code { _ = try await auth.signIn(withCustomToken: "not.a.token") } == "INVALID_CUSTOM_TOKEN")
            #expect(auth.currentUser?.uid == "custom-ada")

            // No node at this address: a typed network error.
            let nowhere = try Auth(url: "http://127.0.0.1:1")
            #expect(await Self.code { _ = try await nowhere.signInAnonymously() } == "NETWORK_REQUEST_FAILED")
            #expect(throws: AuthError.self) { try Auth(url: "ftp://x") }
        }
    }

    @Test("the database connection uses the signed-in user's token under rules: own record allowed, another's denied; sign-out drops access")
    func databaseUnderRules() async throws {
        try await Self.withAccountsNode { port, _ in
            try await Self.setRules(port, ns: "rules", Self.ownRecordRules)
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=rules")
            defer { db.shutdown() }
            let auth = Auth.auth(database: db)
            #expect(Auth.auth(database: db) === auth, "one Auth per database")
            #expect(await Self.write(db.reference(withPath: "users/nobody"), ["name": "x"]) == "permission_denied")

            let grace = try await DatabaseTests.bounded { try await auth.createUser(withEmail: "grace@x.y", password: "cobol1959") }
            #expect(await Self.write(db.reference(withPath: "users/\(grace.uid)"), ["name": "Grace"]) == "ok")
            #expect(await Self.write(db.reference(withPath: "users/someone-else"), ["name": "Mallory"]) == "permission_denied")
            let read = try await DatabaseTests.bounded { try await db.reference(withPath: "users/\(grace.uid)/name").getData() }
            #expect(read.value as? String == "Grace")

            // A second database attached later gets the current token at once.
            let other = try Database(url: "http://127.0.0.1:\(port)?ns=rules")
            defer { other.shutdown() }
            auth.attach(other)
            #expect(await Self.write(other.reference(withPath: "users/\(grace.uid)/seen"), true) == "ok")

            auth.signOut()
            #expect(await Self.write(db.reference(withPath: "users/\(grace.uid)"), ["name": "after"]) == "permission_denied")
            #expect(await Self.write(other.reference(withPath: "users/\(grace.uid)"), ["name": "after"]) == "permission_denied")

            _ = try await DatabaseTests.bounded { try await auth.signIn(withEmail: "grace@x.y", password: "cobol1959") }
            #expect(await Self.write(db.reference(withPath: "users/\(grace.uid)/name"), "back") == "ok")
        }
    }

    @Test("ID tokens refresh before they expire (scheduled), when forced, and when the database refused the credential; the connection keeps its access")
    func tokenRefresh() async throws {
        try await Self.withAccountsNode { port, _ in
            try await Self.setRules(port, ns: "refresh", Self.ownRecordRules)
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=refresh")
            defer { db.shutdown() }
            // Refresh 3598 s before an hour's token expires: two seconds after each token.
            let auth = Auth(database: db, tokenRefreshMargin: 3598)
            let tokens = R()
            let seenTokens = TokenLog()
            auth.addIDTokenDidChangeListener { _, user in
                guard let user else { return tokens.add("none") }
                user.getIDToken { token, _ in
                    if let token { seenTokens.add(token) }
                    tokens.add("token \(seenTokens.count)")
                }
            }
            let linus = try await DatabaseTests.bounded { try await auth.createUser(withEmail: "linus@x.y", password: "kernel-91") }
            #expect(await tokens.wait { $0.hasPrefix("token") })
            #expect(await tokens.wait(seconds: 60) { _ in seenTokens.distinct >= 2 }, "a scheduled refresh gave a new token: \(tokens.all)")
            // The connection got it: the credential it uses is the newest token.
            var inUse: String?
            for _ in 0..<50 {
                inUse = db._credentialInUse()
                if inUse != nil, inUse == seenTokens.last { break }
                try await Task.sleep(nanoseconds: 100_000_000)
            }
            #expect(inUse != nil && inUse == seenTokens.last, "the connection still uses an older credential")
            #expect(await Self.write(db.reference(withPath: "users/\(linus.uid)"), ["v": 1]) == "ok")

            // Back to the usual margin: no more scheduled refreshes during the rest.
            auth.tokenRefreshMargin = 300
            let forced = try await DatabaseTests.bounded { try await linus.getIDToken(forcingRefresh: true) }
            #expect(!forced.isEmpty)
            let cached = try await DatabaseTests.bounded { try await linus.getIDToken() }
            #expect(!cached.isEmpty)

            // The database refuses a credential: the Auth refreshes and gives it a good one.
            let before = tokens.all.count
            db.setAuthToken("not-a-token")
            #expect(await tokens.wait { _ in tokens.all.count > before }, "a refresh after the refusal: \(tokens.all)")
            var outcome = ""
            for _ in 0..<50 {
                outcome = await Self.write(db.reference(withPath: "users/\(linus.uid)/v"), 2)
                if outcome == "ok" { break }
                try await Task.sleep(nanoseconds: 100_000_000)
            }
            #expect(outcome == "ok")
        }
    }

    final class TokenLog: @unchecked Sendable {
        private let lock = NSLock()
        private var tokens: [String] = []
        func add(_ t: String) { lock.withLock { tokens.append(t) } }
        var count: Int { lock.withLock { tokens.count } }
        var distinct: Int { lock.withLock { Set(tokens).count } }
        var last: String? { lock.withLock { tokens.last } }
    }

    @Test("password and email changes, a password reset through the node's code file, and deleting the user")
    func accountChanges() async throws {
        try await Self.withAccountsNode { port, dir in
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=changes")
            defer { db.shutdown() }
            let auth = Auth(database: db)
            let states = R()
            auth.addStateDidChangeListener { _, user in states.add(user.map { "in \($0.email ?? "-")" } ?? "out") }

            let ada = try await DatabaseTests.bounded { try await auth.createUser(withEmail: "ada@x.y", password: "lovelace1") }
            try await DatabaseTests.bounded { try await ada.updatePassword(to: "babbage-2") }
            #expect(await Self.code { try await ada.updatePassword(to: "123") } == "WEAK_PASSWORD")
            auth.signOut()
            #expect(await Self.code { _ = try await auth.signIn(withEmail: "ada@x.y", password: "lovelace1") } == "INVALID_PASSWORD")
            let signedIn = try await DatabaseTests.bounded { try await auth.signIn(withEmail: "ada@x.y", password: "babbage-2") }

            try await DatabaseTests.bounded { try await signedIn.updateEmail(to: "countess@x.y") }
            #expect(auth.currentUser?.email == "countess@x.y" && auth.currentUser?.uid == ada.uid)
            auth.signOut()
            #expect(await Self.code { _ = try await auth.signIn(withEmail: "ada@x.y", password: "babbage-2") } == "EMAIL_NOT_FOUND")
            _ = try await DatabaseTests.bounded { try await auth.signIn(withEmail: "countess@x.y", password: "babbage-2") }

            // A reset: the code goes to the node's file; it names the email, sets a password once.
            try await DatabaseTests.bounded { try await auth.sendPasswordReset(withEmail: "countess@x.y") }
            let code = try #require(Self.resetCode(dir, "countess@x.y"))
            #expect(try await DatabaseTests.bounded { try await auth.verifyPasswordResetCode(code) } == "countess@x.y")
            try await Task.sleep(nanoseconds: 1_100_000_000)  // the account's validSince has a second's resolution
            try await DatabaseTests.bounded { try await auth.confirmPasswordReset(withCode: code, newPassword: "engine-3") }
            #expect(await Self.code { try await auth.confirmPasswordReset(withCode: code, newPassword: "engine-4") } == "INVALID_OOB_CODE")
            #expect(await Self.code { try await auth.sendPasswordReset(withEmail: "nobody@x.y") } == "EMAIL_NOT_FOUND")
            let afterReset = try await DatabaseTests.bounded { try await auth.signIn(withEmail: "countess@x.y", password: "engine-3") }

            // Deleting: the session ends, the account is gone.
            try await DatabaseTests.bounded { try await afterReset.delete() }
            #expect(auth.currentUser == nil)
            #expect(await states.wait { _ in states.all.last == "out" }, "\(states.all)")
            #expect(await Self.code { _ = try await auth.signIn(withEmail: "countess@x.y", password: "engine-3") } == "EMAIL_NOT_FOUND")
            #expect(await Self.code { try await afterReset.delete() } == "NO_CURRENT_USER")
        }
    }
}
