import BanyanAuth
import BanyanBasics
import BanyanTree
import Crypto
import Testing
import _CryptoExtras

/// Tokens built here, signed with keys made here (no fixture keys): what `TokenVerifier`
/// accepts and, for each way a token can be wrong, the reason it refuses it.
enum TokenFactory {
    /// One RSA key for the whole suite (key generation is slow in debug builds).
    static let rsa: _RSA.Signing.PrivateKey? = try? _RSA.Signing.PrivateKey(keySize: .bits2048)
    static let otherRSA: _RSA.Signing.PrivateKey? = try? _RSA.Signing.PrivateKey(keySize: .bits2048)

    static func b64(_ text: String) -> String { Base64.encodeURL(Array(text.utf8)) }

    static func rs256(_ claims: String, kid: String = "k1", key: _RSA.Signing.PrivateKey, header: String? = nil) throws -> String {
        let input = b64(header ?? #"{"alg":"RS256","kid":"\#(kid)","typ":"JWT"}"#) + "." + b64(claims)
        let signature = try key.signature(for: SHA256.hash(data: Array(input.utf8)), padding: .insecurePKCS1v1_5)
        return input + "." + Base64.encodeURL(Array(signature.rawRepresentation))
    }

    static func hs256(_ claims: String, secret: [UInt8], header: String = #"{"alg":"HS256","typ":"JWT"}"#) -> String {
        let input = b64(header) + "." + b64(claims)
        let mac = HMAC<SHA256>.authenticationCode(for: Array(input.utf8), using: SymmetricKey(data: secret))
        return input + "." + Base64.encodeURL(Array(mac))
    }

    /// A JWKS of `key`'s public half under `kid`.
    static func jwks(_ key: _RSA.Signing.PrivateKey, kid: String = "k1") throws -> String {
        let p = try key.publicKey.getKeyPrimitives()
        return #"{"keys":[{"kty":"RSA","alg":"RS256","use":"sig","kid":"\#(kid)","n":"\#(Base64.encodeURL(Array(p.modulus)))","e":"\#(Base64.encodeURL(Array(p.publicExponent)))"}]}"#
    }

    /// Firebase ID token claims for project `demo`, issued at `iat` seconds, expiring an hour later.
    static func idClaims(sub: String = "alice", iat: Int64, exp: Int64? = nil, iss: String = "https://securetoken.google.com/demo", aud: String = "demo")
        -> String
    {
        #"{"iss":"\#(iss)","aud":"\#(aud)","auth_time":\#(iat),"user_id":"\#(sub)","sub":"\#(sub)","iat":\#(iat),"exp":\#(exp ?? iat + 3600),"firebase":{"sign_in_provider":"password","identities":{}}}"#
    }
}

@Suite struct TokenVerifierTests {
    /// 2026-11-27, in seconds and in milliseconds.
    static let t: Int64 = 1_795_700_000
    static let now: Int64 = t * 1000
    static let secret = Array("0123456789abcdefghijABCDEFGHIJ0123456789".utf8)
    static let secret2 = Array("rotated-secret-ZYXWVUTSRQPONMLKJIHGFEDCBA".utf8)

    static func verifier(secrets: [[UInt8]] = [secret]) throws -> TokenVerifier {
        let key = try #require(TokenFactory.rsa)
        let jwks = try KeyFiles.jwks(Array(try TokenFactory.jwks(key).utf8))
        return try TokenVerifier(settings: .init(projectID: "demo"), jwks: jwks, secrets: secrets)
    }

    static func refusal(_ result: Result<VerifiedToken, TokenError>) -> TokenError? {
        if case .failure(let e) = result { return e }
        return nil
    }

