import BanyanBasics
import BanyanTree

/// A key or secrets file the operator configured that cannot be used (the server refuses to
/// start, naming the file).
public struct KeyFileError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// The operator's key files, parsed but not yet made into keys (`TokenVerifier` does that).
/// Pure: text in, key material out.
public enum KeyFiles {
    /// One RSA public key of a JWKS: its `kid` and its big-endian modulus and exponent.
    public struct RSAComponents: Sendable, Equatable {
        public var keyID: String
        public var modulus: [UInt8]
        public var exponent: [UInt8]

        public init(keyID: String, modulus: [UInt8], exponent: [UInt8]) {
            self.keyID = keyID
            self.modulus = modulus
            self.exponent = exponent
        }
    }

    /// One public key of a certificates file: its `kid` and its DER (SubjectPublicKeyInfo, or a
    /// PKCS #1 RSAPublicKey).
    public struct PublicKeyDER: Sendable, Equatable {
        public var keyID: String
        public var der: [UInt8]

        public init(keyID: String, der: [UInt8]) {
            self.keyID = keyID
            self.der = der
        }
    }

    /// The RSA signing keys of a JWKS (RFC 7517): `{"keys": [{"kty": "RSA", "kid", "n", "e"}, …]}`.
    /// Keys of another type, or marked for another use (`use` other than `sig`) or algorithm
    /// (`alg` other than `RS256`), are skipped; a usable key without `kid`, a repeated `kid`, or
    /// a file with no usable key is an error.
    public static func jwks(_ text: [UInt8]) throws(KeyFileError) -> [RSAComponents] {
        guard let root = try? JSONValue(parsing: text, maxDepth: 8), case .array(let keys)? = root["keys"] else {
            throw KeyFileError("not a JWKS: expected a JSON object with a \"keys\" array")
        }
        var out: [RSAComponents] = []
        for (i, key) in keys.enumerated() {
            guard case .object = key else { throw KeyFileError("keys[\(i)] is not an object") }
            guard key["kty"] == .string("RSA") else { continue }
            if let use = key["use"], use != .string("sig") { continue }
            if let alg = key["alg"], alg != .string("RS256") { continue }
            guard case .string(let kid)? = key["kid"], !kid.isEmpty else { throw KeyFileError("keys[\(i)] has no kid") }
            guard case .string(let n)? = key["n"], let modulus = Base64.decode(n.utf8), !modulus.isEmpty,
                case .string(let e)? = key["e"], let exponent = Base64.decode(e.utf8), !exponent.isEmpty
            else { throw KeyFileError("keys[\(i)] (kid \(kid)) needs n and e in base64url") }
            guard !out.contains(where: { $0.keyID == kid }) else { throw KeyFileError("kid \(kid) appears twice") }
            out.append(RSAComponents(keyID: kid, modulus: modulus, exponent: exponent))
        }
        guard !out.isEmpty else { throw KeyFileError("the JWKS has no RSA signing key") }
        return out
    }

    /// A certificates file in Google's format: a JSON object from `kid` to a PEM certificate
    /// (`CERTIFICATE`) or public key (`PUBLIC KEY`, `RSA PUBLIC KEY`).
    public static func x509(_ text: [UInt8]) throws(KeyFileError) -> [PublicKeyDER] {
        guard case .object(let members)? = try? JSONValue(parsing: text, maxDepth: 4), !members.isEmpty else {
            throw KeyFileError("expected a JSON object mapping each kid to a PEM certificate or public key")
        }
        var out: [PublicKeyDER] = []
        for (kid, value) in members {
            guard case .string(let pem) = value else { throw KeyFileError("kid \(kid): the value is not a PEM string") }
            let der: [UInt8]
            do throws(KeyFileError) {
                der = try publicKey(pem: pem)
            } catch {
                throw KeyFileError("kid \(kid): \(error.message)")
            }
            out.append(PublicKeyDER(keyID: kid, der: der))
        }
        return out
    }

