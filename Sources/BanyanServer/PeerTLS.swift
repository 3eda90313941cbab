import Foundation
public import NIOCore
public import NIOSSL
import SwiftASN1
public import X509

/// TLS settings of the peer transport (docs/operations.md, "Certificates"): TLS 1.3 only; each
/// side presents its node certificate and trusts only the cluster CA. The accepting side
/// requires a client certificate (a peer without one, or with one from another CA, fails the
/// handshake); the dialling side also checks the accepting node's name against its certificate.
public enum PeerTLS {
    /// For accepting peer connections. Peer verification on a server makes a client
    /// certificate mandatory in NIOSSL (SSL_VERIFY_FAIL_IF_NO_PEER_CERT). Only the chain is
    /// checked: a dialler's address says nothing about which node it is (the hello names it),
    /// and `.fullVerification` would compare the dialler's source IP with its certificate.
    public static func serverConfiguration(node: NodeCertificateFiles, ca: CAFiles) throws -> TLSConfiguration {
        let m = try material(node, ca)
        return serverConfiguration(chain: m.chain, key: m.key, roots: m.roots)
    }

    /// `serverConfiguration(node:ca:)` from material already loaded (`NodeTLS`).
    static func serverConfiguration(chain: [NIOSSLCertificateSource], key: NIOSSLPrivateKeySource, roots: [NIOSSLCertificate]) -> TLSConfiguration {
        var c = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: key)
        c.trustRoots = .certificates(roots)
        c.certificateVerification = .noHostnameVerification
        c.minimumTLSVersion = .tlsv13
        return c
    }

    /// For dialling peers. Full verification: the chain up to the cluster CA, and the name the
    /// dialler passes as `serverHostname` against the certificate's DNS names; with
    /// `serverHostname: nil` (an IP literal, which may not go in SNI) NIOSSL checks the
    /// connected address against the certificate's IP addresses instead.
    public static func clientConfiguration(node: NodeCertificateFiles, ca: CAFiles) throws -> TLSConfiguration {
        let m = try material(node, ca)
        return clientConfiguration(chain: m.chain, key: m.key, roots: m.roots)
    }

    /// `clientConfiguration(node:ca:)` from material already loaded (`NodeTLS`).
    static func clientConfiguration(chain: [NIOSSLCertificateSource], key: NIOSSLPrivateKeySource, roots: [NIOSSLCertificate]) -> TLSConfiguration {
        var c = TLSConfiguration.makeClientConfiguration()
        c.certificateChain = chain
        c.privateKey = key
        c.trustRoots = .certificates(roots)
        c.certificateVerification = .fullVerification
        c.minimumTLSVersion = .tlsv13
        return c
    }

    /// The node's chain and key (checked to belong together) and the CA certificates, each
    /// file's problem reported against that file.
    static func material(_ node: NodeCertificateFiles, _ ca: CAFiles) throws -> (
        chain: [NIOSSLCertificateSource], key: NIOSSLPrivateKeySource, roots: [NIOSSLCertificate]
    ) {
        let (_, key) = try DevCertificates.loadNode(node)
        let chain = try DevCertificates.loadCertificates(node.certificatePath)
        let roots = try DevCertificates.loadCertificates(ca.certificatePath)
        do {
            return (
                try chain.map { .certificate(try NIOSSLCertificate(bytes: try der($0), format: .der)) },
                .privateKey(try NIOSSLPrivateKey(bytes: Array(try key.serializeAsPEM().pemString.utf8), format: .pem)),
                try roots.map { try NIOSSLCertificate(bytes: try der($0), format: .der) }
            )
        } catch {
            throw CertificateError(path: node.certificatePath, code: .malformed, reason: "NIOSSL cannot use this certificate or key: \(error)")
        }
    }

    static func der(_ certificate: Certificate) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return serializer.serializedBytes
    }

    // MARK: - The peer's identity

    /// Who is on the other end of a TLS channel, after the handshake, for logs: the peer
    /// certificate's common name and subject alternative names. nil before the handshake, or
    /// without a TLS handler.
    public static func peerIdentity(of channel: any Channel) -> EventLoopFuture<PeerIdentity?> {
        channel.pipeline.handler(type: NIOSSLHandler.self).map { identity($0.peerCertificate) }.recover { _ in nil }
    }

    /// `peerIdentity(of:)` from a handler on the channel's event loop.
    public static func peerIdentity(in pipeline: ChannelPipeline.SynchronousOperations) -> PeerIdentity? {
        identity((try? pipeline.handler(type: NIOSSLHandler.self))?.peerCertificate)
    }

    static func identity(_ certificate: NIOSSLCertificate?) -> PeerIdentity? {
        guard let der = try? certificate?.toDERBytes(), let parsed = try? Certificate(derEncoded: der) else { return nil }
        return PeerIdentity(parsed)
    }
}

/// A peer certificate's names, for logs (`PeerTLS.peerIdentity`).
public struct PeerIdentity: Sendable, Equatable, CustomStringConvertible {
    public var commonName: String?
    public var dnsNames: [String]
    public var ipAddresses: [String]
    public var issuer: String

    public init(_ certificate: Certificate) {
        commonName = certificate.subject.flatMap { $0 }.last { $0.type == .RDNAttributeType.commonName }.flatMap { String($0.value) }
        issuer = "\(certificate.issuer)"
        dnsNames = []
        ipAddresses = []
        for name in Array((try? certificate.extensions.subjectAlternativeNames) ?? SubjectAlternativeNames()) {
            switch name {
            case .dnsName(let dns): dnsNames.append(dns)
            case .ipAddress(let ip): ipAddresses.append(Self.format(Array(ip.bytes)))
            default: continue
            }
        }
    }

    /// Whether this certificate belongs to node `id`: its common name is `node<id>`, or one of its
    /// DNS names is `node<id>` or starts with `node<id>.` (as `banyan certs node --name node<id>`
    /// and the development certificates make them).
    public func names(node id: UInt64) -> Bool {
        let name = "node\(id)"
        return commonName == name || dnsNames.contains { $0 == name || $0.hasPrefix(name + ".") }
    }

    public var description: String {
        var parts = ["CN=\(commonName ?? "?")"]
        parts += dnsNames.map { "DNS:\($0)" } + ipAddresses.map { "IP:\($0)" }
        return parts.joined(separator: " ")
    }

    static func format(_ bytes: [UInt8]) -> String {
        let family: Int32
        switch bytes.count {
        case 4: family = AF_INET
        case 16: family = AF_INET6
        default: return bytes.map { String($0, radix: 16) }.joined(separator: ":")
        }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        let ok = bytes.withUnsafeBytes { inet_ntop(family, $0.baseAddress, &text, socklen_t(text.count)) } != nil
        return ok ? String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
    }
}
