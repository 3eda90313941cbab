import BanyanClient
import BanyanServer
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// The examples of Firebase's two iOS database guides, "Read and write data" (saving data:
/// `setValue`, fan-out with `updateChildValues`, completion blocks, deletes, the star-count
/// transaction, `ServerValue.increment`, offline writes) and "Work with lists of data"
/// (`childByAutoId`, child events on a post's comments, sorting and filtering), written again
/// against the Swift SDK with the same data shapes (users, posts, user-posts, post-comments) and
/// checked against an in-process node, with a second client where the guides talk about other
/// users. Each test asserts what the guide says the example does.
@Suite(.serialized) struct FirebaseGuideTests {
    typealias R = DatabaseTests.Recorder

    static func database(_ port: Int, token: String? = "owner") throws -> Database {
        try Database(url: "http://127.0.0.1:\(port)?ns=guide", authToken: token)
    }

    static func json(_ value: Any?) -> String { DatabaseTests.json(value) }

    @discardableResult
    static func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T { try await DatabaseTests.bounded(60, body) }

    /// Waits (bounded) until the last recorded item is `expected`.
    static func settles(_ r: R, on expected: String, seconds: Double = 60) async -> Bool {
        await r.wait(seconds: seconds) { _ in r.all.last == expected }
    }

    /// The guides' social-blogging post.
    static func post(uid: String, author: String, title: String, body: String) -> [String: Any] {
        ["uid": uid, "author": author, "title": title, "body": body]
    }

    /// The guide's `writeNewPost`: one push id, the post written to `/posts/<key>` and to
    /// `/user-posts/<uid>/<key>/` in one atomic multi-path update (the data fan-out).
    @discardableResult
    static func writeNewPost(_ ref: DatabaseReference, userID: String, username: String, title: String, body: String) async throws -> String {
        let key = try #require(ref.child("posts").childByAutoId().key)
        try await bounded {
            let post = Self.post(uid: userID, author: username, title: title, body: body)
            let childUpdates: [String: Any] = ["/posts/\(key)": post, "/user-posts/\(userID)/\(key)/": post]
            try await ref.updateChildValues(childUpdates)
        }
        return key
    }

    // MARK: - Read and write data ("save data")

    struct User: Codable, Equatable {
        var username: String
        var email: String?
    }

    @Test("setValue writes a user object; a child path updates one field without rewriting it; setValue on the object replaces it whole; reads by getData, single events and Codable")
    func basicWrites() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            let other = try Self.database(port)
            defer {
                db.shutdown()
                other.shutdown()
            }
            let ref = db.reference()
            let uid = "ada-uid"
            let seen = R()
            ref.child("users").child(uid).observe(.value) { s in seen.add(Self.json(s.value)) }
            #expect(await seen.wait { $0 == "null" })

            // (In an async function the plain call is the async form; a nil block is the
            // guide's fire-and-forget call.)
            ref.child("users").child(uid).setValue(["username": "ada"], withCompletionBlock: nil)
            #expect(await Self.settles(seen, on: #"{"username":"ada"}"#), "\(seen.all)")
            // Another field, then the username alone: the object keeps its other children.
            try await Self.bounded { try await ref.child("users/\(uid)/email").setValue("ada@example.com") }
            ref.child("users/\(uid)/username").setValue("countess", withCompletionBlock: nil)
            #expect(await Self.settles(seen, on: #"{"email":"ada@example.com","username":"countess"}"#), "\(seen.all)")
            // setValue on the user replaces everything there, children included.
            try await Self.bounded { try await ref.child("users").child(uid).setValue(["username": "lovelace"]) }
            #expect(await Self.settles(seen, on: #"{"username":"lovelace"}"#), "\(seen.all)")

            // Reading once: getData from the server, and a single value event.
            let name = try await Self.bounded { try await other.reference().child("users/\(uid)/username").getData() }
            #expect(name.value as? String == "lovelace" && name.key == "username")
            let once = try await Self.bounded { try await other.reference(withPath: "users/\(uid)").observeSingleEvent(of: .value) }
            #expect(Self.json(once.value) == #"{"username":"lovelace"}"#)

