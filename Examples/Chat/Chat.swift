// The chat's options, its use of the SDK, and the program (main.swift calls ChatProgram.run()).
import BanyanClient
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

struct Options {
    var url = ""
    var nodes: [String] = []
    var name = ""
    var room = "lobby"
    var token: String?
    var cache: String?
    var persistence = true
    var say: [String] = []
    var exitAfter: Double?
    var history = 50

    static let usage = """
        usage: banyan-chat --url 'http://host:port?ns=name' --name NAME [options]

          --url URL          a Banyan node (as the Firebase emulator is given); required
          --name NAME        your name in the room; required
          --room ROOM        the room (default: lobby)
          --node HOST:PORT   another node of the cluster to fail over to (repeat)
          --token TOKEN      a credential (e.g. owner on a development node; none is needed on
                             the default `banyan serve` on loopback)
          --history N        messages shown at start (default: 50)
          --cache DIR        where the offline cache goes (default: the user's application
                             support directory, banyan-chat/<name>)
          --no-persistence   keep nothing on disk
          --say TEXT         send TEXT at start (repeat); for scripts
          --exit-after SECS  leave after SECS seconds instead of reading lines from stdin

        Typed lines are sent; /who lists who is online, /offline and /online drop and restore the
        connection, /quit leaves.
        """

    static func parse(_ arguments: [String]) throws -> Options {
        var o = Options()
        var i = 0
        func value(_ flag: String) throws -> String {
            i += 1
            guard i < arguments.count else { throw UsageError("\(flag) needs a value") }
            return arguments[i]
        }
        while i < arguments.count {
            let a = arguments[i]
            switch a {
            case "--url": o.url = try value(a)
            case "--node": o.nodes.append(try value(a))
            case "--name": o.name = try value(a)
            case "--room": o.room = try value(a)
            case "--token": o.token = try value(a)
            case "--cache": o.cache = try value(a)
            case "--no-persistence": o.persistence = false
            case "--say": o.say.append(try value(a))
            case "--history":
                guard let n = Int(try value(a)), (1...1000).contains(n) else { throw UsageError("--history takes a number from 1 to 1000") }
                o.history = n
            case "--exit-after":
                guard let s = Double(try value(a)), s >= 0, s <= 86_400 else { throw UsageError("--exit-after takes seconds (0 to 86400)") }
                o.exitAfter = s
            case "-h", "--help":
                print(usage)
                exit(0)
            default: throw UsageError("unknown argument \(a)")
            }
            i += 1
        }
        guard !o.url.isEmpty else { throw UsageError("--url is required") }
        for (flag, key) in [("--name", o.name), ("--room", o.room)] {
            guard !key.isEmpty, key.utf8.count <= 100, !key.contains(where: { ".#$[]/".contains($0) || $0.asciiValue.map { $0 < 32 || $0 == 127 } == true })
            else { throw UsageError("\(flag) must be 1 to 100 bytes without . # $ [ ] / or control characters") }
        }
        return o
    }
}

struct UsageError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Lines to stdout, whole and unbuffered (so a script reading a pipe sees them as they happen).
enum Out {
    static let lock = NSLock()
    static func line(_ s: String) {
        lock.withLock { FileHandle.standardOutput.write(Data((s + "\n").utf8)) }
    }
}

final class Chat: @unchecked Sendable {
    let options: Options
    let db: Database
    let messages: DatabaseReference
    let members: DatabaseReference
    /// Every SDK callback runs here, one at a time (so the state below needs no lock).
    let queue = DispatchQueue(label: "chat.callbacks")
    /// Who is online as the server last said, and the list last printed.
    private var online: [String]?
    private var shown: [String]?
    private var connected: Bool?
    /// Set (on `queue`) when the chat starts leaving: callbacks after that print nothing (shutting
    /// the database down ends the connection and applies this chat's onDisconnect writes to its
    /// local view, which would otherwise show as "offline" and an emptied list after "bye").
    private var leaving = false
    private let finishing = NSLock()
    private var finished = false
    /// Kept for the life of the program.
    var signalSources: [any DispatchSourceSignal] = []

    init(_ options: Options) throws {
        self.options = options
        db = try Database(url: options.url, nodes: options.nodes, authToken: options.token, callbackQueue: queue)
        if options.persistence {
            // Set before the first use. One cache per name: two chats on one machine (ada and
            // bob) each keep their own.
            let base = options.cache.map { URL(fileURLWithPath: $0) }
                ?? (FileManager.default.urls(for: .applicationSupportDirectory, in: .userDomainMask).first ?? URL(fileURLWithPath: NSTemporaryDirectory()))
                .appendingPathComponent("banyan-chat")
            db.isPersistenceEnabled = true
            db.persistenceDirectory = base.appendingPathComponent(options.name)
        }
        let room = db.reference(withPath: "rooms").child(options.room)
        messages = room.child("messages")
        members = room.child("members")
    }

