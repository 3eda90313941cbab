import BanyanAuth
import BanyanServer
import Foundation
import Logging
import Testing

/// `banyan service-account create|token` as an operator runs them: the real binary, then a node
/// configured with the accounts file it wrote, and `banyan rules set` signing in with the key.
@Suite struct ServiceAccountCommandTests {
    @Test("create writes a 0600 key file and the accounts file (a second key for the same account rotates), never overwrites; token signs what a node accepts; rules set uses BANYAN_SERVICE_ACCOUNT_FILE")
    func createTokenUse() async throws {
        let dir = try temporaryDirectory("service-account-cli")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        func banyan(_ args: [String], env: [String: String] = ["BANYAN_ADMIN_TOKEN": ""]) async throws -> (Int32, String) {
            let run = try await ChaosTests.runBanyan(args, output: dir + "/out-\(UInt64.random(in: 0...UInt64.max))", environment: env, timeout: 120)
            return (run.process.terminationStatus, run.output)
        }
        let uri = "http://127.0.0.1:1/oauth2.googleapis.com/token"
        let accounts = dir + "/accounts.json"
        let (created, createOutput) = try await banyan(["service-account", "create", "ops@banyan", "--key-file", dir + "/k1.json", "--accounts-file", accounts, "--token-uri", uri])
        #expect(created == 0 && createOutput.contains("service_accounts_file: \(accounts)") && createOutput.contains(uri), "\(createOutput)")
        let mode = try FileManager.default.attributesOfItem(atPath: dir + "/k1.json")[.posixPermissions] as? Int
        #expect(mode == 0o600)
        // Never overwrites a key file; the accounts file is left as it was.
        let before = try String(contentsOfFile: accounts, encoding: .utf8)
        let (again, againOutput) = try await banyan(["service-account", "create", "ops@banyan", "--key-file", dir + "/k1.json", "--accounts-file", accounts, "--token-uri", uri])
        #expect(again != 0 && againOutput.contains("refusing to overwrite"), "\(againOutput)")
        #expect(try String(contentsOfFile: accounts, encoding: .utf8) == before)
        // Plain HTTP to another host is refused, and nothing is written.
        let (insecure, insecureOutput) = try await banyan(
            ["service-account", "create", "ops@banyan", "--key-file", dir + "/k3.json", "--accounts-file", accounts, "--token-uri", "http://db.example.com/oauth2.googleapis.com/token"])
        #expect(insecure != 0 && insecureOutput.contains("must be an https URL"), "\(insecureOutput)")
        let after = try String(contentsOfFile: accounts, encoding: .utf8)
        #expect(!FileManager.default.fileExists(atPath: dir + "/k3.json") && after == before)
        // A second key for the account: both are trusted.
        let (rotated, _) = try await banyan(["service-account", "create", "ops@banyan", "--key-file", dir + "/k2.json", "--accounts-file", accounts, "--token-uri", uri])
        #expect(rotated == 0)
        let loaded = try ServiceAccounts(settings: .init(audiences: [uri]), file: Array(try Data(contentsOf: URL(fileURLWithPath: accounts))))
        #expect(loaded.accountNames == ["ops@banyan"] && loaded.keyIDs.count == 2)

        let now = Int64(Date().timeIntervalSince1970) * 1000
        for keyFile in ["k1.json", "k2.json"] {
            let (status, token) = try await banyan(["service-account", "token", dir + "/" + keyFile])
            let verified = try loaded.verify(token.trimmingCharacters(in: .whitespacesAndNewlines), now: now).get()
            #expect(status == 0 && verified.kind == .serviceAccount("ops@banyan"))
        }
        let (tooLong, tooLongOutput) = try await banyan(["service-account", "token", dir + "/k1.json", "--lifetime", "7200"])
        #expect(tooLong != 0 && tooLongOutput.contains("--lifetime must be 1 to 3600 seconds"), "\(tooLongOutput)")

        // A node that trusts the file, with closed development access: rules set signs in with the key.
        let yaml = "auth:\n  service_accounts_file: \(accounts)\n  service_account_audiences: [\"\(uri)\"]\ndevelopment:\n  allow_unauthenticated: false\n  accept_owner_token: false\n"
        let node = try BanyanNode.start(config: try NodeConfig.parse(yaml: yaml, over: singleNodeConfig(dir)), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        #expect(await eventually({ ((try? httpExchange(port: port, "GET", "/.banyan/ready"))?.status ?? 0) == 200 }, seconds: 30))
        try #"{"rules": {".read": false, ".write": false}}"#.write(toFile: dir + "/rules.json", atomically: true, encoding: .utf8)
        let (refused, refusedOutput) = try await banyan(["rules", "set", dir + "/rules.json", "--endpoint", "127.0.0.1:\(port)"])
        #expect(refused != 0 && refusedOutput.contains("401"), "without the key: \(refusedOutput)")
        let (set, setOutput) = try await banyan(
            ["rules", "set", dir + "/rules.json", "--endpoint", "127.0.0.1:\(port)"], env: ["BANYAN_ADMIN_TOKEN": "", "BANYAN_SERVICE_ACCOUNT_FILE": dir + "/k2.json"])
        #expect(set == 0, "\(setOutput)")
        let (_, got) = try await banyan(["rules", "get", "--endpoint", "127.0.0.1:\(port)"], env: ["BANYAN_ADMIN_TOKEN": "", "BANYAN_SERVICE_ACCOUNT_FILE": dir + "/k1.json"])
        #expect(got.contains(#"".write": false"#), "\(got)")
    }
}
