import BanyanServer
import Foundation
import SwiftASN1
import Testing
import X509
import _CryptoExtras

/// A node given a key file, or a certificate, that holds no usable RSA key refuses it with the
/// reason; it does not crash. Found as a silent SIGABRT of the whole test run: for DER that is neither a
/// SubjectPublicKeyInfo nor a PKCS #1 key, swift-crypto's `_RSA.Signing.PublicKey(derRepresentation:)`
/// freed its key twice, and BoringSSL aborts when the second free finds a reference count of 0
/// in the freed memory. Whether it finds 0 depends on the allocator: glibc's per-thread cache
/// usually writes a nonzero word of its own there, which the second free only decremented (a
/// write into freed memory), so the process lived on unless the memory had been handed out
/// again meanwhile. With that cache off (`glibc.malloc.tcache_count=0`) the freed memory keeps
/// the zeros BoringSSL wiped it with, and the old code aborted every time.
@Suite struct UnusableKeyFileTests {
    /// Runs `banyan serve` on `yaml`, the allocator's thread cache off: how it ended, and its
    /// output.
    static func serve(_ dir: String, yaml: String) async throws -> (reason: Process.TerminationReason, status: Int32, output: String) {
        try yaml.write(toFile: dir + "/node.yaml", atomically: true, encoding: .utf8)
        let run = try await ChaosTests.runBanyan(
            ["serve", "--config", dir + "/node.yaml", "--data-dir", dir + "/data", "--listen", "127.0.0.1:0", "--peer-listen", "127.0.0.1:0"],
            output: dir + "/serve.out", environment: ["GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "SWIFT_BACKTRACE": "enable=no"], timeout: 60
        )
        return (run.process.terminationReason, run.process.terminationStatus, run.output)
    }

    @Test(
        "a PUBLIC KEY or RSA PUBLIC KEY that is no key, in auth.x509_file or an OIDC provider's keys_file: the node exits with the reason, no abort (the old double free aborted here every time)"
    )
    func refusedAtStart() async throws {
        let dir = try temporaryDirectory("unusable-key")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cases: [(name: String, file: String, yaml: String)] = [
            (
                "x509 PUBLIC KEY", #"{"k1":"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}"#,
                "auth:\n  project_id: demo\n  x509_file: \(dir)/keys"
            ),
            (
                "x509 RSA PUBLIC KEY", #"{"k1":"-----BEGIN RSA PUBLIC KEY-----\nMAA=\n-----END RSA PUBLIC KEY-----\n"}"#,
                "auth:\n  project_id: demo\n  x509_file: \(dir)/keys"
            ),
            (
                "provider PEM", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                "auth:\n  oidc_providers:\n    - id: g\n      issuer: https://id.example\n      audience: a\n      keys_file: \(dir)/keys"
            ),
        ]
        for c in cases {
            try c.file.write(toFile: dir + "/keys", atomically: true, encoding: .utf8)
            let run = try await Self.serve(dir, yaml: c.yaml)
            #expect(run.reason == .exit && run.status == 1, "\(c.name): \(run.reason == .uncaughtSignal ? "signal" : "exit") \(run.status)\n\(run.output)")
            #expect(run.output.contains("not an RSA public key") && run.output.contains("cannot start"), "\(c.name): \(run.output)")
        }
    }

    /// A self-signed PEM certificate of `key`; with `evenExponent`, its RSA public exponent is
    /// then made even (65537 to 65538): well-formed DER that swift-certificates reads, a key
    /// BoringSSL refuses.
    static func rsaCertificate(_ key: _RSA.Signing.PrivateKey, evenExponent: Bool) throws -> String {
        let name = try DistinguishedName { CommonName("rsa-key") }
        let now = Date()
        let certificate = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey), notValidBefore: now - 60, notValidAfter: now + 3600,
            issuer: name, subject: name, signatureAlgorithm: .sha256WithRSAEncryption, extensions: Certificate.Extensions(), issuerPrivateKey: .init(key)
        )
        var der = try certificate.serializeAsPEM().derBytes
        if evenExponent {
            let exponent: [UInt8] = [0x02, 0x03, 0x01, 0x00, 0x01]
            let at = try #require((0...(der.count - exponent.count)).first { der[$0..<($0 + exponent.count)].elementsEqual(exponent) })
            der[at + 4] = 0x02
        }
        return PEMDocument(type: "CERTIFICATE", derBytes: der).pemString + "\n"
    }

    @Test("a certificate whose RSA key BoringSSL refuses (an even exponent): banyan certs show and the loader of a node's TLS files refuse it with the reason, no abort")
    func certificateWithUnusableKey() async throws {
        let dir = try temporaryDirectory("unusable-cert")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try #require(TokenServerTests.key)
        try Self.rsaCertificate(key, evenExponent: true).write(toFile: dir + "/bad.pem", atomically: true, encoding: .utf8)
        try Self.rsaCertificate(key, evenExponent: false).write(toFile: dir + "/good.pem", atomically: true, encoding: .utf8)
        let run = try await ChaosTests.runBanyan(
            ["certs", "show", dir + "/bad.pem"], output: dir + "/show.out",
            environment: ["GLIBC_TUNABLES": "glibc.malloc.tcache_count=0", "SWIFT_BACKTRACE": "enable=no"], timeout: 60
        )
        #expect(run.process.terminationReason == .exit && run.process.terminationStatus == 1, "\(run.process.terminationStatus)\n\(run.output)")
        #expect(run.output.contains("RSA key is unusable"), "\(run.output)")
        // In this process as well: the loader the node's TLS uses (at start and on a reload).
        do {
            _ = try DevCertificates.loadCertificates(dir + "/bad.pem")
            Issue.record("the certificate was loaded")
        } catch {
            #expect("\(error)".contains("RSA key is unusable"), "\(error)")
        }
        // The certificate as made loads.
        #expect(try DevCertificates.loadCertificates(dir + "/good.pem").count == 1)
    }
}