    /// The keys of an OpenID Connect provider's key file, whichever of its three forms it has.
    public enum ProviderKeys: Sendable, Equatable {
        /// A JWKS (`{"keys": […]}`, what a provider's `jwks_uri` serves).
        case jwks([RSAComponents])
        /// Google's certificates format (a JSON object from `kid` to a PEM).
        case x509([PublicKeyDER])
        /// One PEM public key or certificate: it carries no `kid`, so it checks tokens whatever
        /// `kid` they name.
        case pem([UInt8])
    }

    /// A provider's key file: a JWKS when it is a JSON object with `keys`, Google's format when
    /// it is another JSON object, else a PEM block (`PUBLIC KEY`, `RSA PUBLIC KEY` or
    /// `CERTIFICATE`).
    public static func providerKeys(_ text: [UInt8]) throws(KeyFileError) -> ProviderKeys {
        let start = text.first { $0 != 0x20 && $0 != 0x09 && $0 != 0x0A && $0 != 0x0D }
        if start == UInt8(ascii: "{") {
            if case .object(let members)? = try? JSONValue(parsing: text, maxDepth: 8), members.contains(where: { $0.0 == "keys" }) {
                return .jwks(try jwks(text))
            }
            return .x509(try x509(text))
        }
        return .pem(try publicKey(pem: String(decoding: text, as: UTF8.self)))
    }

    /// The public key DER of the first PEM block of `text`: a certificate's
    /// SubjectPublicKeyInfo, or a `PUBLIC KEY` / `RSA PUBLIC KEY` block as it is.
    public static func publicKey(pem text: String) throws(KeyFileError) -> [UInt8] {
        let (label, body) = try pem(text)
        switch label {
        case "CERTIFICATE": return try subjectPublicKeyInfo(certificate: body)
        case "PUBLIC KEY", "RSA PUBLIC KEY": return body
        default: throw KeyFileError("a PEM \(label) is neither a certificate nor a public key")
        }
    }

    /// The label and DER bytes of the first PEM block of `text`.
    public static func pem(_ text: String) throws(KeyFileError) -> (label: String, der: [UInt8]) {
        let lines = Substring(text).splitting(atByte: UInt8(ascii: "\n"), omittingEmpty: true).map(trimmed)
        guard let begin = lines.firstIndex(where: { $0.hasPrefix("-----BEGIN ") && $0.hasSuffix("-----") }) else {
            throw KeyFileError("no PEM block (-----BEGIN …-----)")
        }
        let label = String(lines[begin].dropFirst(11).dropLast(5))
        guard let end = lines[(begin + 1)...].firstIndex(of: "-----END \(label)-----") else { throw KeyFileError("the PEM \(label) block has no END line") }
        let body = lines[(begin + 1)..<end].joined()
        guard let der = Base64.decode(body.utf8), !der.isEmpty else { throw KeyFileError("the PEM \(label) block is not base64") }
        return (label, der)
    }

    /// The SubjectPublicKeyInfo (its whole DER element) of an X.509 certificate (RFC 5280:
    /// Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL,
    /// serialNumber, signature, issuer, validity, subject, subjectPublicKeyInfo, … }, … }).
    /// The certificate's own signature and dates are not checked: it is only a container for
    /// the key, as Google publishes them.
    public static func subjectPublicKeyInfo(certificate der: [UInt8]) throws(KeyFileError) -> [UInt8] {
        var reader = DERReader(der[...])
        guard var certificate = reader.next(tag: 0x30)?.contents, var tbs = certificate.next(tag: 0x30)?.contents else {
            throw KeyFileError("not a DER certificate")
        }
        if tbs.peekTag == 0xA0 { _ = tbs.next(tag: 0xA0) }
        guard tbs.next(tag: 0x02) != nil else { throw KeyFileError("the certificate has no serial number") }
        for field in ["signature algorithm", "issuer", "validity", "subject"] {
            guard tbs.next(tag: 0x30) != nil else { throw KeyFileError("the certificate has no \(field)") }
        }
        guard let spki = tbs.next(tag: 0x30) else { throw KeyFileError("the certificate has no public key") }
        return Array(spki.element)
    }

