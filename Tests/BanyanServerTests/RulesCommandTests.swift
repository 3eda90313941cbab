import BanyanServer
import Foundation
import Logging
import Testing

/// `banyan rules get|set|test` as an operator runs them: the real binary against a running node.
@Suite struct RulesCommandTests {
    static let rules = """
        {
          // Only the owner of a record may write it.
          "rules": {
            "users": { "$uid": { ".read": "auth != null", ".write": "auth != null && auth.uid == $uid" } }
          }
        }
        """

    @Test("rules set checks the file and sets it; get prints it as set; test runs cases offline and exits 1 when one fails")
    func getSetTest() async throws {
        let dir = try temporaryDirectory("rules-cli")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        #expect(await eventually({ ((try? httpExchange(port: port, "PUT", "/a.json?auth=owner", body: "1"))?.status ?? 0) == 200 }, seconds: 30))
        let endpoint = "127.0.0.1:\(port)"
        // No operator token here: the development node's `owner` is the administrator.
        let env = ["BANYAN_ADMIN_TOKEN": ""]
        func banyan(_ args: [String]) async throws -> (Int32, String) {
            let run = try await ChaosTests.runBanyan(args, output: dir + "/out-\(UInt64.random(in: 0...UInt64.max))", environment: env, timeout: 120)
            return (run.process.terminationStatus, run.output)
        }

        try Self.rules.write(toFile: dir + "/rules.json", atomically: true, encoding: .utf8)
        let (setStatus, setOutput) = try await banyan(["rules", "set", dir + "/rules.json", "--endpoint", endpoint])
        #expect(setStatus == 0, "\(setOutput)")
        // In force on the node: a write by another user is refused, the owner's allowed.
        #expect(try httpExchange(port: port, "PUT", "/users/ada.json", body: "1").status == 401)
        let (getStatus, getOutput) = try await banyan(["rules", "get", "--endpoint", endpoint])
        #expect(getStatus == 0 && getOutput.contains("// Only the owner of a record may write it."), "\(getOutput)")

        // A file with an error is refused before anything is sent, naming line and column.
        try "{\n  \"rules\": {\n    \".read\": \"auth.uid ==\"\n  }\n}".write(toFile: dir + "/bad.json", atomically: true, encoding: .utf8)
        let (badStatus, badOutput) = try await banyan(["rules", "set", dir + "/bad.json", "--endpoint", endpoint])
        #expect(badStatus != 0 && badOutput.contains("bad.json:3:"), "\(badOutput)")
        let (_, still) = try await banyan(["rules", "get", "--endpoint", endpoint])
        #expect(still.contains("Only the owner"), "the rules in force did not change: \(still)")

        // Offline cases: all passing exits 0; one failing exits 1 and says which.
        let passing = """
            [{"name": "own record", "auth": {"uid": "ada"}, "path": "/users/ada", "op": "set", "data": 1, "expected": "allow"},
             {"name": "another's record", "auth": {"uid": "bob"}, "path": "/users/ada", "op": "set", "data": 1, "expected": "deny"}]
            """
        try passing.write(toFile: dir + "/cases.json", atomically: true, encoding: .utf8)
        let (testStatus, testOutput) = try await banyan(["rules", "test", dir + "/rules.json", dir + "/cases.json"])
        #expect(testStatus == 0 && testOutput.contains("PASS"), "\(testOutput)")
        let failing = #"[{"name": "wrongly expected", "auth": null, "path": "/users/ada", "op": "read", "expected": "allow"}]"#
        try failing.write(toFile: dir + "/failing.json", atomically: true, encoding: .utf8)
        let (failStatus, failOutput) = try await banyan(["rules", "test", dir + "/rules.json", dir + "/failing.json"])
        #expect(failStatus == 1 && failOutput.contains("FAIL") && failOutput.contains("wrongly expected"), "\(failOutput)")
    }

    @Test("quota set (with units) and get and remove: the real command against a node; a bad size is refused before anything is sent")
    func quotaCommand() async throws {
        let dir = try temporaryDirectory("quota-cli")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let node = try BanyanNode.start(config: singleNodeConfig(dir), logger: Logger(label: "test"))
        defer { node.shutdown() }
        let port = clientPort(node)
        #expect(await eventually({ ((try? httpExchange(port: port, "PUT", "/a.json?ns=app", body: #""abc""#))?.status ?? 0) == 200 }, seconds: 30))
        let endpoint = "127.0.0.1:\(port)"
        func banyan(_ args: [String]) async throws -> (Int32, String) {
            let run = try await ChaosTests.runBanyan(args, output: dir + "/out-\(UInt64.random(in: 0...UInt64.max))", environment: ["BANYAN_ADMIN_TOKEN": ""], timeout: 120)
            return (run.process.terminationStatus, run.output)
        }
        let (setStatus, setOutput) = try await banyan(["quota", "set", "1KiB", "--namespace", "app", "--endpoint", endpoint])
        #expect(setStatus == 0 && setOutput.contains("quota set to 1024 bytes"), "\(setOutput)")
        let (getStatus, getOutput) = try await banyan(["quota", "get", "--namespace", "app", "--endpoint", endpoint])
        #expect(getStatus == 0 && getOutput.contains(#"{"namespace":"app","quota_bytes":1024,"used_bytes":4}"#), "\(getOutput)")
        #expect(try httpExchange(port: port, "PUT", "/b.json?ns=app", body: "\"" + String(repeating: "x", count: 1100) + "\"").status == 507)
        for bad in ["lots", "1.5GiB", "0", "99999999TiB", "2000TiB"] {
            let (badStatus, badOutput) = try await banyan(["quota", "set", bad, "--namespace", "app", "--endpoint", endpoint])
            #expect(badStatus != 0 && badOutput.contains("a quota is a positive number of bytes"), "\(bad): \(badOutput)")
        }
        let (mebi, _) = try await banyan(["quota", "set", "2MiB", "--namespace", "app", "--endpoint", endpoint])
        #expect(mebi == 0)
        #expect(try httpExchange(port: port, "GET", "/.settings/quota.json?ns=app&auth=owner").body.contains(#""quota_bytes":2097152"#))
        let (removeStatus, _) = try await banyan(["quota", "remove", "--namespace", "app", "--endpoint", endpoint])
        #expect(removeStatus == 0)
        #expect(try httpExchange(port: port, "PUT", "/b.json?ns=app", body: "\"" + String(repeating: "x", count: 1100) + "\"").status == 200)
    }
}