    @Test("a valid ID token gives the rules' auth {uid, provider, token} and its expiry")
    func validIDToken() throws {
        let key = try #require(TokenFactory.rsa)
        let token = try TokenFactory.rs256(TokenFactory.idClaims(iat: Self.t - 10), key: key)
        let verified = try Self.verifier().verify(token, now: Self.now).get()
        #expect(verified.kind == .idToken && !verified.administrator)
        #expect(verified.expires == (Self.t - 10 + 3600) * 1000)
        #expect(verified.validUntil == (Self.t - 10 + 3600) * 1000 + 300_000)
        let auth = try JSONValue(parsing: try #require(verified.auth))
        #expect(auth["uid"] == .string("alice"))
        #expect(auth["provider"] == .string("password"))
        #expect(auth["token"]?["aud"] == .string("demo"))
    }

    @Test("ID tokens: expired, not yet valid beyond the skew, wrong iss or aud, bad sub are refused with their reason")
    func idTokenClaims() throws {
        let key = try #require(TokenFactory.rsa)
        let v = try Self.verifier()
        func verdict(_ claims: String) throws -> TokenError? { Self.refusal(v.verify(try TokenFactory.rs256(claims, key: key), now: Self.now)) }
        // Expired an hour ago; expired a minute ago is within the 5-minute skew.
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t - 7200)) == .expired)
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t - 3660)) == nil)
        // Issued 10 minutes ahead of our clock: refused; 2 minutes ahead: within the skew.
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t + 600)) == .notYetValid)
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t + 120)) == nil)
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t, iss: "https://securetoken.google.com/other")) == .wrongIssuer)
        #expect(try verdict(TokenFactory.idClaims(iat: Self.t, aud: "other")) == .wrongAudience)
        #expect(try verdict(TokenFactory.idClaims(sub: "", iat: Self.t)) == .invalidSubject)
        #expect(try verdict(TokenFactory.idClaims(sub: String(repeating: "x", count: 129), iat: Self.t)) == .invalidSubject)
        #expect(try verdict(#"{"iss":"https://securetoken.google.com/demo","aud":"demo","sub":"a","iat":"soon","exp":1}"#) == .malformed("iat is not a time in seconds"))
        // A zero skew: a token a second past its exp is expired.
        var settings = TokenVerifier.Settings(projectID: "demo")
        settings.clockSkew = 0
        let strict = try TokenVerifier(settings: settings, jwks: try KeyFiles.jwks(Array(try TokenFactory.jwks(key).utf8)))
        #expect(Self.refusal(strict.verify(try TokenFactory.rs256(TokenFactory.idClaims(iat: Self.t - 3601), key: key), now: Self.now)) == .expired)
    }

    @Test("ID tokens: unknown kid, another key, a tampered payload, alg none, HS256 with the public key (algorithm confusion)")
    func idTokenSignatures() throws {
        let key = try #require(TokenFactory.rsa)
        let other = try #require(TokenFactory.otherRSA)
        let v = try Self.verifier()
        let claims = TokenFactory.idClaims(iat: Self.t)
        #expect(Self.refusal(v.verify(try TokenFactory.rs256(claims, kid: "k9", key: key), now: Self.now)) == .unknownKey("k9"))
        #expect(Self.refusal(v.verify(try TokenFactory.rs256(claims, key: key, header: #"{"alg":"RS256"}"#), now: Self.now)) == .unknownKey(nil))
        #expect(Self.refusal(v.verify(try TokenFactory.rs256(claims, key: other), now: Self.now)) == .badSignature)
        // Tampered: bob's claims under alice's signature.
        let genuine = try TokenFactory.rs256(claims, key: key).split(separator: ".")
        let forged = genuine[0] + "." + TokenFactory.b64(TokenFactory.idClaims(sub: "bob", iat: Self.t)) + "." + genuine[2]
        #expect(Self.refusal(v.verify(String(forged), now: Self.now)) == .badSignature)
        // Unsigned.
        let unsigned = TokenFactory.b64(#"{"alg":"none","typ":"JWT"}"#) + "." + TokenFactory.b64(claims) + "."
        #expect(Self.refusal(v.verify(unsigned, now: Self.now)) == .algorithmNotAllowed("none"))
        // HS256 keyed with the RSA public key's bytes (the classic confusion): never checked
        // with an RSA key; without database secrets HS256 is not accepted at all.
        let publicDER = Array(key.publicKey.derRepresentation)
        let publicPEM = Array(key.publicKey.pemRepresentation.utf8)
        let confused = TokenFactory.hs256(claims, secret: publicPEM, header: #"{"alg":"HS256","kid":"k1","typ":"JWT"}"#)
        #expect(Self.refusal(v.verify(confused, now: Self.now)) == .badSignature)
        #expect(Self.refusal(v.verify(TokenFactory.hs256(claims, secret: publicDER), now: Self.now)) == .badSignature)
        let idOnly = try Self.verifier(secrets: [])
        #expect(Self.refusal(idOnly.verify(confused, now: Self.now)) == .algorithmNotAllowed("HS256"))
        for alg in ["RS512", "ES256", "PS256", "HS512", "None", ""] {
            let token = TokenFactory.b64(#"{"alg":"\#(alg)","kid":"k1"}"#) + "." + TokenFactory.b64(claims) + ".c2ln"
            #expect(Self.refusal(v.verify(token, now: Self.now)) == .algorithmNotAllowed(alg))
        }
    }

    @Test("oversized and malformed tokens are refused without a crash")
    func limits() throws {
        let key = try #require(TokenFactory.rsa)
        let v = try Self.verifier()
        let big = try TokenFactory.rs256(#"{"pad":"\#(String(repeating: "x", count: 16_000))"}"#, key: key)
        #expect(Self.refusal(v.verify(big, now: Self.now)) == .tooLarge(big.utf8.count))
        let deep = String(repeating: #"{"a":"#, count: 40) + "1" + String(repeating: "}", count: 40)
        guard case .malformed? = Self.refusal(v.verify(try TokenFactory.rs256(deep, key: key), now: Self.now)) else {
            Issue.record("deep claims not refused as malformed")
            return
        }
        for junk in ["", "a.b", "a.b.c.d", "!!.e30.", "e30.!!.", "W10.e30.", "e30.e30.", "e30.W10.", ".....", String(repeating: ".", count: 3)] {
            guard case .malformed? = Self.refusal(v.verify(junk, now: Self.now)) else {
                Issue.record("\(junk) was not refused as malformed")
                continue
            }
        }
        // Every refusal has a reason for the client.
        #expect(TokenError.expired.reason == "Auth token is expired.")
    }

    @Test("custom tokens: valid, wrong secret, admin, the second secret (rotation), expiry, missing uid")
    func customTokens() throws {
        let v = try Self.verifier(secrets: [Self.secret, Self.secret2])
        let claims = #"{"v":0,"iat":\#(Self.t),"d":{"uid":"carol","group":"a"}}"#
        let verified = try v.verify(TokenFactory.hs256(claims, secret: Self.secret), now: Self.now).get()
        #expect(verified.kind == .customToken && !verified.administrator)
        #expect(verified.expires == Self.now + Claims.defaultCustomTokenLifetime)
        let auth = try JSONValue(parsing: try #require(verified.auth))
        #expect(auth["uid"] == .string("carol") && auth["group"] == .string("a") && auth["provider"] == .string("custom"))
        #expect(auth["token"]?["v"] == .int(0))
        // Signed with the second (new or old) secret: accepted as well.
        #expect(try v.verify(TokenFactory.hs256(claims, secret: Self.secret2), now: Self.now).get().auth == verified.auth)
        // A secret not configured.
        #expect(Self.refusal(v.verify(TokenFactory.hs256(claims, secret: Array("not-the-secret-at-all-0000".utf8)), now: Self.now)) == .badSignature)
        // admin: true makes an administrator, with or without d.
        let admin = try v.verify(TokenFactory.hs256(#"{"v":0,"iat":\#(Self.t),"admin":true}"#, secret: Self.secret), now: Self.now).get()
        #expect(admin.administrator && admin.auth == nil)
        #expect(try v.verify(TokenFactory.hs256(#"{"v":0,"iat":\#(Self.t),"admin":true,"debug":true,"d":{"uid":"ops"}}"#, secret: Self.secret), now: Self.now).get().administrator)
        // Expired (exp an hour ago), default lifetime over, not yet valid, wrong version, no uid.
        func verdict(_ claims: String) -> TokenError? { Self.refusal(v.verify(TokenFactory.hs256(claims, secret: Self.secret), now: Self.now)) }
        #expect(verdict(#"{"v":0,"iat":\#(Self.t - 7200),"exp":\#(Self.t - 3600),"d":{"uid":"carol"}}"#) == .expired)
        #expect(verdict(#"{"v":0,"iat":\#(Self.t - 90_000),"d":{"uid":"carol"}}"#) == .expired)
        #expect(verdict(#"{"v":0,"iat":\#(Self.t),"nbf":\#(Self.t + 3600),"d":{"uid":"carol"}}"#) == .notYetValid)
        #expect(verdict(#"{"v":1,"iat":\#(Self.t),"d":{"uid":"carol"}}"#) == .malformed(#"a custom token needs "v": 0"#))
        #expect(verdict(#"{"v":0,"iat":\#(Self.t),"d":{"name":"carol"}}"#) == .invalidSubject)
        #expect(verdict(#"{"v":0,"iat":\#(Self.t)}"#) == .invalidSubject)
        #expect(verdict(#"{"v":0,"iat":\#(Self.t),"admin":"yes","d":{"uid":"carol"}}"#) == .malformed("admin is not a boolean"))
    }

    @Test("a database secret itself is the administrator; a near miss is not")
    func databaseSecret() throws {
        let v = try Self.verifier(secrets: [Self.secret, Self.secret2])
        for s in [Self.secret, Self.secret2] {
            let verified = try v.verify(String(decoding: s, as: UTF8.self), now: Self.now).get()
            #expect(verified.kind == .databaseSecret && verified.administrator && verified.expires == nil)
        }
        #expect(Self.refusal(v.verify(String(decoding: Self.secret.dropLast(), as: UTF8.self), now: Self.now)) != nil)
        #expect(Self.refusal(v.verify("owner", now: Self.now)) != nil)
    }
}

@Suite struct TokenMutationTests {
    /// Seeded mutations of a valid ID token and a valid custom token (bytes replaced, inserted,
    /// deleted; truncations): every one is answered, none crashes, and none is accepted unless
    /// its signed part (header and claims) is the original's. The seed is fixed (see the test).
    @Test("mutated tokens are refused, never crash, never pass with changed claims")
    func mutations() throws {
        let key = try #require(TokenFactory.rsa)
        let verifier = try TokenVerifierTests.verifier()
        let seed: UInt64 = 0x746F_6B65_6E73
        var random = SeededRandom(seed: seed)
        let originals = [
            try TokenFactory.rs256(TokenFactory.idClaims(iat: TokenVerifierTests.t), key: key),
            TokenFactory.hs256(#"{"v":0,"iat":\#(TokenVerifierTests.t),"d":{"uid":"carol"}}"#, secret: TokenVerifierTests.secret),
        ]
        let alphabet = Array("AZaz09-_.=+/ {}\"".utf8)
        for original in originals {
            let signedPart = original.split(separator: ".").prefix(2).joined(separator: ".")
            for _ in 0..<1_000 {
                var bytes = Array(original.utf8)
                for _ in 0...random.below(3) {
                    let at = random.below(bytes.count)
                    switch random.below(4) {
                    case 0: bytes[at] = alphabet[random.below(alphabet.count)]
                    case 1: bytes.insert(alphabet[random.below(alphabet.count)], at: at)
                    case 2: bytes.remove(at: at)
                    default: bytes.removeLast(random.below(max(1, bytes.count / 4)))
                    }
                    if bytes.isEmpty { bytes = [UInt8(ascii: ".")] }
                }
                let mutated = String(decoding: bytes, as: UTF8.self)
                if case .success = verifier.verify(mutated, now: TokenVerifierTests.now) {
                    let part = mutated.split(separator: ".", omittingEmptySubsequences: false).prefix(2).joined(separator: ".")
                    #expect(part == signedPart, "seed \(seed): accepted with changed claims: \(mutated)")
                }
            }
        }
    }
}

@Suite struct KeyFilesTests {
    @Test("JWKS: RSA signing keys kept, other keys skipped, a key without kid or a repeated kid refused")
    func jwks() throws {
        let key = try #require(TokenFactory.rsa)
        let one = try KeyFiles.jwks(Array(try TokenFactory.jwks(key).utf8))
        #expect(one.map(\.keyID) == ["k1"])
        let mixed = #"{"keys":[{"kty":"EC","kid":"e","crv":"P-256","x":"AA","y":"AA"},{"kty":"RSA","kid":"enc","use":"enc","n":"AQAB","e":"AQAB"},{"kty":"RSA","kid":"r","n":"AQAB","e":"AQAB"}]}"#
        #expect(try KeyFiles.jwks(Array(mixed.utf8)).map(\.keyID) == ["r"])
        #expect(throws: KeyFileError.self) { try KeyFiles.jwks(Array(#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"}]}"#.utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.jwks(Array(#"{"keys":[{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"},{"kty":"RSA","kid":"a","n":"AQAB","e":"AQAB"}]}"#.utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.jwks(Array(#"{"keys":[]}"#.utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.jwks(Array("not json".utf8)) }
        // A short RSA key is refused when the verifier is made.
        let small = [KeyFiles.RSAComponents(keyID: "s", modulus: [0xC3] + [UInt8](repeating: 0x55, count: 127), exponent: [1, 0, 1])]
        #expect(throws: KeyFileError.self) { try TokenVerifier(settings: .init(projectID: "demo"), jwks: small) }
        // Keys without an issuer and audience cannot verify anything.
        #expect(throws: KeyFileError.self) { try TokenVerifier(settings: .init(), jwks: one) }
    }

    @Test("Google's x509 format: a public key PEM and a certificate PEM by kid verify tokens")
    func x509() throws {
        let key = try #require(TokenFactory.rsa)
        let spki = Array(key.publicKey.derRepresentation)
        // A certificate's shape around the key (the fields before it are skipped unread).
        let tlv = Self.tlv
        let tbs = tlv(0x30, tlv(0xA0, tlv(0x02, [2])) + tlv(0x02, [1]) + tlv(0x30, []) + tlv(0x30, []) + tlv(0x30, []) + tlv(0x30, []) + spki)
        let certificate = tlv(0x30, tbs + tlv(0x30, []) + tlv(0x03, [0]))
        #expect(try KeyFiles.subjectPublicKeyInfo(certificate: certificate) == spki)
        func pem(_ label: String, _ der: [UInt8]) -> String {
            var b64 = Base64.encodeURL(der).replacing("-", with: "+").replacing("_", with: "/")
            while b64.utf8.count % 4 != 0 { b64 += "=" }
            var lines: [String] = []
            var rest = Substring(b64)
            while !rest.isEmpty {
                lines.append(String(rest.prefix(64)))
                rest = rest.dropFirst(64)
            }
            return "-----BEGIN \(label)-----\\n" + lines.joined(separator: "\\n") + "\\n-----END \(label)-----\\n"
        }
        let file = #"{"cert":"\#(pem("CERTIFICATE", certificate))","pub":"\#(pem("PUBLIC KEY", spki))"}"#
        let keys = try KeyFiles.x509(Array(file.utf8))
        #expect(keys.map(\.keyID) == ["cert", "pub"])
        let verifier = try TokenVerifier(settings: .init(projectID: "demo"), publicKeys: keys)
        for kid in ["cert", "pub"] {
            let token = try TokenFactory.rs256(TokenFactory.idClaims(iat: TokenVerifierTests.t), kid: kid, key: key)
            #expect(throws: Never.self) { try verifier.verify(token, now: TokenVerifierTests.now).get() }
        }
        #expect(throws: KeyFileError.self) { try KeyFiles.x509(Array(#"{"a":"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----"}"#.utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.x509(Array(#"{"a":"no pem here"}"#.utf8)) }
    }

    /// A DER element: tag, definite length, contents.
    static func tlv(_ tag: UInt8, _ body: [UInt8]) -> [UInt8] {
        let n = body.count
        let length: [UInt8] = n < 128 ? [UInt8(n)] : n < 256 ? [0x81, UInt8(n)] : [0x82, UInt8(n >> 8), UInt8(n & 0xFF)]
        return [tag] + length + body
    }

    @Test("an RSA public key's DER (SubjectPublicKeyInfo, RSASSA-PSS too, or PKCS #1) gives its modulus and exponent, and keys are made from those; other shapes are refused with the reason")
    func rsaComponents() throws {
        let key = try #require(TokenFactory.rsa).publicKey
        let primitives = try key.getKeyPrimitives()
        let n = Array(primitives.modulus.drop { $0 == 0 })
        let e = Array(primitives.publicExponent.drop { $0 == 0 })
        let pkcs1 = Array(key.pkcs1DERRepresentation)
        #expect(pkcs1 == Self.tlv(0x30, Self.tlv(0x02, [0] + n) + Self.tlv(0x02, e)))
        func spki(oid last: UInt8 = 0x01, parameters: [UInt8] = [0x05, 0x00], unusedBits: UInt8 = 0, key: [UInt8] = pkcs1) -> [UInt8] {
            let oid: [UInt8] = [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, last]
            return Self.tlv(0x30, Self.tlv(0x30, oid + parameters) + Self.tlv(0x03, [unusedBits] + key))
        }
        #expect(spki() == Array(key.derRepresentation))
        for der in [pkcs1, spki(), spki(parameters: []), spki(oid: 0x0A, parameters: Self.tlv(0x30, []))] {
            let numbers = try KeyFiles.rsaComponents(der: der)
            #expect(numbers.modulus == n && numbers.exponent == e)
        }
        // Either form verifies tokens.
        let verifier = try TokenVerifier(settings: .init(projectID: "demo"), publicKeys: [.init(keyID: "spki", der: spki()), .init(keyID: "pkcs1", der: pkcs1)])
        for kid in ["spki", "pkcs1"] {
            let token = try TokenFactory.rs256(TokenFactory.idClaims(iat: TokenVerifierTests.t), kid: kid, key: try #require(TokenFactory.rsa))
            #expect(throws: Never.self) { try verifier.verify(token, now: TokenVerifierTests.now).get() }
        }
        let ec = Array(P256.Signing.PrivateKey().publicKey.derRepresentation)
        for (der, reason) in [
            ([0, 0, 0], "expected one DER SEQUENCE"), (pkcs1 + [0], "expected one DER SEQUENCE"), ([0x30, 0x00], "two INTEGERs"),
            (ec, "another algorithm than RSA"), (spki(oid: 0x05), "another algorithm than RSA"), (spki(parameters: [0x02, 0x01, 0x00]), "not NULL"),
            (spki(unusedBits: 1), "whole-byte"), (spki(key: pkcs1 + [0]), "not an RSAPublicKey"),
            (Self.tlv(0x30, Self.tlv(0x02, n) + Self.tlv(0x02, e)), "modulus is not a positive INTEGER"),
            (Self.tlv(0x30, Self.tlv(0x02, [0]) + Self.tlv(0x02, e)), "modulus is zero"),
            (Self.tlv(0x30, Self.tlv(0x02, [0] + n) + Self.tlv(0x02, [])), "exponent is not a positive INTEGER"),
            (Self.tlv(0x30, Self.tlv(0x02, [0] + n) + Self.tlv(0x02, [0] + e)), "exponent is not in the fewest bytes"),
        ] {
            #expect(throws: KeyFileError.self, "\(reason)") { try KeyFiles.rsaComponents(der: der) }
            do {
                _ = try KeyFiles.rsaComponents(der: der)
            } catch {
                #expect(error.message.contains(reason), "\(error.message)")
            }
            // The same, as a verifier's key: refused with the reason.
            do {
                _ = try TokenVerifier(settings: .init(projectID: "demo"), publicKeys: [.init(keyID: "bad", der: der)])
                Issue.record("a verifier took \(reason)")
            } catch {
                #expect(error.message.contains("kid bad: not an RSA public key") && error.message.contains(reason), "\(error.message)")
            }
        }
        // Well-formed numbers that make no key (an even exponent): refused by the key's maker.
        #expect(throws: KeyFileError.self) {
            try TokenVerifier(settings: .init(projectID: "demo"), publicKeys: [.init(keyID: "even", der: Self.tlv(0x30, Self.tlv(0x02, [0] + n) + Self.tlv(0x02, [2])))])
        }
    }

    @Test("secrets files: one a line, comments and blank lines skipped, short or dotted secrets refused")
    func secrets() throws {
        let text = "# database secrets\n\n  0123456789abcdefghij  \r\nrotated-0123456789abcdef\n"
        #expect(try KeyFiles.secrets(Array(text.utf8)) == [Array("0123456789abcdefghij".utf8), Array("rotated-0123456789abcdef".utf8)])
        #expect(throws: KeyFileError.self) { try KeyFiles.secrets(Array("short\n".utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.secrets(Array("has.a.dot.0123456789\n".utf8)) }
        #expect(throws: KeyFileError.self) { try KeyFiles.secrets(Array("# nothing\n".utf8)) }
    }
}

@Suite struct Base64Tests {
    @Test("base64url round trips; the decoder takes both alphabets and padding")
    func roundTrip() {
        for n in 0..<40 {
            let bytes = (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 250) }
            #expect(Base64.decode(Base64.encodeURL(bytes).utf8) == bytes)
        }
        #expect(Base64.decode("+/8=".utf8) == [0xFB, 0xFF])
        #expect(Base64.decode("-_8".utf8) == [0xFB, 0xFF])
        #expect(Base64.decode("a b".utf8) == nil)
    }
}
