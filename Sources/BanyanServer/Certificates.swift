import BanyanAuth
import Crypto
import Foundation
import SwiftASN1
public import X509

/// Files of a certificate authority: its certificate (or a bundle of CA certificates, during a
/// CA rotation) and, for issuing, its private key.
public struct CAFiles: Sendable, Equatable {
    public var certificatePath: String
    public var privateKeyPath: String?
    public init(certificatePath: String, privateKeyPath: String?) {
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
    }
}

/// A node's certificate and private key (PEM), used both to accept and to dial peers.
public struct NodeCertificateFiles: Sendable, Equatable {
    public var certificatePath: String
    public var privateKeyPath: String
    public init(certificatePath: String, privateKeyPath: String) {
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
    }
}

/// A certificate or key file that cannot be used, with the file and why.
public struct CertificateError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: Sendable, Equatable {
        /// The file does not exist.
        case missing
        /// The file exists but cannot be read (permissions, a directory, not text).
        case unreadable
        /// The file is not the PEM it should be (bad base64, DER, wrong block type, no block).
        case malformed
        /// Creating the file would overwrite an existing one, or only half of a certificate/key
        /// pair exists.
        case exists
        /// A key does not belong to its certificate.
        case mismatch
        /// A bad argument (node name, host, validity) or a failed write; a certificate that does
        /// not name this node or the host peers dial it by.
        case invalid
        /// A certificate that does not chain to a CA of the trust bundle.
        case untrusted
        /// A certificate past its notAfter date.
        case expired
        /// A certificate before its notBefore date (often a clock that is wrong).
        case notYetValid
        /// A certificate in the trust bundle that is not a CA certificate.
        case notCA

        /// The code's name in operator answers (`"mismatch"`, `"not_ca"`, ...).
        public var name: String {
            switch self {
            case .missing: "missing"
            case .unreadable: "unreadable"
            case .malformed: "malformed"
            case .exists: "exists"
            case .mismatch: "mismatch"
            case .invalid: "invalid"
            case .untrusted: "untrusted"
            case .expired: "expired"
            case .notYetValid: "not_yet_valid"
            case .notCA: "not_ca"
            }
        }
    }
    public var path: String
    public var code: Code
    public var reason: String
    public init(path: String, code: Code, reason: String) {
        self.path = path
        self.code = code
        self.reason = reason
    }
    public var description: String { "\(path): \(reason)" }
}

/// The cluster CA and node certificates (docs/operations.md, "Certificates"): P-256 ECDSA keys
/// (PKCS#8 PEM, mode 0600), X.509 v3 certificates from swift-certificates. Node certificates
/// name every host a peer may dial (DNS names and IP addresses as subject alternative names) and
/// allow both server and client authentication, because a node presents the same certificate
/// when it accepts and when it dials. Existing files are never overwritten.
public enum DevCertificates {
    public static let defaultCAValidityDays = 3650
    public static let defaultNodeValidityDays = 825

    /// `ca.pem` and `ca.key` in `directory`.
    public static func caFiles(in directory: String) -> CAFiles {
        CAFiles(certificatePath: directory + "/ca.pem", privateKeyPath: directory + "/ca.key")
    }

    /// `<nodeName>.pem` and `<nodeName>.key` in `directory`.
    public static func nodeFiles(in directory: String, nodeName: String) -> NodeCertificateFiles {
        NodeCertificateFiles(certificatePath: "\(directory)/\(nodeName).pem", privateKeyPath: "\(directory)/\(nodeName).key")
    }

