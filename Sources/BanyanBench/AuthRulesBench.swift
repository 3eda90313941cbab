import BanyanAuth
import BanyanBasics
import BanyanREST
import BanyanRules
import BanyanTree
import Crypto
import _CryptoExtras

/// What a request's credentials and a judged write cost on one thread (issue 16): verifying a
/// token cold and from a `TokenCache`, and `Rules.decideWrite` for the cluster benchmark's
/// writes under docs/examples/bench-rules.json.
extension BanyanBench {
    static let benchNow: Int64 = 1_795_700_000_000

    /// Microseconds per call of `body`, the median of five rounds of `count` calls.
    static func microseconds(_ count: Int, _ body: () -> Void) -> Double {
        var rounds: [Double] = []
        for _ in 0..<5 {
            rounds.append(seconds { for _ in 0..<count { body() } } / Double(count) * 1e6)
        }
        return rounds.sorted()[2]
    }

    static func tokenBench() {
        print("token verification (one thread; µs per request's token):")
        let b64 = { (text: String) in Base64.encodeURL(Array(text.utf8)) }
        let seconds = benchNow / 1000
        let claims =
            #"{"iss":"https://securetoken.google.com/demo","aud":"demo","auth_time":\#(seconds),"user_id":"c7","sub":"c7","iat":\#(seconds),"exp":\#(seconds + 3600),"firebase":{"sign_in_provider":"password","identities":{}}}"#
        guard let key = try? _RSA.Signing.PrivateKey(keySize: .bits2048), let primitives = try? key.publicKey.getKeyPrimitives(),
            let verifier = try? TokenVerifier(
                settings: .init(projectID: "demo"),
                jwks: [KeyFiles.RSAComponents(keyID: "k1", modulus: Array(primitives.modulus), exponent: Array(primitives.publicExponent))])
        else {
            print("  (no RSA key could be made)")
            return
        }
        let input = b64(#"{"alg":"RS256","kid":"k1","typ":"JWT"}"#) + "." + b64(claims)
        guard let signature = try? key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5) else { return }
        let idToken = input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
        guard case .success = verifier.verify(idToken, now: benchNow) else {
            print("  (the ID token does not verify)")
            return
        }
        let emulator = b64(#"{"alg":"none","typ":"JWT"}"#) + "." + b64(#"{"sub":"c7","user_id":"c7","iat":0,"exp":0,"firebase":{"sign_in_provider":"custom"}}"#) + "."

        var verifiedCache = TokenCache<VerifiedToken>()
        let rsCold = microseconds(200) { _ = verifier.verify(idToken, now: benchNow) }
        let rsCached = microseconds(100_000) {
            if verifiedCache.lookup(idToken, now: benchNow) == nil, case .success(let v) = verifier.verify(idToken, now: benchNow) {
                verifiedCache.insert(idToken, v, valueBytes: v.auth?.count ?? 0, verifiedAt: benchNow, validUntil: v.validUntil)
            }
        }
        var unsignedCache = TokenCache<[UInt8]>()
        let emCold = microseconds(20_000) { _ = Access.unsignedTokenAuth(emulator) }
        let emCached = microseconds(100_000) {
            if unsignedCache.lookup(emulator, now: benchNow) == nil, let auth = Access.unsignedTokenAuth(emulator) {
                unsignedCache.insert(emulator, auth, valueBytes: auth.count, verifiedAt: .min, validUntil: nil)
            }
        }
        // A Firebase 2.x custom token (HS256 under a database secret) and an ID token of the
        // node's own account service (HS256 under a replicated key): both cold, as the cache
        // remembers them like any verified token.
        let secret = Array("bench-database-secret-0123456789".utf8)
        let customInput = b64(#"{"alg":"HS256","typ":"JWT"}"#) + "." + b64(#"{"v":0,"d":{"uid":"c7"},"iat":\#(seconds),"exp":\#(seconds + 3600)}"#)
        let custom = customInput + "." + Base64.encodeURL(Array(HMAC<SHA256>.authenticationCode(for: Array(customInput.utf8), using: SymmetricKey(data: secret))))
        let accountKey = AccountTokens.Key(id: AccountTokens.keyIDPrefix + "bench", secret: Array(repeating: 7, count: 32), project: "demo")
        let account = AccountTokens.idToken(
            .init(uid: "c7", email: "c7@example.com", emailVerified: true, displayName: nil, provider: "password", claims: nil, authTime: seconds),
            key: accountKey, now: seconds)
        guard let secretVerifier = try? TokenVerifier(settings: .init(projectID: "demo"), secrets: [secret]) else { return }
        if case .failure(let e) = secretVerifier.verify(custom, now: benchNow) {
            print("  (the custom token does not verify: \(e))")
            return
        }
        if case .failure(let e) = AccountTokens.verifyIDToken(account, key: { _ in accountKey }, projects: ["demo"], skew: 300_000, now: benchNow) {
            print("  (the account token does not verify: \(e))")
            return
        }
        let customCold = microseconds(20_000) { _ = secretVerifier.verify(custom, now: benchNow) }
        let accountCold = microseconds(20_000) {
            _ = AccountTokens.verifyIDToken(account, key: { _ in accountKey }, projects: ["demo"], skew: 300_000, now: benchNow)
        }
        // A service account's token (RS256 under the account's key, docs/security.md).
        let serviceKey = ServiceAccountKey(account: "ops@bench", keyID: "sa1", tokenURI: "https://bench/oauth2.googleapis.com/token", projectID: nil, privateKey: key)
        let accountsFile = JSONValue.object([("ops@bench", .object([("keys", .array([(try? serviceKey.publicJWK()) ?? .null]))]))]).jsonString
        guard let services = try? ServiceAccounts(settings: .init(audiences: [serviceKey.tokenURI]), file: Array(accountsFile.utf8)),
            let serviceToken = try? serviceKey.token(now: seconds), case .success? = services.verifyIfOwned(serviceToken, now: benchNow)
        else {
            print("  (the service account's token does not verify)")
            return
        }
        let serviceCold = microseconds(200) { _ = services.verifyIfOwned(serviceToken, now: benchNow) }
        print("  RS256 ID token (2048-bit key, \(idToken.utf8.count) bytes): cold \(format(rsCold)) µs, cached \(format(rsCached)) µs")
        print("  service account's token (RS256, 2048-bit key, \(serviceToken.utf8.count) bytes): cold \(format(serviceCold)) µs")
        print("  Firebase 2.x custom token (HS256, database secret, \(custom.utf8.count) bytes): cold \(format(customCold)) µs")
        print("  account-service ID token (HS256, replicated key, \(account.utf8.count) bytes): cold \(format(accountCold)) µs")
        print("  emulator token (alg none, \(emulator.utf8.count) bytes): cold \(format(emCold)) µs, cached \(format(emCached)) µs")
    }

    static let benchRules = #"""
        {"rules": {".read": false, ".write": false,
          "bench": {"$client": {
            ".read": "auth != null && auth.uid == $client",
            ".write": "auth != null && auth.uid == $client",
            "$key": {
              ".validate": "newData.hasChildren(['c', 'i']) && newData.child('i').isNumber() && newData.child('c').isNumber()",
              "c": {".validate": "newData.isNumber() && newData.val() >= 0"},
              "i": {".validate": "newData.val() >= 0"},
              "$other": {".validate": false}}}}}}
        """#

    static func rulesBench() {
        print("rules (docs/examples/bench-rules.json; one thread; µs per judged write):")
        guard let rules = try? Rules.parse(benchRules), let auth = Access.unsignedTokenAuth(
            Base64.encodeURL(Array(#"{"alg":"none"}"#.utf8)) + "." + Base64.encodeURL(Array(#"{"sub":"c7"}"#.utf8)) + "."),
            let authValue = try? JSONValue(parsing: auth)
        else {
            print("  (the rules do not parse)")
            return
        }
        // 64 clients' records, 200 each, as the cluster benchmark leaves them.
        var tree = Tree.empty
        for c in 0..<64 {
            for i in 0..<200 {
                guard let path = try? Path(parsing: "bench/c\(c)/k\(i)"), let record = try? Tree(json: #"{"c":\#(c),"i":\#(i)}"#) else { return }
                tree.set(record, at: path)
            }
        }
        let context = RulesRequestContext(auth: authValue, time: benchNow)
        var writes: [(Path, Tree)] = []
        for i in 0..<256 {
            guard let path = try? Path(parsing: "bench/c7/k\(i * 7)"), let record = try? Tree(json: #"{"c":7,"i":\#(i * 7)}"#) else { return }
            writes.append((path, tree.setting(record, at: path)))
        }
        var n = 0
        var allowed = 0
        for traced in [true, false] {
            let us = microseconds(20_000) {
                let (path, proposed) = writes[n & 255]
                n += 1
                if rules.decideWrite(targets: [path], context: context, current: tree, proposed: proposed, traced: traced).allowed { allowed += 1 }
            }
            print("  set of a record at /bench/c7/k<n>, \(traced ? "with the decision's trace" : "no trace"): \(format(us)) µs")
        }
        if allowed != n { print("  (some writes were denied: \(n - allowed) of \(n))") }
        // What judging adds besides the decision: the proposed tree is built beside the current one
        // (its path copied) instead of the write going into the only copy.
        var m = 0
        var kept = tree
        let beside = microseconds(20_000) {
            let (path, _) = writes[m & 255]
            m += 1
            kept = tree.setting(Tree(.int(Int64(m))), at: path.appending(ChildKey(unchecked: "i")))
        }
        var inPlace = tree
        let alone = microseconds(20_000) {
            let (path, _) = writes[m & 255]
            m += 1
            inPlace.set(Tree(.int(Int64(m))), at: path.appending(ChildKey(unchecked: "i")))
        }
        print("  the write applied beside the current tree: \(format(beside)) µs; in place: \(format(alone)) µs (\(kept.isEmpty || inPlace.isEmpty ? "?" : "64 × 200 records"))")
    }
}