    /// The modulus and exponent (big-endian, without leading zero bytes) of an RSA public key's
    /// DER: a SubjectPublicKeyInfo of `rsaEncryption` (RFC 3279 2.3.1) or `id-RSASSA-PSS`, or a
    /// PKCS #1 RSAPublicKey (RFC 8017 A.1.1), the forms a `PUBLIC KEY`, `RSA PUBLIC KEY` or
    /// certificate gives. Only the structure is read here; whether the numbers make a usable key
    /// is for the key's maker to say.
    public static func rsaComponents(der: [UInt8]) throws(KeyFileError) -> (modulus: [UInt8], exponent: [UInt8]) {
        var outer = DERReader(der[...])
        guard var sequence = outer.next(tag: 0x30)?.contents, outer.isAtEnd else {
            throw KeyFileError("neither a SubjectPublicKeyInfo nor a PKCS #1 RSAPublicKey (expected one DER SEQUENCE)")
        }
        guard sequence.peekTag == 0x30 else { return try rsaPublicKey(sequence) }
        // SubjectPublicKeyInfo ::= SEQUENCE { algorithm AlgorithmIdentifier, subjectPublicKey BIT STRING }
        guard var algorithm = sequence.next(tag: 0x30)?.contents, let oid = algorithm.next(tag: 0x06)?.element else {
            throw KeyFileError("the SubjectPublicKeyInfo has no algorithm")
        }
        if oid.elementsEqual(rsaEncryptionOID) {
            // The parameters are NULL (absent is taken too).
            if !algorithm.isAtEnd {
                guard let null = algorithm.next(tag: 0x05), null.contents.isAtEnd, algorithm.isAtEnd else {
                    throw KeyFileError("the RSA algorithm's parameters are not NULL")
                }
            }
        } else if !oid.elementsEqual(rsaPSSOID) {
            // An RSASSA-PSS key's parameters are not read: its modulus and exponent are what a
            // key is made of (swift-crypto's DER initializer took such keys too, parameters dropped).
            throw KeyFileError("the SubjectPublicKeyInfo holds a key of another algorithm than RSA")
        }
        guard let bits = sequence.next(tag: 0x03)?.contents.rest, sequence.isAtEnd, bits.first == 0 else {
            throw KeyFileError("the SubjectPublicKeyInfo has no whole-byte key BIT STRING")
        }
        var key = DERReader(bits.dropFirst())
        guard let inner = key.next(tag: 0x30)?.contents, key.isAtEnd else { throw KeyFileError("the SubjectPublicKeyInfo's key is not an RSAPublicKey") }
        return try rsaPublicKey(inner)
    }

    /// Whether `der` is a SubjectPublicKeyInfo of an RSA key (`rsaEncryption` or `id-RSASSA-PSS`).
    public static func holdsRSAKey(subjectPublicKeyInfo der: [UInt8]) -> Bool {
        var outer = DERReader(der[...])
        guard var spki = outer.next(tag: 0x30)?.contents, var algorithm = spki.next(tag: 0x30)?.contents, let oid = algorithm.next(tag: 0x06)?.element
        else { return false }
        return oid.elementsEqual(rsaEncryptionOID) || oid.elementsEqual(rsaPSSOID)
    }

    /// The DER of the OID 1.2.840.113549.1.1.1 (rsaEncryption), tag and length included.
    static let rsaEncryptionOID: [UInt8] = [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01]
    /// The DER of the OID 1.2.840.113549.1.1.10 (id-RSASSA-PSS).
    static let rsaPSSOID: [UInt8] = [0x06, 0x09, 0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x0A]

