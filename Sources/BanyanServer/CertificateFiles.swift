import Crypto
public import Foundation
import SwiftASN1
import X509

/// Certificate files as `banyan certs bundle` and `banyan certs show` handle them.
public enum CertificateFiles {
    /// One certificate of a file, described for an operator.
    public struct Described: Sendable {
        public var subject: String
        public var issuer: String
        public var serial: String
        public var notBefore: Date
        public var notAfter: Date
        public var isCA: Bool
        /// Subject alternative names (DNS names and IP addresses).
        public var names: [String]
        public var sha256: String
        /// The certificate alone, PEM, with a final newline.
        public var pem: String

        /// One line: subject, validity end, fingerprint prefix.
        public var summary: String {
            "\(subject)  not after \(TLSMaterial.iso(notAfter))  sha256 \(sha256.prefix(16))…"
        }

        /// Several indented lines.
        public var details: String {
            let days = notAfter.timeIntervalSinceNow / 86_400
            let left = days < 0 ? "EXPIRED" : String(format: "%.0f days left", days)
            var lines = [
                "  subject:   \(subject)", "  issuer:    \(issuer)", "  serial:    \(serial)",
                "  valid:     \(TLSMaterial.iso(notBefore)) to \(TLSMaterial.iso(notAfter)) (\(left))", "  CA:        \(isCA ? "yes" : "no")",
            ]
            if !names.isEmpty { lines.append("  names:     \(names.joined(separator: ", "))") }
            lines.append("  sha256:    \(sha256)")
            return lines.joined(separator: "\n")
        }
    }

    public static func describe(_ file: String) throws -> [Described] {
        try DevCertificates.loadCertificates(file).map { c in
            let der = try PeerTLS.der(c)
            let identity = PeerIdentity(c)
            let isCA: Bool
            if case .isCertificateAuthority? = try? c.extensions.basicConstraints { isCA = true } else { isCA = false }
            return Described(
                subject: "\(c.subject)", issuer: "\(c.issuer)", serial: TLSMaterial.serial(c), notBefore: c.notValidBefore, notAfter: c.notValidAfter,
                isCA: isCA, names: identity.dnsNames.map { "DNS:\($0)" } + identity.ipAddresses.map { "IP:\($0)" },
                sha256: SHA256.hash(data: der).map { String(format: "%02x", $0) }.joined(), pem: try c.serializeAsPEM().pemString + "\n")
        }
    }

    /// The CA certificates of `files` in order, duplicates dropped; a certificate that is not a
    /// CA's is refused (it would make the bundle unloadable, docs/certificates.md).
    public static func bundle(_ files: [String]) throws -> [Described] {
        var out: [Described] = []
        for file in files {
            for c in try describe(file) {
                guard c.isCA else {
                    throw CertificateError(path: file, code: .notCA, reason: "\(c.subject) is not a CA certificate; a trust bundle holds CA certificates only")
                }
                if !out.contains(where: { $0.sha256 == c.sha256 }) { out.append(c) }
            }
        }
        return out
    }

    /// Writes `text` to `path` through a temporary file and a rename (mode 0644): a reader sees
    /// the old file or the new one, never half of either.
    public static func replace(_ path: String, with text: String) throws {
        let temporary = path + ".tmp-\(getpid())"
        unlink(temporary)
        try DevCertificates.writeNew(text, to: temporary, mode: 0o644)
        guard rename(temporary, path) == 0 else {
            let reason = DevCertificates.errnoText()
            unlink(temporary)
            throw CertificateError(path: path, code: .invalid, reason: "cannot replace: \(reason)")
        }
    }
}
