import ArgumentParser
import BanyanServer

/// `banyan certs`: the cluster CA and node certificates for production clusters
/// (docs/operations.md, "Certificates").
struct Certs: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a cluster CA and node certificates for mutual TLS between peers.",
        subcommands: [CertsCA.self, CertsNode.self])
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
