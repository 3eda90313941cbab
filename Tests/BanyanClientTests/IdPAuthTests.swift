import BanyanClient
import BanyanServer
import Crypto
import _CryptoExtras
import Foundation
import Logging
import Testing

/// `Auth.signIn(with:)` (Firebase's `AuthCredential` sign-in) against a node that accepts a test
/// OpenID Connect provider's ID tokens as `google.com`'s: the account made on first sign-in, the
/// same one after, the user's token honoured by the database under rules, and refused
/// credentials with their toolkit codes.
@Suite(.serialized) struct IdPAuthTests {
    static let issuer = "https://accounts.google.com"

    static func b64url(_ bytes: some Sequence<UInt8>) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// An RS256 ID token of the test provider (kid `g1`).
    static func idToken(sub: String, key: _RSA.Signing.PrivateKey, nonce: String? = nil, aud: String = "ios-client") throws -> String {
        let now = Int(Date().timeIntervalSince1970)
        let nonceClaim = nonce.map { #","nonce":"\#($0)""# } ?? ""
        let claims = #"{"iss":"\#(issuer)","aud":"\#(aud)","sub":"\#(sub)","iat":\#(now - 5),"exp":\#(now + 3600),"email":"ada@example.com","name":"Ada"\#(nonceClaim)}"#
        let input = b64url(Array(#"{"alg":"RS256","kid":"g1","typ":"JWT"}"#.utf8)) + "." + b64url(Array(claims.utf8))
        let signature = try key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + b64url(signature.rawRepresentation)
    }

    /// A node whose `google.com` provider is the test key (its JWKS in the node's directory).
    static func withProviderNode(key: _RSA.Signing.PrivateKey, _ body: (Int) async throws -> Void) async throws {
        let p = try key.publicKey.getKeyPrimitives()
        let jwks = #"{"keys":[{"kty":"RSA","kid":"g1","use":"sig","n":"\#(b64url(p.modulus))","e":"\#(b64url(p.publicExponent))"}]}"#
        try await AuthTests.withAccountsNode(configure: { c, dir in
            try jwks.write(toFile: dir + "/google.jwks", atomically: true, encoding: .utf8)
            c.auth.oidcProviders = [NodeConfig.OIDCProviderSettings(id: "google.com", issuer: issuer, audiences: ["ios-client"], keysFile: dir + "/google.jwks")]
        }) { port, _ in try await body(port) }
    }

    @Test("signIn(with:) a Google or OAuthProvider credential: account made once, user's token used by the database under rules, bad credentials refused")
    func identityProviderSignIn() async throws {
        let key = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        try await Self.withProviderNode(key: key) { port in
            try await AuthTests.setRules(port, ns: "idp", AuthTests.ownRecordRules)
            let db = try Database(url: "http://127.0.0.1:\(port)?ns=idp")
            defer { db.shutdown() }
            let auth = Auth(database: db)

            let token = try Self.idToken(sub: "1100220033", key: key)
            let user = try await DatabaseTests.bounded { try await auth.signIn(with: GoogleAuthProvider.credential(withIDToken: token, accessToken: "unused")) }
            #expect(user.uid == "google:1100220033" && user.providerID == "google.com" && !user.isAnonymous, "\(user)")
            #expect(auth.currentUser?.uid == user.uid)
            // The database connection carries the user's ID token: its own record, not another's.
            #expect(await AuthTests.write(db.reference(withPath: "users/\(user.uid)/name"), "Ada") == "ok")
            #expect(await AuthTests.write(db.reference(withPath: "users/someone-else/name"), "x") != "ok")

            auth.signOut()
            let again = try await DatabaseTests.bounded {
                try await auth.signIn(with: OAuthProvider.credential(withProviderID: "google.com", idToken: try Self.idToken(sub: "1100220033", key: key, nonce: "n-1"), rawNonce: "n-1"))
            }
            #expect(again.uid == user.uid, "the same provider identity is the same account")

            let stranger = try _RSA.Signing.PrivateKey(keySize: .bits2048)
            #expect(await AuthTests.code { _ = try await auth.signIn(with: GoogleAuthProvider.credential(withIDToken: try Self.idToken(sub: "1", key: stranger), accessToken: "")) } == "INVALID_IDP_RESPONSE")
            #expect(await AuthTests.code { _ = try await auth.signIn(with: GoogleAuthProvider.credential(withIDToken: try Self.idToken(sub: "1", key: key, aud: "web-client"), accessToken: "")) } == "INVALID_IDP_RESPONSE")
            #expect(await AuthTests.code { _ = try await auth.signIn(with: OAuthProvider.credential(withProviderID: "google.com", idToken: try Self.idToken(sub: "1", key: key, nonce: "a"), rawNonce: "b")) } == "INVALID_IDP_RESPONSE")
            #expect(await AuthTests.code { _ = try await auth.signIn(with: OAuthProvider.credential(withProviderID: "github.com", idToken: token)) } == "OPERATION_NOT_ALLOWED")
            #expect(auth.currentUser?.uid == again.uid, "a refused credential leaves the session")
        }
    }
}
