import Crypto
import _CryptoExtras

/// The RSA public keys ID tokens are checked with, by `kid`, made from the operator's key files
/// (at least `minimumKeyBits` each), and the one check they serve: an RS256 signature. Shared by
/// `TokenVerifier` (ID tokens the database honours) and `OIDCProvider` (a provider's ID tokens
/// the account service exchanges for its own).
struct RSAKeySet: Sendable {
    /// Keys by `kid`.
    private var keys: [String: _RSA.Signing.PublicKey] = [:]
    /// A key that checks tokens whatever `kid` they name (or none): a provider configured with
    /// a bare PEM key, which carries no `kid`.
    private var anyKid: _RSA.Signing.PublicKey?

    /// RSA keys shorter than this are refused when loading.
    static let minimumKeyBits = 2048

    var isEmpty: Bool { keys.isEmpty && anyKid == nil }
    /// The key ids, sorted (a key for any `kid` is listed as `*`).
    var keyIDs: [String] { keys.keys.sorted() + (anyKid == nil ? [] : ["*"]) }

    init(jwks: [KeyFiles.RSAComponents] = [], publicKeys: [KeyFiles.PublicKeyDER] = [], anyKid der: [UInt8]? = nil) throws(KeyFileError) {
        for k in jwks { try add(k.keyID) { try _RSA.Signing.PublicKey(n: k.modulus, e: k.exponent) } }
        for k in publicKeys { try add(k.keyID) { try Self.key(der: k.der) } }
        if let der { anyKid = try Self.make("the PEM key") { try Self.key(der: der) } }
    }

    /// The key of a DER public key (SubjectPublicKeyInfo or PKCS #1), made from its modulus and
    /// exponent. Not `_RSA.Signing.PublicKey(derRepresentation:)`: when neither form parses,
    /// swift-crypto (3.12.3, still so in 4.5.0) frees its `EVP_PKEY` in the initializer and
    /// again in the deinit that runs as the initializer throws. That double free aborts the
    /// process in BoringSSL's reference count (SIGABRT, no message) or corrupts the heap,
    /// depending on what the allocator put in the freed memory; an operator's unusable key file
    /// must be refused with its reason instead. `init(n:e:)` frees its key once on every path.
    static func key(der: [UInt8]) throws -> _RSA.Signing.PublicKey {
        let numbers = try KeyFiles.rsaComponents(der: der)
        return try _RSA.Signing.PublicKey(n: numbers.modulus, e: numbers.exponent)
    }

    private mutating func add(_ kid: String, _ make: () throws -> _RSA.Signing.PublicKey) throws(KeyFileError) {
        guard keys[kid] == nil else { throw KeyFileError("kid \(kid) is configured twice") }
        keys[kid] = try Self.make("kid \(kid)", make)
    }

    private static func make(_ name: String, _ make: () throws -> _RSA.Signing.PublicKey) throws(KeyFileError) -> _RSA.Signing.PublicKey {
        let key: _RSA.Signing.PublicKey
        do {
            key = try make()
        } catch {
            throw KeyFileError("\(name): not an RSA public key (\(error))")
        }
        guard key.keySizeInBits >= minimumKeyBits else {
            throw KeyFileError("\(name): the key has \(key.keySizeInBits) bits; at least \(minimumKeyBits) are needed")
        }
        return key
    }

    /// Checks `jwt`'s RS256 signature with the key its `kid` names (the caller has already
    /// required `alg` to be RS256: the algorithm is never taken from the token).
    func checkSignature(_ jwt: JWT) throws(TokenError) {
        guard let key = jwt.keyID.flatMap({ keys[$0] }) ?? anyKid else { throw .unknownKey(jwt.keyID) }
        let signature = _RSA.Signing.RSASignature(rawRepresentation: jwt.signature)
        guard key.isValidSignature(signature, for: SHA256.hash(data: jwt.signingInput), padding: .insecurePKCS1v1_5) else {
            throw .badSignature
        }
    }
}

extension KeyFiles {
    /// Makes (and drops) the RSA key of a DER public key as `RSAKeySet` would: an error with the
    /// reason when the key is malformed or its numbers make no key. For keys other libraries
    /// would hand to swift-crypto's DER initializer (a certificate's, in swift-certificates),
    /// checked first so that a key BoringSSL refuses never gets there (`RSAKeySet.key(der:)`).
    public static func checkRSAPublicKey(der: [UInt8]) throws(KeyFileError) {
        do {
            _ = try RSAKeySet.key(der: der)
        } catch let error as KeyFileError {
            throw error
        } catch {
            throw KeyFileError("the RSA key's numbers make no key (\(error))")
        }
    }
}