    /// Creates a self-signed CA (`ca.pem`, `ca.key`) in `directory`, which is created (0700) if absent.
    public static func createCA(commonName: String, directory: String, validityDays: Int = defaultCAValidityDays) throws -> CAFiles {
        let files = caFiles(in: directory)
        try checkValidity(validityDays, files.certificatePath)
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let name = try DistinguishedName {
            CommonName(commonName)
            OrganizationName("Banyan")
        }
        let certificate = try sign(
            publicKey: publicKey, subject: name, issuer: name, validityDays: validityDays, issuerKey: Certificate.PrivateKey(key),
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: publicKey)
            })
        try writePair(key: key, certificate: certificate, keyPath: files.privateKeyPath ?? "", certificatePath: files.certificatePath, directory: directory)
        return files
    }

    /// Issues `<nodeName>.pem` and `<nodeName>.key` in `directory`, signed by the CA (which
    /// needs its private key), for every host in `hosts` (IP literals become iPAddress names,
    /// anything else a dNSName).
    public static func issueNodeCertificate(
        ca: CAFiles, nodeName: String, hosts: [String], directory: String, validityDays: Int = defaultNodeValidityDays
    ) throws -> NodeCertificateFiles {
        let files = nodeFiles(in: directory, nodeName: nodeName)
        guard !nodeName.isEmpty, !nodeName.contains("/"), !nodeName.hasPrefix(".") else {
            throw CertificateError(path: files.certificatePath, code: .invalid, reason: "'\(nodeName)' is not a usable node name")
        }
        try checkValidity(validityDays, files.certificatePath)
        let names = try subjectAlternativeNames(hosts, files.certificatePath)
        guard let caKeyPath = ca.privateKeyPath else {
            throw CertificateError(path: ca.certificatePath, code: .missing, reason: "the CA's private key is needed to issue certificates")
        }
        let caCertificate = try loadCertificate(ca.certificatePath)
        let caKey = try loadPrivateKey(caKeyPath)
        guard caKey.publicKey == caCertificate.publicKey else {
            throw CertificateError(path: caKeyPath, code: .mismatch, reason: "this key does not belong to \(ca.certificatePath)")
        }
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let subject = try DistinguishedName {
            CommonName(nodeName)
            OrganizationName("Banyan")
        }
        let issuerKeyID = try caCertificate.extensions.subjectKeyIdentifier?.keyIdentifier
        let certificate = try sign(
            publicKey: publicKey, subject: subject, issuer: caCertificate.subject, validityDays: validityDays, issuerKey: caKey,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                // ECDSA keys sign; they never encipher (RFC 5480 §3).
                Critical(KeyUsage(digitalSignature: true))
                try ExtendedKeyUsage([.serverAuth, .clientAuth])
                SubjectAlternativeNames(names)
                SubjectKeyIdentifier(hash: publicKey)
                if let issuerKeyID { AuthorityKeyIdentifier(keyIdentifier: issuerKeyID) }
            })
        try writePair(key: key, certificate: certificate, keyPath: files.privateKeyPath, certificatePath: files.certificatePath, directory: directory)
        return files
    }

    /// The development set-up of `banyan serve`: a CA in `directory` (created on first use) and
    /// a certificate for `nodeName` (created if absent; an existing one is reused as it is, even
    /// if `hosts` changed: delete it to reissue). Idempotent; never overwrites. Half a pair (a
    /// certificate without its key or the reverse) is an error rather than a silent reissue.
    public static func ensureDevelopmentCertificates(directory: String, nodeName: String, hosts: [String]) throws -> (ca: CAFiles, node: NodeCertificateFiles) {
        try makeDirectory(directory)
        // Several local nodes may start at once and share one CA: serialise with a lock file.
        let lock = directory + "/.lock"
        let fd = open(lock, O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw CertificateError(path: lock, code: .unreadable, reason: "cannot open the lock file: \(errnoText())") }
        defer { close(fd) }
        flock(fd, LOCK_EX)
        defer { flock(fd, LOCK_UN) }
        let ca = caFiles(in: directory)
        if try !pairExists(ca.certificatePath, ca.privateKeyPath ?? "") {
            _ = try createCA(commonName: "Banyan development CA", directory: directory)
        }
        let node = nodeFiles(in: directory, nodeName: nodeName)
        if try !pairExists(node.certificatePath, node.privateKeyPath) {
            _ = try issueNodeCertificate(ca: ca, nodeName: nodeName, hosts: hosts, directory: directory)
        }
        return (ca, node)
    }

    // MARK: - Loading

    /// The first certificate in a PEM file.
    public static func loadCertificate(_ path: String) throws -> Certificate {
        try loadCertificates(path)[0]
    }

    /// Every certificate in a PEM file (a CA bundle); at least one.
    public static func loadCertificates(_ path: String) throws -> [Certificate] {
        let text = try read(path)
        let certificates: [Certificate]
        do {
            certificates = try PEMDocument.parseMultiple(pemString: text).map { document in
                try checkRSAKey(certificate: document.derBytes)
                return try Certificate(pemDocument: document)
            }
        } catch let error as KeyFileError {
            throw CertificateError(path: path, code: .malformed, reason: error.message)
        } catch {
            throw CertificateError(path: path, code: .malformed, reason: "not a PEM certificate: \(error)")
        }
        guard !certificates.isEmpty else { throw CertificateError(path: path, code: .malformed, reason: "no certificate in the file") }
        return certificates
    }

    /// Refuses a certificate whose RSA key is malformed or makes no key, before
    /// swift-certificates reads it: it would hand the key to swift-crypto's DER initializer,
    /// which frees its key twice when BoringSSL refuses it (see `RSAKeySet.key(der:)`), and a
    /// certificate file, at start or on a TLS reload, must be refused with its reason, never
    /// abort the node. Other keys, and what is not a certificate, are left to swift-certificates.
    static func checkRSAKey(certificate der: [UInt8]) throws(KeyFileError) {
        guard let spki = try? KeyFiles.subjectPublicKeyInfo(certificate: der), KeyFiles.holdsRSAKey(subjectPublicKeyInfo: spki) else { return }
        do {
            try KeyFiles.checkRSAPublicKey(der: spki)
        } catch {
            throw KeyFileError("a certificate's RSA key is unusable: \(error.message)")
        }
    }

    /// A PEM private key (PKCS#8 `PRIVATE KEY`, or SEC1 `EC PRIVATE KEY` / PKCS#1 `RSA PRIVATE KEY`
    /// for keys made elsewhere).
    public static func loadPrivateKey(_ path: String) throws -> Certificate.PrivateKey {
        let text = try read(path)
        do {
            return try Certificate.PrivateKey(pemEncoded: text)
        } catch {
            throw CertificateError(path: path, code: .malformed, reason: "not a PEM private key: \(error)")
        }
    }

    /// A node's certificate and private key, checked to belong together.
    static func loadNode(_ node: NodeCertificateFiles) throws -> (certificate: Certificate, key: Certificate.PrivateKey) {
        let certificate = try loadCertificate(node.certificatePath)
        let key = try loadPrivateKey(node.privateKeyPath)
        guard key.publicKey == certificate.publicKey else {
            throw CertificateError(path: node.privateKeyPath, code: .mismatch, reason: "this key does not belong to \(node.certificatePath)")
        }
        return (certificate, key)
    }

    // MARK: - Helpers

    static func sign(
        publicKey: Certificate.PublicKey, subject: DistinguishedName, issuer: DistinguishedName, validityDays: Int,
        issuerKey: Certificate.PrivateKey, extensions: Certificate.Extensions
    ) throws -> Certificate {
        let now = Date()
        // An hour of slack for clocks that run behind the issuer's.
        return try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: publicKey, notValidBefore: now - 3600,
            notValidAfter: now + Double(validityDays) * 86_400, issuer: issuer, subject: subject, extensions: extensions,
            issuerPrivateKey: issuerKey)
    }

    static func checkValidity(_ days: Int, _ path: String) throws {
        guard (1...36_500).contains(days) else { throw CertificateError(path: path, code: .invalid, reason: "validity of \(days) days is not 1...36500") }
    }

    static func subjectAlternativeNames(_ hosts: [String], _ path: String) throws -> [GeneralName] {
        var names: [GeneralName] = []
        for raw in hosts {
            // "[::1]" as written in host:port addresses.
            let host = raw.hasPrefix("[") && raw.hasSuffix("]") ? String(raw.dropFirst().dropLast()) : raw
            let name: GeneralName
            if let ip = ipBytes(host) {
                name = .ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip)))
            } else if !host.isEmpty, host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || "-._*".contains($0)) }) {
                name = .dnsName(host.lowercased())
            } else {
                throw CertificateError(path: path, code: .invalid, reason: "'\(raw)' is not a DNS name or IP address")
            }
            if !names.contains(name) { names.append(name) }
        }
        guard !names.isEmpty else { throw CertificateError(path: path, code: .invalid, reason: "a node certificate needs at least one host") }
        return names
    }

    /// The address bytes of an IPv4 or IPv6 literal; nil for anything else.
    static func ipBytes(_ host: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    static func read(_ path: String) throws -> String {
        guard FileManager.default.fileExists(atPath: path) else { throw CertificateError(path: path, code: .missing, reason: "no such file") }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CertificateError(path: path, code: .unreadable, reason: "cannot read the file (permissions?)")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw CertificateError(path: path, code: .unreadable, reason: "not a text (PEM) file") }
        return text
    }

    /// Whether both files of a pair exist; half a pair is an error.
    static func pairExists(_ certificatePath: String, _ keyPath: String) throws -> Bool {
        switch (FileManager.default.fileExists(atPath: certificatePath), FileManager.default.fileExists(atPath: keyPath)) {
        case (true, true): return true
        case (false, false): return false
        case (true, false): throw CertificateError(path: keyPath, code: .missing, reason: "missing, but its certificate \(certificatePath) exists; restore it or remove both")
        case (false, true): throw CertificateError(path: certificatePath, code: .missing, reason: "missing, but its key \(keyPath) exists; restore it or remove both")
        }
    }

    /// Writes a new key (0600) and certificate (0644); neither may exist. If the certificate
    /// cannot be written, the key is removed again.
    static func writePair(key: P256.Signing.PrivateKey, certificate: Certificate, keyPath: String, certificatePath: String, directory: String) throws {
        for path in [keyPath, certificatePath] where FileManager.default.fileExists(atPath: path) {
            throw CertificateError(path: path, code: .exists, reason: "exists; refusing to overwrite")
        }
        try makeDirectory(directory)
        // A final newline, so that `cat ca1.pem ca2.pem > bundle.pem` makes a bundle OpenSSL reads.
        try writeNew(key.pemRepresentation + "\n", to: keyPath, mode: 0o600)
        do {
            try writeNew(try certificate.serializeAsPEM().pemString + "\n", to: certificatePath, mode: 0o644)
        } catch {
            unlink(keyPath)
            throw error
        }
    }

    /// Creates `path` with `mode` from the start (O_EXCL: never overwrites, and a key is never
    /// readable by others, not even briefly), writes `text` and syncs it.
    /// `writeNew` for other modules (`banyan service-account create`): `permissions` as in
    /// chmod (0o600).
    public static func writeNewFile(_ text: String, to path: String, permissions: UInt16) throws {
        try writeNew(text, to: path, mode: mode_t(permissions))
    }

    static func writeNew(_ text: String, to path: String, mode: mode_t) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard fd >= 0 else {
            let exists = errno == EEXIST
            throw CertificateError(path: path, code: exists ? .exists : .invalid, reason: exists ? "exists; refusing to overwrite" : "cannot create: \(errnoText())")
        }
        var ok = fchmod(fd, mode) == 0
        var bytes = Array(text.utf8)[...]
        while ok, !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            ok = n > 0
            if ok { bytes = bytes.dropFirst(n) }
        }
        ok = ok && fsync(fd) == 0
        let reason = errnoText()
        close(fd)
        guard ok else {
            unlink(path)
            throw CertificateError(path: path, code: .invalid, reason: "cannot write: \(reason)")
        }
    }

    static func makeDirectory(_ path: String) throws {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw CertificateError(path: path, code: .invalid, reason: "cannot create the directory: \(error.localizedDescription)")
        }
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }
}
