import Crypto
import Foundation
public import NIOSSL
import SwiftASN1
public import X509

/// Files of a certificate authority: its certificate and (for issuing) its private key.
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

public struct CertificateError: Error, Sendable, CustomStringConvertible {
    public var path: String
    public var reason: String
    public init(path: String, reason: String) {
        self.path = path
        self.reason = reason
    }
    public var description: String { "\(path): \(reason)" }
}

/// The cluster CA and node certificates (docs/operations.md, "Certificates"): P-256 ECDSA keys,
/// X.509 v3 certificates from swift-certificates. Node certificates name every host a peer may
/// dial (DNS names and IP addresses as subject alternative names) and allow both server and
/// client authentication, because a node presents the same certificate when it accepts and when
/// it dials. Private keys are written with mode 0600; existing files are never overwritten.
public enum DevCertificates {
    public static func createCA(commonName: String, directory: String, validityDays: Int = 3650) throws -> CAFiles {
        let files = CAFiles(certificatePath: directory + "/ca.pem", privateKeyPath: directory + "/ca.key")
        try refuseOverwrite(files.certificatePath)
        let key = P256.Signing.PrivateKey()
        let name = try DistinguishedName {
            CommonName(commonName)
            OrganizationName("Banyan")
        }
        let publicKey = Certificate.PublicKey(key.publicKey)
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: publicKey, notValidBefore: now - 3600,
            notValidAfter: now + Double(validityDays) * 86_400, issuer: name, subject: name, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: publicKey)
            },
            issuerPrivateKey: Certificate.PrivateKey(key))
        try makeDirectory(directory)
        try write(key.pemRepresentation, to: files.privateKeyPath ?? "", mode: 0o600)
        try write(try certificate.serializeAsPEM().pemString, to: files.certificatePath, mode: 0o644)
        return files
    }

    public static func issueNodeCertificate(
        ca: CAFiles, nodeName: String, hosts: [String], directory: String, validityDays: Int = 825
    ) throws -> NodeCertificateFiles {
        let files = NodeCertificateFiles(certificatePath: "\(directory)/\(nodeName).pem", privateKeyPath: "\(directory)/\(nodeName).key")
        try refuseOverwrite(files.certificatePath)
        guard let caKeyPath = ca.privateKeyPath else { throw CertificateError(path: ca.certificatePath, reason: "the CA's private key is needed to issue certificates") }
        let caCertificate = try loadCertificate(ca.certificatePath)
        let caKey: P256.Signing.PrivateKey
        do {
            caKey = try P256.Signing.PrivateKey(pemRepresentation: try read(caKeyPath))
        } catch let e as CertificateError {
            throw e
        } catch {
            throw CertificateError(path: caKeyPath, reason: "not a P-256 private key in PEM: \(error)")
        }
        guard hosts.count > 0 else { throw CertificateError(path: files.certificatePath, reason: "a node certificate needs at least one host") }
        var names: [GeneralName] = []
        for host in hosts {
            if let ip = ipBytes(host) {
                names.append(.ipAddress(ASN1OctetString(contentBytes: ArraySlice(ip))))
            } else {
                names.append(.dnsName(host))
            }
        }
        let key = P256.Signing.PrivateKey()
        let publicKey = Certificate.PublicKey(key.publicKey)
        let subject = try DistinguishedName {
            CommonName(nodeName)
            OrganizationName("Banyan")
        }
        let issuerKeyID = try caCertificate.extensions.subjectKeyIdentifier?.keyIdentifier
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: publicKey, notValidBefore: now - 3600,
            notValidAfter: now + Double(validityDays) * 86_400, issuer: caCertificate.subject, subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true, keyEncipherment: true))
                try ExtendedKeyUsage([.serverAuth, .clientAuth])
                SubjectAlternativeNames(names)
                SubjectKeyIdentifier(hash: publicKey)
                AuthorityKeyIdentifier(keyIdentifier: issuerKeyID)
            },
            issuerPrivateKey: Certificate.PrivateKey(caKey))
        try makeDirectory(directory)
        try write(key.pemRepresentation, to: files.privateKeyPath, mode: 0o600)
        try write(try certificate.serializeAsPEM().pemString, to: files.certificatePath, mode: 0o644)
        return files
    }

    /// The development set-up of `banyan serve`: a CA in `directory` (created on first use) and
    /// a certificate for `nodeName` (created if absent). Idempotent; never overwrites.
    public static func ensureDevelopmentCertificates(directory: String, nodeName: String, hosts: [String]) throws -> (ca: CAFiles, node: NodeCertificateFiles) {
        let ca = CAFiles(certificatePath: directory + "/ca.pem", privateKeyPath: directory + "/ca.key")
        let lock = directory + "/.lock"
        try makeDirectory(directory)
        // Several local nodes may start at once and share one CA: serialise with a lock file.
        let fd = open(lock, O_CREAT | O_RDWR, 0o600)
        guard fd >= 0 else { throw CertificateError(path: lock, reason: "cannot open the lock file") }
        defer { close(fd) }
        flock(fd, LOCK_EX)
        defer { flock(fd, LOCK_UN) }
        if !FileManager.default.fileExists(atPath: ca.certificatePath) {
            _ = try createCA(commonName: "Banyan development CA", directory: directory)
        }
        let node = NodeCertificateFiles(certificatePath: "\(directory)/\(nodeName).pem", privateKeyPath: "\(directory)/\(nodeName).key")
        if !FileManager.default.fileExists(atPath: node.certificatePath) {
            return (ca, try issueNodeCertificate(ca: ca, nodeName: nodeName, hosts: hosts, directory: directory))
        }
        return (ca, node)
    }

    public static func loadCertificate(_ path: String) throws -> Certificate {
        do {
            return try Certificate(pemEncoded: try read(path))
        } catch let e as CertificateError {
            throw e
        } catch {
            throw CertificateError(path: path, reason: "not a PEM certificate: \(error)")
        }
    }

    static func ipBytes(_ host: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    static func read(_ path: String) throws -> String {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CertificateError(path: path, reason: "missing or unreadable")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw CertificateError(path: path, reason: "not text") }
        return text
    }

    static func write(_ text: String, to path: String, mode: Int) throws {
        guard FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: mode]) else {
            throw CertificateError(path: path, reason: "cannot write")
        }
    }

    static func refuseOverwrite(_ path: String) throws {
        if FileManager.default.fileExists(atPath: path) { throw CertificateError(path: path, reason: "exists; refusing to overwrite") }
    }

    static func makeDirectory(_ path: String) throws {
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw CertificateError(path: path, reason: "cannot create directory: \(error.localizedDescription)")
        }
    }
}

