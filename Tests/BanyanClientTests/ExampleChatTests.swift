import BanyanClient
import BanyanServer
import Foundation
import Testing

/// The example app (`banyan-chat`, Examples/Chat) run as a process against an in-process node,
/// bounded and non-interactive (`--say`, `--exit-after`): what it prints and what it leaves on
/// the server. (`Examples/Chat/check.sh`, run by .ci/run, covers more: the offline cache across
/// restarts and several chats at once.)
@Suite(.serialized) struct ExampleChatTests {
    /// `banyan-chat` as `swift build` left it, beside the test runner.
    static func chatBinary() throws -> String {
        let directory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
        for candidate in [directory, directory.deletingLastPathComponent()].map({ $0.appendingPathComponent("banyan-chat").path }) {
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        throw DatabaseError(code: "missing_binary", message: "no banyan-chat beside the test runner (\(directory.path)): run `swift build` first")
    }

    /// Runs the chat to its end (at most `limit` seconds): its exit status and output.
    static func runChat(_ arguments: [String], limit: Double = 60) async throws -> (Int32, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try chatBinary())
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let collected = DatabaseTests.Recorder()
        let reader = Thread {
            let data = output.fileHandleForReading.readDataToEndOfFile()
            collected.add(String(decoding: data, as: UTF8.self))
        }
        reader.start()
        let deadline = Date().addingTimeInterval(limit)
        while process.isRunning && Date() < deadline { try await Task.sleep(nanoseconds: 50_000_000) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
            Issue.record("banyan-chat ran past \(limit) s")
        }
        _ = await collected.wait(seconds: 10) { _ in true }
        return (process.terminationStatus, collected.all.joined())
    }

    @Test("banyan-chat --say … --exit-after 3: connects, shows its message, is listed online, leaves; the server holds the message with its timestamp and the presence it left")
    func chatEndToEnd() async throws {
        let (node, port, dir) = try DatabaseTests.startNode()
        defer {
            node.shutdown()
            try? FileManager.default.removeItem(atPath: dir)
        }
        let url = "http://127.0.0.1:\(port)?ns=chattest"
        let before = Int(Date().timeIntervalSince1970 * 1000) - 60_000
        let (status, out) = try await Self.runChat(["--url", url, "--name", "ada", "--room", "test", "--no-persistence", "--say", "hello there", "--exit-after", "3"])
        #expect(status == 0, "\(out)")
        let lines = out.split(separator: "\n").map(String.init)
        #expect(lines.first == "* ada in room test at \(url) (no offline cache)", "\(out)")
        #expect(lines.contains("* connected"), "\(out)")
        #expect(lines.contains { $0.hasSuffix("] ada: hello there") }, "\(out)")
        #expect(lines.contains("online: ada"), "\(out)")
        #expect(lines.last == "* bye", "\(out)")

        let db = try Database(url: url, authToken: "owner")
        defer { db.shutdown() }
        let messages = try await DatabaseTests.bounded(60) { try await db.reference(withPath: "rooms/test/messages").getData() }
        #expect(messages.childrenCount == 1, "\(DatabaseTests.json(messages.value))")
        let message = try #require(messages.children.first)
        #expect(message.key?.count == 20, "a push id")
        #expect(message.childSnapshot(forPath: "name").value as? String == "ada")
        #expect(message.childSnapshot(forPath: "text").value as? String == "hello there")
        #expect((message.childSnapshot(forPath: "at").value as? Int ?? 0) > before, "the server's timestamp")
        // Leaving ended the connection: its onDisconnect writes removed the entry and set the
        // last-online time.
        let ada = try await DatabaseTests.bounded(60) { try await db.reference(withPath: "rooms/test/members/ada").getData() }
        #expect(!ada.hasChild("connections"), "\(DatabaseTests.json(ada.value))")
        #expect((ada.childSnapshot(forPath: "lastOnline").value as? Int ?? 0) > before, "\(DatabaseTests.json(ada.value))")

        // A second chat sees the first one's message in its history, and only itself online.
        let (status2, out2) = try await Self.runChat(["--url", url, "--name", "bob", "--room", "test", "--no-persistence", "--exit-after", "2"])
        #expect(status2 == 0, "\(out2)")
        #expect(out2.contains("ada: hello there") && out2.contains("online: bob\n") && !out2.contains("online: ada"), "\(out2)")
    }

    @Test("banyan-chat refuses bad arguments with its usage and exit status 2")
    func chatUsage() async throws {
        let (status, out) = try await Self.runChat(["--url", "http://127.0.0.1:1?ns=x", "--name", "a/b"])
        #expect(status == 2, "\(out)")
        #expect(out.contains("--name must be 1 to 100 bytes") && out.contains("usage: banyan-chat"), "\(out)")
        let (status2, out2) = try await Self.runChat(["--name", "ada"])
        #expect(status2 == 2 && out2.contains("--url is required"), "\(out2)")
    }
}