    /// RSAPublicKey ::= SEQUENCE { modulus INTEGER, publicExponent INTEGER }, from its contents.
    private static func rsaPublicKey(_ contents: DERReader) throws(KeyFileError) -> (modulus: [UInt8], exponent: [UInt8]) {
        var fields = contents
        guard let n = fields.next(tag: 0x02)?.contents.rest, let e = fields.next(tag: 0x02)?.contents.rest, fields.isAtEnd else {
            throw KeyFileError("an RSAPublicKey is a SEQUENCE of two INTEGERs (modulus, exponent)")
        }
        // As BoringSSL reads them: non-negative, in the fewest bytes (a leading zero byte only
        // before a byte with its top bit set).
        func positive(_ integer: ArraySlice<UInt8>, _ name: String) throws(KeyFileError) -> [UInt8] {
            guard let first = integer.first, first & 0x80 == 0 else { throw KeyFileError("the RSA \(name) is not a positive INTEGER") }
            let digits = integer.dropFirst(first == 0 ? 1 : 0)
            guard let lead = digits.first else { throw KeyFileError("the RSA \(name) is zero") }
            guard first != 0 || lead & 0x80 != 0 else { throw KeyFileError("the RSA \(name) is not in the fewest bytes (DER)") }
            return Array(digits)
        }
        return (try positive(n, "modulus"), try positive(e, "exponent"))
    }

    /// A database secrets file: one secret a line (blank lines and lines starting with `#`
    /// ignored, spaces around a secret trimmed). Each secret is 16 to 256 printable ASCII
    /// characters without spaces or `.` (so it cannot be mistaken for a JWT); at least one.
    public static func secrets(_ text: [UInt8]) throws(KeyFileError) -> [[UInt8]] {
        var out: [[UInt8]] = []
        let lines = Substring(String(decoding: text, as: UTF8.self)).splitting(atByte: UInt8(ascii: "\n"), omittingEmpty: true)
        for (number, line) in lines.enumerated() {
            let secret = trimmed(line)
            if secret.isEmpty || secret.hasPrefix("#") { continue }
            let bytes = Array(secret.utf8)
            guard (16...256).contains(bytes.count), bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: ".") }) else {
                throw KeyFileError("line \(number + 1): a secret is 16 to 256 printable ASCII characters without spaces or '.'")
            }
            out.append(bytes)
        }
        guard !out.isEmpty else { throw KeyFileError("no secret in the file") }
        return out
    }

    static func trimmed(_ line: Substring) -> Substring {
        let blank: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" }
        guard let first = line.firstIndex(where: { !blank($0) }), let last = line.lastIndex(where: { !blank($0) }) else { return "" }
        return line[first...last]
    }
}

/// Reads DER elements one after another (tag, definite length, contents), for the few
/// certificate fields `KeyFiles` needs; every read is bounds-checked.
struct DERReader {
    var bytes: ArraySlice<UInt8>

    init(_ bytes: ArraySlice<UInt8>) { self.bytes = bytes }

    var peekTag: UInt8? { bytes.first }
    /// Whether every byte has been read.
    var isAtEnd: Bool { bytes.isEmpty }
    /// The bytes not yet read.
    var rest: ArraySlice<UInt8> { bytes }

    /// The next element when its tag is `tag`: the whole element and a reader of its contents.
    mutating func next(tag: UInt8) -> (element: ArraySlice<UInt8>, contents: DERReader)? {
        let start = bytes.startIndex
        guard bytes.count >= 2, bytes[start] == tag else { return nil }
        var i = start + 1
        var length = Int(bytes[i])
        i += 1
        if length & 0x80 != 0 {
            let count = length & 0x7F
            guard (1...4).contains(count), bytes.endIndex - i >= count else { return nil }
            length = 0
            for _ in 0..<count {
                length = length << 8 | Int(bytes[i])
                i += 1
            }
        }
        guard bytes.endIndex - i >= length else { return nil }
        let element = bytes[start..<(i + length)]
        let contents = DERReader(bytes[i..<(i + length)])
        bytes = bytes[(i + length)...]
        return (element, contents)
    }
}