            // Codable objects write and read through their JSON form.
            let user = User(username: "ada", email: "ada@example.com")
            try await Self.bounded { try await ref.child("users").child(uid).setValue(from: user) }
            let back = try await Self.bounded { try await other.reference(withPath: "users/\(uid)").getData() }
            #expect(try back.data(as: User.self) == user)
            #expect(await Self.settles(seen, on: #"{"email":"ada@example.com","username":"ada"}"#), "\(seen.all)")
        }
    }

    @Test("a completion block runs once the write is committed, with no error; a write the rules refuse gets its error there and the local value rolls back")
    func completionBlocks() async throws {
        try await DatabaseTests.withNode { port in
            // Rules: anyone reads and writes, but a username must be a string under 20 characters.
            var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(port)/.settings/rules.json?ns=guide&auth=owner")))
            request.httpMethod = "PUT"
            request.httpBody = Data(
                #"{"rules":{".read":true,".write":true,"users":{"$uid":{"username":{".validate":"newData.isString() && newData.val().length < 20"}}}}}"#.utf8)
            #expect(try await DatabaseTests.status(request) == 200)

            let db = try Self.database(port, token: nil)
            defer { db.shutdown() }
            let user = db.reference().child("users").child("ada-uid")
            let seen = R()
            user.observe(.value) { s in seen.add("value " + Self.json(s.value)) }
            #expect(await seen.wait { $0 == "value null" })
            let done = R()
            user.setValue(["username": "ada"]) { error, ref in
                done.add(error.map { "error \($0)" } ?? "saved \(ref.key ?? "")")
            }
            #expect(await done.wait { $0 == "saved ada-uid" }, "\(done.all)")
            #expect(done.all == ["saved ada-uid"])

            user.child("username").setValue("a name far too long for the rule") { error, _ in
                done.add("refused " + ((error as? DatabaseError)?.code ?? "nothing"))
            }
            #expect(await done.wait { $0 == "refused permission_denied" }, "\(done.all)")
            // The local event showed the write at once, then the server's refusal undid it.
            #expect(seen.all.contains(#"value {"username":"a name far too long for the rule"}"#), "\(seen.all)")
            #expect(await Self.settles(seen, on: #"value {"username":"ada"}"#), "\(seen.all)")
        }
    }

    @Test("updateChildValues fans a new post out to /posts and /user-posts atomically: another client never sees one copy without the other")
    func fanOutUpdate() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            let other = try Self.database(port)
            defer {
                db.shutdown()
                other.shutdown()
            }
            // The other client watches the whole tree and notes, for each value event, which of
            // the two copies of each post it shows.
            let views = R()
            let watched = R()
            other.reference().observe(.value) { s in
                let posts = s.childSnapshot(forPath: "posts")
                let mine = s.childSnapshot(forPath: "user-posts/ada-uid")
                let keys = Set(posts.children.compactMap(\.key)).union(mine.children.compactMap(\.key))
                for key in keys.sorted() { views.add("\(key) \(posts.hasChild(key)) \(mine.hasChild(key))") }
                watched.add("\(posts.childrenCount) \(mine.childrenCount)")
            }
            #expect(await watched.wait { $0 == "0 0" })

            let ref = db.reference()
            var keys: [String] = []
            for i in 1...5 {
                keys.append(try await Self.writeNewPost(ref, userID: "ada-uid", username: "ada", title: "Post \(i)", body: "Body \(i)"))
            }
            #expect(await watched.wait { $0 == "5 5" }, "\(watched.all)")
            #expect(views.all.allSatisfy { $0.hasSuffix("true true") }, "\(views.all)")
            // The same post in both places, under the same key.
            let key = try #require(keys.last)
            let a = try await Self.bounded { try await other.reference(withPath: "posts/\(key)").getData() }
            let b = try await Self.bounded { try await other.reference(withPath: "user-posts/ada-uid/\(key)").getData() }
            #expect(Self.json(a.value) == #"{"author":"ada","body":"Body 5","title":"Post 5","uid":"ada-uid"}"#)
            #expect(Self.json(a.value) == Self.json(b.value))

            // The completion-block form of the same update.
            let done = R()
            let key6 = try #require(ref.child("posts").childByAutoId().key)
            let post = Self.post(uid: "ada-uid", author: "ada", title: "Post 6", body: "Body 6")
            ref.updateChildValues(["/posts/\(key6)": post, "/user-posts/ada-uid/\(key6)/": post]) { error, _ in
                done.add(error.map { "\($0)" } ?? "ok")
            }
            #expect(await done.wait { $0 == "ok" })
            #expect(await watched.wait { $0 == "6 6" }, "\(watched.all)")
        }
    }

    @Test("deleting: removeValue, setValue(nil), and several locations at once with nulls in updateChildValues")
    func deletes() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            defer { db.shutdown() }
            let ref = db.reference()
            let k1 = try await Self.writeNewPost(ref, userID: "ada-uid", username: "ada", title: "One", body: "1")
            let k2 = try await Self.writeNewPost(ref, userID: "ada-uid", username: "ada", title: "Two", body: "2")
            try await Self.bounded { try await ref.child("users/ada-uid").setValue(["username": "ada"]) }

            try await Self.bounded { try await ref.child("users/ada-uid").removeValue() }
            #expect(try await Self.bounded { try await ref.child("users/ada-uid").getData().exists() } == false)
            try await Self.bounded { try await ref.child("posts/\(k1)").setValue(nil) }
            #expect(try await Self.bounded { try await ref.child("posts").getData().childrenCount } == 1)
            // Both copies of a post, and the rest of the first one's, in one atomic update.
            try await Self.bounded {
                try await ref.updateChildValues(["posts/\(k2)": NSNull(), "user-posts/ada-uid/\(k2)": NSNull(), "user-posts/ada-uid/\(k1)": NSNull()])
            }
            let all = try await Self.bounded { try await ref.getData() }
            #expect(!all.exists(), "\(Self.json(all.value))")
        }
    }

    @Test("detaching listeners: removeObserver(withHandle:) stops one observer; removeAllObservers stops every observer of the location")
    func detachListeners() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            defer { db.shutdown() }
            let postRef = db.reference(withPath: "posts/p1")
            let first = R()
            let second = R()
            let handle = postRef.observe(.value) { s in first.add(Self.json(s.value)) }
            postRef.observe(.value) { s in second.add(Self.json(s.value)) }
            try await Self.bounded { try await postRef.setValue(["title": "a"]) }
            #expect(await first.wait { $0 == #"{"title":"a"}"# })
            #expect(await second.wait { $0 == #"{"title":"a"}"# })

            postRef.removeObserver(withHandle: handle)
            try await Self.bounded { try await postRef.setValue(["title": "b"]) }
            #expect(await second.wait { $0 == #"{"title":"b"}"# })
            #expect(!first.all.contains(#"{"title":"b"}"#), "\(first.all)")

            postRef.removeAllObservers()
            let count = second.all.count
            try await Self.bounded { try await postRef.setValue(["title": "c"]) }
            // A fresh observer sees the write, so the detached ones had their chance.
            let third = R()
            postRef.observe(.value) { s in third.add(Self.json(s.value)) }
            #expect(await third.wait { $0 == #"{"title":"c"}"# })
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(second.all.count == count, "\(second.all)")
        }
    }

    /// The guide's star toggle: the user's id in `stars` and `starCount` changed together, in a
    /// transaction, so concurrent stars from several users are all counted.
    static func toggleStar(_ postRef: DatabaseReference, uid: String) async throws -> (Bool, DataSnapshot) {
        try await bounded {
            try await postRef.runTransactionBlock { currentData in
                if var post = currentData.value as? [String: Any] {
                    var stars = post["stars"] as? [String: Bool] ?? [:]
                    var starCount = post["starCount"] as? Int ?? 0
                    if stars[uid] != nil {
                        // Unstar the post and remove the user from its stars.
                        starCount -= 1
                        stars.removeValue(forKey: uid)
                    } else {
                        // Star the post and add the user to its stars.
                        starCount += 1
                        stars[uid] = true
                    }
                    post["starCount"] = starCount
                    post["stars"] = stars
                    currentData.value = post
                    return .success(withValue: currentData)
                }
                // No data known yet (the first run, before the location is synced): the server
                // finds the guess stale and the block runs again on its data.
                return .success(withValue: currentData)
            }
        }
    }

    @Test("runTransactionBlock toggles a star: clients starring together are all counted; a second toggle unstars; the completion reports committed with the data")
    func starTransaction() async throws {
        try await DatabaseTests.withNode { port in
            let users = ["ada", "bob", "cy", "dee"]
            let clients = try users.map { _ in try Self.database(port) }
            defer { clients.forEach { $0.shutdown() } }
            let key = try await Self.writeNewPost(clients[0].reference(), userID: "ada-uid", username: "ada", title: "Stars", body: "Star me")

            // Every user stars the post at once, each from their own client (none has the post
            // synced, so every first run sees nothing and reruns on the server's data).
            try await withThrowingTaskGroup(of: (Bool, DataSnapshot).self) { group in
                for (db, uid) in zip(clients, users) {
                    group.addTask { try await Self.toggleStar(db.reference(withPath: "posts/\(key)"), uid: uid) }
                }
                for try await (committed, snapshot) in group {
                    #expect(committed)
                    #expect((snapshot.childSnapshot(forPath: "starCount").value as? Int ?? 0) >= 1)
                }
            }
            let starred = try await Self.bounded { try await clients[1].reference(withPath: "posts/\(key)").getData() }
            #expect(starred.childSnapshot(forPath: "starCount").value as? Int == users.count)
            #expect(Self.json(starred.childSnapshot(forPath: "stars").value) == #"{"ada":true,"bob":true,"cy":true,"dee":true}"#)
            #expect(starred.childSnapshot(forPath: "title").value as? String == "Stars", "the rest of the post stays")

            // Toggling again unstars.
            let (committed, after) = try await Self.toggleStar(clients[2].reference(withPath: "posts/\(key)"), uid: "cy")
            #expect(committed)
            #expect(after.childSnapshot(forPath: "starCount").value as? Int == users.count - 1)
            #expect(!after.hasChild("stars/cy") && after.hasChild("stars/dee"))

            // The completion-block form, on the user-posts copy.
            let done = R()
            clients[3].reference(withPath: "user-posts/ada-uid/\(key)").runTransactionBlock({ data in
                var post = data.value as? [String: Any] ?? [:]
                post["starCount"] = (post["starCount"] as? Int ?? 0) + 1
                data.value = post
                return .success(withValue: data)
            }, andCompletionBlock: { error, committed, snapshot in
                done.add("\(error.map { "\($0)" } ?? "nil") \(committed) \(snapshot?.childSnapshot(forPath: "starCount").value as? Int ?? -1)")
            })
            #expect(await done.wait { $0 == "nil true 1" }, "\(done.all)")
        }
    }

    @Test("ServerValue.increment stars a post with one multi-path update, no transaction: concurrent stars all count, in both copies")
    func serverIncrementStars() async throws {
        try await DatabaseTests.withNode { port in
            let a = try Self.database(port)
            let b = try Self.database(port)
            defer {
                a.shutdown()
                b.shutdown()
            }
            let postID = try await Self.writeNewPost(a.reference(), userID: "ada-uid", username: "ada", title: "Count", body: "Increment me")
            let stargazers = (1...12).map { "user\($0)" }
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (i, userID) in stargazers.enumerated() {
                    let db = i.isMultiple(of: 2) ? a : b
                    group.addTask {
                        try await Self.bounded {
                            let updates: [String: Any] = [
                                "posts/\(postID)/stars/\(userID)": true,
                                "posts/\(postID)/starCount": ServerValue.increment(1),
                                "user-posts/ada-uid/\(postID)/stars/\(userID)": true,
                                "user-posts/ada-uid/\(postID)/starCount": ServerValue.increment(1),
                            ]
                            try await db.reference().updateChildValues(updates)
                        }
                    }
                }
                try await group.waitForAll()
            }
            for path in ["posts/\(postID)", "user-posts/ada-uid/\(postID)"] {
                let post = try await Self.bounded { try await a.reference(withPath: path).getData() }
                #expect(post.childSnapshot(forPath: "starCount").value as? Int == stargazers.count, "\(path)")
                #expect(post.childSnapshot(forPath: "stars").childrenCount == UInt(stargazers.count))
            }
        }
    }

    @Test("writing offline: the local view changes at once and the completion waits; back online the write reaches the server; onDisconnect keeps presence and last-seen")
    func offlineWritesAndPresence() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            let other = try Self.database(port)
            defer {
                db.shutdown()
                other.shutdown()
            }
            let connected = R()
            db.reference(withPath: ".info/connected").observe(.value) { s in connected.add("\(s.value as? Bool ?? false)") }
            #expect(await connected.wait { $0 == "true" })

            // The presence recipe: this device in the user's connections, removed when its
            // connection ends; the user's last-seen time set by the server then.
            let myConnections = db.reference(withPath: "users/morgan/connections")
            let lastOnline = db.reference(withPath: "users/morgan/lastOnline")
            let device = myConnections.childByAutoId()
            try await Self.bounded { try await device.onDisconnectRemoveValue() }
            try await Self.bounded { try await lastOnline.onDisconnectSetValue(ServerValue.timestamp()) }
            try await Self.bounded { try await device.setValue(true) }

            let watched = R()
            other.reference(withPath: "users/morgan").observe(.value) { s in
                watched.add("\(s.childSnapshot(forPath: "connections").childrenCount) \(s.hasChild("lastOnline"))")
            }
            #expect(await watched.wait { $0 == "1 false" }, "\(watched.all)")

            // Offline: the write shows locally at once, its completion waits for the server.
            let profile = db.reference(withPath: "users/morgan/status")
            let local = R()
            profile.observe(.value) { s in local.add(Self.json(s.value)) }
            #expect(await local.wait { $0 == "null" })
            db.goOffline()
            #expect(await connected.wait { $0 == "false" })
            // Going offline ended the connection: the server ran the onDisconnect writes.
            #expect(await watched.wait { $0 == "0 true" }, "\(watched.all)")
            let done = R()
            profile.setValue("writing offline") { error, _ in done.add(error.map { "\($0)" } ?? "ok") }
            #expect(await local.wait { $0 == #""writing offline""# })
            try await Task.sleep(nanoseconds: 300_000_000)
            #expect(done.all.isEmpty)
            #expect(try await Self.bounded { try await other.reference(withPath: "users/morgan/status").getData().exists() } == false)

            db.goOnline()
            #expect(await done.wait { $0 == "ok" }, "\(done.all)")
            let there = try await Self.bounded { try await other.reference(withPath: "users/morgan/status").getData() }
            #expect(there.value as? String == "writing offline")
            let seen = try await Self.bounded { try await other.reference(withPath: "users/morgan/lastOnline").getData() }
            #expect((seen.value as? Int ?? 0) > 1_700_000_000_000)
        }
    }

    // MARK: - Work with lists of data

    @Test("childByAutoId appends: unique keys in chronological order, from several clients at once without conflicts")
    func appendToList() async throws {
        try await DatabaseTests.withNode { port in
            let a = try Self.database(port)
            let b = try Self.database(port)
            defer {
                a.shutdown()
                b.shutdown()
            }
            let postsA = a.reference(withPath: "posts")
            var mine: [String] = []
            for i in 0..<10 {
                let newPost = postsA.childByAutoId()
                let key = try #require(newPost.key)
                #expect(key.count == 20)
                mine.append(key)
                try await Self.bounded { try await newPost.setValue(["title": "a\(i)"]) }
            }
            #expect(mine == mine.sorted(), "push ids sort in the order they were made")
            #expect(Set(mine).count == mine.count)
            // Two clients appending together: every child lands, none overwrites another.
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (db, name) in [(a, "a"), (b, "b")] {
                    group.addTask {
                        for i in 0..<15 { try await Self.bounded { try await db.reference(withPath: "posts").childByAutoId().setValue(["title": "\(name)-\(i)"]) } }
                    }
                }
                try await group.waitForAll()
            }
            let list = try await Self.bounded { try await b.reference(withPath: "posts").getData() }
            #expect(list.childrenCount == 40)
            // Children come in key order, which is each writer's own order.
            let titles = list.children.compactMap { $0.childSnapshot(forPath: "title").value as? String }
            for name in ["a", "b"] {
                let own = titles.filter { $0.hasPrefix("\(name)-") }
                #expect(own == (0..<15).map { "\(name)-\($0)" }, "\(own)")
            }
        }
    }

    /// The guide's comments table: a list of comment snapshots kept in step with child events.
    final class CommentsTable: @unchecked Sendable {
        private let lock = NSLock()
        private var comments: [(key: String, text: String, author: String)] = []
        var rows: [String] { lock.withLock { comments.map { "\($0.key):\($0.author):\($0.text)" } } }
        func insert(_ s: DataSnapshot) {
            lock.withLock { comments.append((s.key ?? "", s.childSnapshot(forPath: "text").value as? String ?? "", s.childSnapshot(forPath: "author").value as? String ?? "")) }
        }
        func change(_ s: DataSnapshot) {
            lock.withLock {
                guard let i = comments.firstIndex(where: { $0.key == s.key }) else { return }
                comments[i] = (s.key ?? "", s.childSnapshot(forPath: "text").value as? String ?? "", s.childSnapshot(forPath: "author").value as? String ?? "")
            }
        }
        func remove(_ s: DataSnapshot) { lock.withLock { comments.removeAll { $0.key == s.key } } }
    }

    @Test("child events on a post's comments: childAdded for each existing comment and each new one, childChanged for an edit, childRemoved for a delete; the table follows")
    func childEventsOnComments() async throws {
        try await DatabaseTests.withNode { port in
            let writer = try Self.database(port)
            let reader = try Self.database(port)
            defer {
                writer.shutdown()
                reader.shutdown()
            }
            let postID = "post-1"
            let comments = writer.reference(withPath: "post-comments/\(postID)")
            let first = comments.childByAutoId()
            try await Self.bounded { try await first.setValue(["text": "First!", "author": "bob"]) }

            let table = CommentsTable()
            let events = R()
            let commentsRef = reader.reference(withPath: "post-comments").child(postID)
            commentsRef.observe(.childAdded, andPreviousSiblingKeyWith: { s, previous in
                table.insert(s)
                events.add("added \(s.key ?? "") after \(previous ?? "-")")
            })
            commentsRef.observe(.childChanged) { s in
                table.change(s)
                events.add("changed \(s.key ?? "")")
            }
            commentsRef.observe(.childRemoved) { s in
                table.remove(s)
                events.add("removed \(s.key ?? "") \(s.childSnapshot(forPath: "text").value as? String ?? "")")
            }
            let k1 = try #require(first.key)
            #expect(await events.wait { $0 == "added \(k1) after -" }, "\(events.all)")

            let second = comments.childByAutoId()
            let k2 = try #require(second.key)
            try await Self.bounded { try await second.setValue(["text": "Nice post", "author": "cy"]) }
            #expect(await events.wait { $0 == "added \(k2) after \(k1)" }, "\(events.all)")
            try await Self.bounded { try await comments.child(k1).updateChildValues(["text": "First! (edited)"]) }
            #expect(await events.wait { $0 == "changed \(k1)" }, "\(events.all)")
            #expect(table.rows == ["\(k1):bob:First! (edited)", "\(k2):cy:Nice post"], "\(table.rows)")
            try await Self.bounded { try await comments.child(k1).removeValue() }
            // The removed child's snapshot holds the data it had.
            #expect(await events.wait { $0 == "removed \(k1) First! (edited)" }, "\(events.all)")
            #expect(table.rows == ["\(k2):cy:Nice post"], "\(table.rows)")
            #expect(events.all.count == 4, "each change raised one event: \(events.all)")
        }
    }

    @Test("childMoved on an ordered list: a post whose star count passes another's moves, with the key it now follows")
    func childMoved() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            defer { db.shutdown() }
            let posts = db.reference(withPath: "user-posts/ada-uid")
            try await Self.bounded { try await posts.setValue(["p1": ["starCount": 1], "p2": ["starCount": 2], "p3": ["starCount": 3]]) }
            let moves = R()
            let byStars = posts.queryOrdered(byChild: "starCount")
            byStars.observe(.childMoved, andPreviousSiblingKeyWith: { s, previous in moves.add("moved \(s.key ?? "") after \(previous ?? "-")") })
            byStars.observe(.value) { s in moves.add("order " + s.children.compactMap(\.key).joined(separator: ",")) }
            #expect(await moves.wait { $0 == "order p1,p2,p3" })
            try await Self.bounded { try await posts.child("p1/starCount").setValue(5) }
            #expect(await moves.wait { $0 == "order p2,p3,p1" }, "\(moves.all)")
            #expect(moves.all.contains("moved p1 after p3"), "\(moves.all)")
        }
    }

    @Test("value events on a list: one snapshot of the whole list, its children iterated in order")
    func valueEventsOnList() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            defer { db.shutdown() }
            let comments = db.reference(withPath: "post-comments/post-1")
            for text in ["one", "two", "three"] { try await Self.bounded { try await comments.childByAutoId().setValue(["text": text]) } }
            let snapshot = try await Self.bounded { try await comments.observeSingleEvent(of: .value) }
            var texts: [String] = []
            for child in snapshot.children { texts.append(child.childSnapshot(forPath: "text").value as? String ?? "") }
            #expect(texts == ["one", "two", "three"])
            #expect(snapshot.childrenCount == 3 && snapshot.hasChildren())
        }
    }

    @Test("sorting: queryOrdered(byChild:) on a user's posts by star count, by a nested child (metrics/views), queryOrderedByKey and queryOrderedByValue, with Firebase's ordering of mixed values")
    func sorting() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            defer { db.shutdown() }
            let ref = db.reference()
            try await Self.bounded {
                try await ref.child("user-posts/ada-uid").setValue([
                    "p1": ["title": "one", "starCount": 7], "p2": ["title": "two", "starCount": 2], "p3": ["title": "three", "starCount": 11],
                ])
            }
            // The guide's "my top posts": the user's posts by star count.
            let myTopPostsQuery = ref.child("user-posts").child("ada-uid").queryOrdered(byChild: "starCount")
            let top = try await Self.bounded { try await myTopPostsQuery.getData() }
            #expect(top.children.compactMap(\.key) == ["p2", "p1", "p3"])
            // The same as a live observer: its first value event lists the children in order.
            let live = R()
            myTopPostsQuery.observe(.childAdded) { s in live.add(s.key ?? "") }
            #expect(await live.wait { _ in live.all.count == 3 })
            #expect(live.all == ["p2", "p1", "p3"])

            // Ordering by a nested child: the most viewed posts.
            try await Self.bounded {
                try await ref.child("posts").setValue([
                    "ts-functions": ["metrics": ["views": 1_200_000, "likes": 251_000, "shares": 1_200], "title": "Why you should use TypeScript for writing Cloud Functions", "author": "Doug"],
                    "android-arch-3": ["metrics": ["views": 81_000, "likes": 5_000, "shares": 48], "title": "Android Architecture Components: Room", "author": "Doug"],
                    "no-metrics": ["title": "A draft", "author": "Ada"],
                ])
            }
            let mostViewed = try await Self.bounded { try await ref.child("posts").queryOrdered(byChild: "metrics/views").getData() }
            #expect(mostViewed.children.compactMap(\.key) == ["no-metrics", "android-arch-3", "ts-functions"], "a missing child (null) sorts first")

            // By key: integer-like keys first in numeric order, then the others as strings.
            try await Self.bounded { try await ref.child("keys").setValue(["b": 1, "10": 1, "a": 1, "2": 1, "1": 1, "-5": 1]) }
            let byKey = try await Self.bounded { try await ref.child("keys").queryOrderedByKey().getData() }
            #expect(byKey.children.compactMap(\.key) == ["-5", "1", "2", "10", "a", "b"])

            // By value, and Firebase's order of mixed values: null, false, true, numbers,
            // strings, objects; ties by key.
            try await Self.bounded {
                try await ref.child("mixed").setValue([
                    "s2": "b", "obj": ["x": 1], "n1": 3, "t": true, "s1": "a", "f": false, "n0": -1.5, "n2": 3,
                ])
            }
            let byValue = try await Self.bounded { try await ref.child("mixed").queryOrderedByValue().getData() }
            #expect(byValue.children.compactMap(\.key) == ["f", "t", "n0", "n1", "n2", "s1", "s2", "obj"])
            let byChild = try await Self.bounded { try await ref.child("user-posts/ada-uid").queryOrdered(byChild: "title").getData() }
            #expect(byChild.children.compactMap(\.key) == ["p1", "p3", "p2"])

            // Only one order per query: a second one is an error the query carries.
            let twice = ref.child("posts").queryOrdered(byChild: "a").queryOrderedByKey()
            #expect(twice.queryError?.code == "invalid_query")
        }
    }

    @Test("filtering: queryLimited(toFirst:) and (toLast:) with the window following changes; queryStarting/Ending(at/after/before) and queryEqual, with child keys for paging")
    func filtering() async throws {
        try await DatabaseTests.withNode { port in
            let db = try Self.database(port)
            let other = try Self.database(port)
            defer {
                db.shutdown()
                other.shutdown()
            }
            let ref = db.reference()
            // 120 posts with push ids: the guide's "recent posts" takes the first 100.
            var keys: [String] = []
            for _ in 0..<120 { keys.append(try #require(ref.child("posts").childByAutoId().key)) }
            let pushed = keys
            try await Self.bounded {
                var batch: [String: Any] = [:]
                for (i, key) in pushed.enumerated() { batch[key] = ["title": "post \(i)", "starCount": i % 7] }
                try await ref.child("posts").setValue(batch)
            }
            let recentPostsQuery = ref.child("posts").queryLimited(toFirst: 100)
            let recent = try await Self.bounded { try await recentPostsQuery.getData() }
            #expect(recent.childrenCount == 100 && recent.children.compactMap(\.key) == Array(keys.prefix(100)))
            let newest = try await Self.bounded { try await ref.child("posts").queryLimited(toLast: 3).getData() }
            #expect(newest.children.compactMap(\.key) == Array(keys.suffix(3)))

            // A live toLast window: a new post enters at the end and the oldest of the window
            // leaves it.
            let window = R()
            let last3 = other.reference(withPath: "posts").queryLimited(toLast: 3)
            last3.observe(.childAdded) { s in window.add("added \(s.key ?? "")") }
            last3.observe(.childRemoved) { s in window.add("removed \(s.key ?? "")") }
            #expect(await window.wait { _ in window.all.count == 3 })
            let newKey = try #require(ref.child("posts").childByAutoId().key)
            try await Self.bounded { try await ref.child("posts/\(newKey)").setValue(["title": "post 120", "starCount": 0]) }
            #expect(await window.wait { $0 == "added \(newKey)" }, "\(window.all)")
            #expect(window.all.contains("removed \(keys[117])"), "\(window.all)")

            // Ranges on a child's value.
            let scores = ref.child("scores")
            try await Self.bounded {
                try await scores.setValue([
                    "p1": ["starCount": 1], "p2": ["starCount": 3], "p3": ["starCount": 3], "p4": ["starCount": 5], "p5": ["starCount": 8], "p6": ["title": "unstarred"],
                ])
            }
            func keysOf(_ q: DatabaseQuery) async throws -> [String] { try await Self.bounded { try await q.getData() }.children.compactMap(\.key) }
            let byStars = scores.queryOrdered(byChild: "starCount")
            #expect(try await keysOf(byStars.queryStarting(atValue: 3)) == ["p2", "p3", "p4", "p5"])
            #expect(try await keysOf(byStars.queryStarting(afterValue: 3)) == ["p4", "p5"])
            #expect(try await keysOf(byStars.queryEnding(atValue: 3)) == ["p6", "p1", "p2", "p3"], "null sorts before numbers")
            #expect(try await keysOf(byStars.queryEnding(beforeValue: 3)) == ["p6", "p1"])
            #expect(try await keysOf(byStars.queryEqual(toValue: 3)) == ["p2", "p3"])
            #expect(try await keysOf(byStars.queryStarting(atValue: 2).queryEnding(atValue: 5)) == ["p2", "p3", "p4"])
            // Paging: start at the last item seen (value and key), limited.
            #expect(try await keysOf(byStars.queryStarting(atValue: 3).queryLimited(toFirst: 2)) == ["p2", "p3"])
            #expect(try await keysOf(byStars.queryStarting(atValue: 3, childKey: "p3").queryLimited(toFirst: 2)) == ["p3", "p4"])
            #expect(try await keysOf(byStars.queryStarting(afterValue: 3, childKey: "p2").queryLimited(toFirst: 2)) == ["p3", "p4"])
            #expect(try await keysOf(byStars.queryEqual(toValue: 3, childKey: "p3")) == ["p3"])
            // The highest scores: toLast on the ordered query.
            #expect(try await keysOf(byStars.queryLimited(toLast: 2)) == ["p4", "p5"])
            // Key ranges: a key prefix.
            try await Self.bounded { try await ref.child("dinos").setValue(["bruhathkayosaurus": 1, "lambeosaurus": 2, "linhenykus": 3, "pterodactyl": 4]) }
            #expect(try await keysOf(ref.child("dinos").queryOrderedByKey().queryStarting(atValue: "l").queryEnding(atValue: "l\u{f8ff}")) == ["lambeosaurus", "linhenykus"])
            #expect(try await keysOf(ref.child("dinos").queryOrderedByValue().queryStarting(atValue: 2).queryLimited(toFirst: 2)) == ["lambeosaurus", "linhenykus"])

            // Firebase refuses some combinations: the query carries the error instead of raising.
            #expect(ref.child("posts").queryLimited(toFirst: 1).queryLimited(toLast: 1).queryError?.code == "invalid_query")
            #expect(ref.child("posts").queryOrderedByKey().queryStarting(atValue: 3).queryError?.code == "invalid_query")
            #expect(byStars.queryEqual(toValue: 3).queryStarting(atValue: 1).queryError?.code == "invalid_query")
        }
    }
}
