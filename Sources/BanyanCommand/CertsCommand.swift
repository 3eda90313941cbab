import ArgumentParser
import BanyanServer
import Foundation

/// `banyan certs`: the cluster CA and node certificates for production clusters
/// (docs/operations.md, "Certificates").
struct Certs: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a cluster CA and node certificates for mutual TLS between peers; make trust bundles; show certificates.",
        discussion: "Rotating certificates and CAs without downtime: docs/certificates.md.",
        subcommands: [CertsCA.self, CertsNode.self, CertsBundle.self, CertsShow.self])
}

struct CertsCA: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "ca", abstract: "Create a cluster CA (ca.pem, ca.key) in a directory.")
    @Option(name: .long, help: "Directory for ca.pem and ca.key (ca.key is written with mode 0600; keep it offline).")
    var dir: String
    @Option(name: .long, help: "The CA's common name.") var name: String = "Banyan cluster CA"
    @Option(name: .long, help: "Validity in days.") var days: Int = 3650

    func run() throws {
        guard days > 0 && days <= 36_500 else { throw ValidationError("--days must be between 1 and 36500") }
        let files = try DevCertificates.createCA(commonName: name, directory: dir, validityDays: days)
        print("CA certificate: \(files.certificatePath)\nCA private key: \(files.privateKeyPath ?? "")")
    }
}

struct CertsNode: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "node", abstract: "Issue a node certificate signed by the cluster CA, for every host peers dial it by.")
    @Option(name: .long, help: "Directory holding ca.pem and ca.key.") var caDir: String
    @Option(name: .long, help: "Tree name; files are <name>.pem and <name>.key.") var name: String
    @Option(name: .long, help: "A DNS name or IP address peers use to reach this node (repeat).") var host: [String] = []
    @Option(name: .long, help: "Output directory.") var dir: String
    @Option(name: .long, help: "Validity in days.") var days: Int = 825

    func run() throws {
        guard !host.isEmpty else { throw ValidationError("give at least one --host") }
        guard days > 0 && days <= 36_500 else { throw ValidationError("--days must be between 1 and 36500") }
        let ca = CAFiles(certificatePath: caDir + "/ca.pem", privateKeyPath: caDir + "/ca.key")
        let files = try DevCertificates.issueNodeCertificate(ca: ca, nodeName: name, hosts: host, directory: dir, validityDays: days)
        print("certificate: \(files.certificatePath)\nprivate key: \(files.privateKeyPath)")
    }
}

/// `banyan certs bundle --out FILE CA…`: the trust bundle of a CA rotation (docs/certificates.md):
/// every CA certificate of the inputs, each checked to be a CA, duplicates dropped, written with
/// a rename so a node reloading meanwhile reads the old bundle or the new one.
struct CertsBundle: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bundle", abstract: "Write a trust bundle (tls.ca) holding the CA certificates of several files.")
    @Option(name: .long, help: "The bundle to write.") var out: String
    @Flag(name: .long, help: "Replace --out if it exists (the rotation's usual case: the nodes' tls.ca).") var force = false
    @Argument(help: "PEM files of CA certificates (a CA's ca.pem, or an existing bundle), in the order to keep.") var files: [String]

    func run() throws {
        guard !files.isEmpty else { throw ValidationError("give at least one CA file") }
        guard force || !FileManager.default.fileExists(atPath: out) else {
            throw CommandError("\(out) exists; pass --force to replace it")
        }
        let certificates = try CertificateFiles.bundle(files)
        try CertificateFiles.replace(out, with: certificates.map(\.pem).joined())
        for c in certificates { print("  \(c.summary)") }
        print("wrote \(out): \(certificates.count) CA certificate\(certificates.count == 1 ? "" : "s")")
    }
}

/// `banyan certs show FILE…`: what each certificate of PEM files is (subject, issuer, validity,
/// names, fingerprint), for checking files before they are installed and reloaded.
struct CertsShow: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "show", abstract: "Print the certificates of PEM files: subject, issuer, validity, names, SHA-256.")
    @Argument(help: "PEM files (certificates or bundles).") var files: [String]

    func run() throws {
        for file in files {
            let certificates = try CertificateFiles.describe(file)
            print("\(file): \(certificates.count) certificate\(certificates.count == 1 ? "" : "s")")
            for c in certificates { print(c.details) }
        }
    }
}