    func start() {
        Out.line("* \(options.name) in room \(options.room) at \(options.url)\(options.persistence ? "" : " (no offline cache)")")
        // The cache is opened on the database's first use, on its own thread.
        queue.asyncAfter(deadline: .now() + 1) { [self] in
            if let error = db.persistenceError { Out.line("* no offline cache: \(error)") }
        }

        db.reference(withPath: ".info/connected").observe(.value) { [self] snapshot in
            guard !leaving else { return }
            let now = snapshot.value as? Bool ?? false
            guard now != connected else { return }
            let before = connected
            connected = now
            if now {
                Out.line("* connected")
                announce()
                showPresence()
            } else if before != nil {
                shown = nil
                Out.line("* offline: messages you send are kept and go out when the connection is back")
            }
        }

        // With the offline cache, the room's messages are kept synced: the SDK caches the data of
        // whole locations (not of a limited query's window), so this is what lets the next start
        // show the room before it connects. (It keeps the whole room's history; a busy room would
        // cache a smaller location, such as one for each day.)
        if options.persistence { messages.keepSynced(true) }

        // The last messages, then each new one (a toLast window: the SDK keeps it filled).
        messages.queryLimited(toLast: UInt(options.history)).observe(.childAdded, with: { [self] snapshot in
            guard !leaving else { return }
            Out.line(Self.format(snapshot))
        }, withCancel: { [self] error in
            guard !leaving else { return }
            Out.line("! cannot read the room: \(error)")
        })

        members.observe(.value) { [self] snapshot in
            guard !leaving else { return }
            online = snapshot.children.filter { $0.childSnapshot(forPath: "connections").hasChildren() }.compactMap(\.key).sorted()
            showPresence()
        }
    }

    /// Prints who is online when it changed, while connected (offline, the cached list may be
    /// stale; it is shown again once the connection is back).
    private func showPresence() {
        guard connected == true, let online, online != shown else { return }
        shown = online
        Out.line("online: " + online.joined(separator: ", "))
    }

    /// The presence recipe, run on every (re)connection: this chat's entry under its name,
    /// removed by the server when the connection ends, and the name's last-online time then.
    /// The onDisconnect writes are registered before the entry is written, so a connection that
    /// ends in between leaves nothing behind.
    private func announce() {
        let me = members.child(options.name)
        let connection = me.child("connections").childByAutoId()
        connection.onDisconnectRemoveValue()
        me.child("lastOnline").onDisconnectSetValue(ServerValue.timestamp())
        connection.setValue(ServerValue.timestamp()) { error, _ in
            if let error { Out.line("! presence not recorded: \(error)") }
        }
    }

    func send(_ text: String) {
        messages.childByAutoId().setValue(["name": options.name, "text": text, "at": ServerValue.timestamp()]) { error, _ in
            if let error { Out.line("! not sent (\(text)): \(error)") }
        }
    }

    func who() {
        queue.async { [self] in Out.line("online: " + (online ?? []).joined(separator: ", ")) }
    }

    static func format(_ snapshot: DataSnapshot) -> String {
        let name = snapshot.childSnapshot(forPath: "name").value as? String ?? "?"
        let text = snapshot.childSnapshot(forPath: "text").value as? String ?? ""
        var time = "--:--:--"
        if let at = snapshot.childSnapshot(forPath: "at").value as? Int {
            let formatter = DateFormatter()
            formatter.dateFormat = "HH:mm:ss"
            time = formatter.string(from: Date(timeIntervalSince1970: Double(at) / 1000))
        }
        return "[\(time)] \(name): \(text)"
    }

    /// Waits (at most 5 s) for sent messages to be answered, closes the connection (the server
    /// then removes this chat from the presence list) and exits.
    func finish() -> Never {
        finishing.lock()
        if finished {
            finishing.unlock()
            while true { sleep(1) }
        }
        finished = true
        finishing.unlock()
        let deadline = Date().addingTimeInterval(5)
        while db.pendingWriteCount > 0 && Date() < deadline { usleep(50_000) }
        let left = db.pendingWriteCount
        if left > 0 {
            Out.line(
                "* \(left) write\(left == 1 ? "" : "s") not yet sent: "
                    + (db.isPersistenceEnabled && db.persistenceError == nil ? "kept in the cache and sent at the next start" : "lost (no offline cache)"))
        }
        queue.sync { leaving = true }
        db.shutdown()
        // Callbacks already queued run (and print nothing) before the last line.
        queue.sync {}
        Out.line("* bye")
        exit(0)
    }
}

/// The program: parse, start, send the scripted lines, then read stdin or wait for the time to
/// leave. (Outside main.swift's top level, so nothing here is tied to the main actor.)
enum ChatProgram {
    static func run() -> Never {
        let options: Options
        do {
            options = try Options.parse(Array(CommandLine.arguments.dropFirst()))
        } catch {
            FileHandle.standardError.write(Data("banyan-chat: \(error)\n\n\(Options.usage)\n".utf8))
            exit(2)
        }
        let chat: Chat
        do {
            chat = try Chat(options)
        } catch {
            FileHandle.standardError.write(Data("banyan-chat: \(error)\n".utf8))
            exit(2)
        }
        chat.start()
        for line in options.say { chat.send(line) }

        // Ctrl-C and SIGTERM leave cleanly.
        for sig in [SIGINT, SIGTERM] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { chat.finish() }
            source.resume()
            chat.signalSources.append(source)
        }

        if let seconds = options.exitAfter {
            DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { chat.finish() }
            dispatchMain()
        }
        while let line = readLine() {
            let text = line.trimmingCharacters(in: .whitespaces)
            switch text {
            case "": continue
            case "/quit": chat.finish()
            case "/who": chat.who()
            case "/offline":
                chat.db.goOffline()
            case "/online":
                chat.db.goOnline()
            default: chat.send(text)
            }
        }
        chat.finish()
    }
}
