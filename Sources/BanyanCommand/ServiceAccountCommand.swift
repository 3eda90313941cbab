import ArgumentParser
import BanyanAuth
import BanyanServer
import BanyanTree
import Foundation

/// `banyan service-account create|token` (docs/security.md, "Service accounts"; docs/cli.md).
struct ServiceAccountCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "service-account",
        abstract: "Make administrator keys shaped like Google service-account keys, and sign tokens with them.",
        subcommands: [ServiceAccountCreate.self, ServiceAccountToken.self])
}

struct ServiceAccountCreate: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Make a key pair for an account: the private key file for the client, the public key into the nodes' accounts file.",
        discussion: """
            Writes KEY_FILE (mode 0600; never overwrites) in Google's service-account format, so Google's libraries \
            (oauth2client, google-auth) and `banyan service-account token` can use it; adds the public key to \
            ACCOUNTS_FILE (created if missing), which every node reads as auth.service_accounts_file. Running it again \
            for the same account adds a second key (rotation): remove the old kid from ACCOUNTS_FILE and restart the \
            nodes to retire it.
            """)
    @Argument(help: "The account's name (its key file's client_email; tokens' iss and sub), e.g. admin@my-cluster.")
    var account: String
    @Option(name: .customLong("key-file"), help: "Where to write the private key file (JSON).")
    var keyFile: String
    @Option(name: .customLong("accounts-file"), help: "The nodes' service-accounts file to add the public key to.")
    var accountsFile: String
    @Option(
        name: .customLong("token-uri"),
        help: "The token endpoint as clients reach it (the key file's token_uri; list it in auth.service_account_audiences).")
    var tokenURI: String = "http://127.0.0.1:9000/oauth2.googleapis.com/token"
    @Option(name: .customLong("project-id"), help: "A project id to record in the key file (some libraries want one).")
    var projectID: String?

    func run() throws {
        guard (1...256).contains(account.utf8.count) else { throw CommandError("the account's name must be 1 to 256 bytes") }
        // Assertions are administrator credentials: in clear only to this machine.
        guard let url = URL(string: tokenURI), let scheme = url.scheme?.lowercased(), url.host != nil,
            scheme == "https" || (scheme == "http" && ServiceAccounts.isSafeAudience(tokenURI))
        else {
            throw CommandError("--token-uri must be an https URL (http only to a loopback host: its tokens are administrator credentials)")
        }
        // The accounts file is read (and checked) before anything is written.
        var accounts: [(String, JSONValue)] = []
        if FileManager.default.fileExists(atPath: accountsFile) {
            guard let data = FileManager.default.contents(atPath: accountsFile) else { throw CommandError("cannot read \(accountsFile)") }
            guard case .object(let members)? = try? JSONValue(parsing: Array(data), maxDepth: 8) else {
                throw CommandError("\(accountsFile) is not a service-accounts file (a JSON object from account names to JWKS)")
            }
            accounts = members
        }
        let key: ServiceAccountKey
        let jwk: JSONValue
        do {
            key = try ServiceAccountKey.generate(account: account, tokenURI: tokenURI, projectID: projectID)
            jwk = try key.publicJWK()
        } catch {
            throw CommandError("\(error)")
        }
        if let i = accounts.firstIndex(where: { $0.0 == account }) {
            guard case .object(var set) = accounts[i].1, let k = set.firstIndex(where: { $0.0 == "keys" }), case .array(let keys) = set[k].1 else {
                throw CommandError("\(accountsFile): \(account)'s keys are not a JWKS ({\"keys\": [...]}); add the key by hand")
            }
            set[k].1 = .array(keys + [jwk])
            accounts[i].1 = .object(set)
        } else {
            accounts.append((account, .object([("keys", .array([jwk]))])))
        }
        let text = JSONValue.object(accounts).jsonString + "\n"
        // Checked as a node will load it, before the private key exists anywhere.
        do {
            _ = try ServiceAccounts(settings: .init(audiences: [tokenURI]), file: Array(text.utf8))
        } catch {
            throw CommandError("\(accountsFile) would not load: \(error)")
        }
        do {
            try DevCertificates.writeNewFile(key.fileText, to: keyFile, permissions: 0o600)
        } catch {
            throw CommandError("\(error)")
        }
        let partial = accountsFile + ".partial"
        unlink(partial)
        // Should the accounts file not be written, the key file goes too: no key nobody trusts.
        do {
            try DevCertificates.writeNewFile(text, to: partial, permissions: 0o644)
        } catch {
            unlink(keyFile)
            throw CommandError("\(error)")
        }
        guard rename(partial, accountsFile) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(partial)
            unlink(keyFile)
            throw CommandError("cannot replace \(accountsFile): \(reason)")
        }
        let absolute = accountsFile.hasPrefix("/") ? accountsFile : FileManager.default.currentDirectoryPath + "/" + accountsFile
        print(
            """
            wrote \(keyFile) (private key, mode 0600: give it to the client, keep it secret)
            added kid \(key.keyID) for \(account) to \(accountsFile)
            every node's configuration needs (then restart it):
              auth:
                service_accounts_file: \(absolute)
                # the token_uri (oauth2client, Pyrebase) and the audience google-auth (firebase-admin) always names
                service_account_audiences: ["\(tokenURI)", "\(ServiceAccountTokenEndpoint.googleAudience)"]
            """)
    }
}

struct ServiceAccountToken: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token",
        abstract: "Print a token signed with a service account's key (an administrator's: send it as Authorization: Bearer, auth= or WebSocket auth).")
    @Argument(help: "The account's key file (from `banyan service-account create`).")
    var keyFile: String
    @Option(name: .long, help: "The audience (default: the key file's token_uri).")
    var audience: String?
    @Option(name: .long, help: "Seconds the token lives (at most 3600).")
    var lifetime: Int64 = 3600

    func run() throws {
        guard (1...3600).contains(lifetime) else { throw CommandError("--lifetime must be 1 to 3600 seconds") }
        guard let data = FileManager.default.contents(atPath: keyFile) else { throw CommandError("cannot read \(keyFile)") }
        do {
            let key = try ServiceAccountKey(file: Array(data))
            print(try key.token(now: Int64(Date().timeIntervalSince1970), audience: audience, lifetime: lifetime))
        } catch {
            throw CommandError("\(keyFile): \(error)")
        }
    }
}