/// TLS settings of the peer transport: TLS 1.3, each side presents its node certificate and
/// trusts only the cluster CA; the accepting side requires a client certificate (a peer without
/// one, or with one from another CA, fails the handshake).
public enum PeerTLS {
    static func material(_ node: NodeCertificateFiles, _ ca: CAFiles) throws -> (chain: [NIOSSLCertificate], key: NIOSSLPrivateKey, roots: [NIOSSLCertificate]) {
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(node.certificatePath)
            guard !chain.isEmpty else { throw CertificateError(path: node.certificatePath, reason: "no certificate in the file") }
            let key = try NIOSSLPrivateKey(file: node.privateKeyPath, format: .pem)
            let roots = try NIOSSLCertificate.fromPEMFile(ca.certificatePath)
            guard !roots.isEmpty else { throw CertificateError(path: ca.certificatePath, reason: "no certificate in the file") }
            return (chain, key, roots)
        } catch let e as CertificateError {
            throw e
        } catch {
            throw CertificateError(path: node.certificatePath, reason: "cannot load the node certificate, key or CA: \(error)")
        }
    }

    public static func serverConfiguration(node: NodeCertificateFiles, ca: CAFiles) throws -> TLSConfiguration {
        let m = try material(node, ca)
        var c = TLSConfiguration.makeServerConfiguration(certificateChain: m.chain.map { .certificate($0) }, privateKey: .privateKey(m.key))
        c.trustRoots = .certificates(m.roots)
        // Verifying peers on the server side makes a client certificate mandatory; the dialler's
        // host name is not known, so only the chain is checked.
        c.certificateVerification = .noHostnameVerification
        c.minimumTLSVersion = .tlsv13
        return c
    }

    public static func clientConfiguration(node: NodeCertificateFiles, ca: CAFiles) throws -> TLSConfiguration {
        let m = try material(node, ca)
        var c = TLSConfiguration.makeClientConfiguration()
        c.certificateChain = m.chain.map { .certificate($0) }
        c.privateKey = .privateKey(m.key)
        c.trustRoots = .certificates(m.roots)
        c.certificateVerification = .fullVerification
        c.minimumTLSVersion = .tlsv13
        return c
    }
}
