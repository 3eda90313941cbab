import BanyanClient
import BanyanQuery
import BanyanServer
import Foundation
import Testing

/// The Firebase 2.x names (`Firebase(url:)`, `FQuery`, `FEventType`, the deprecated priority
/// queries, the class-level switches, the auth methods) against a real node: each name is
/// called at least once and its effect observed. One serialized suite: `Firebase.goOffline()`
/// and `setDispatchQueue` are process-wide.
@Suite(.serialized) struct Firebase2xTests {
    typealias R = DatabaseTests.Recorder

    struct Failed: Error, CustomStringConvertible {
        let description: String
    }

    /// A query's value once (`observeSingleEventOfType(.Value…)`), bounded.
    static func once(_ query: FQuery) async throws -> FDataSnapshot {
        try await DatabaseTests.bounded {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<FDataSnapshot, any Error>) in
                query.observeSingleEventOfType(.Value, withBlock: { c.resume(returning: $0) }, withCancelBlock: { c.resume(throwing: $0) })
            }
        }
    }

    static func keys(_ s: FDataSnapshot) -> [String] { s.children.map { $0.key ?? "" } }

    /// The children's keys of a query's value once.
    static func keysOnce(_ query: FQuery) async throws -> [String] { keys(try await once(query)) }

    /// A 2.x write with a completion block, awaited: nil or the error.
    static func completed(_ start: (@escaping Firebase.CompletionBlock) -> Void) async -> String {
        await withCheckedContinuation { (c: CheckedContinuation<String, Never>) in
            start { error, _ in c.resume(returning: error.map { ($0 as? DatabaseError)?.code ?? "\($0)" } ?? "ok") }
        }
    }

    /// `completed`, expected to give `expected` (the outcome shows when it does not).
    static func check(_ expected: String, sourceLocation: SourceLocation = #_sourceLocation, _ start: (@escaping Firebase.CompletionBlock) -> Void) async {
        let got = await completed(start)
        #expect(got == expected, sourceLocation: sourceLocation)
    }

    @Test("Firebase(url:), the reference's names, writes with completion blocks, and every FEventType observed")
    func referencesWritesAndEvents() async throws {
        try await DatabaseTests.withNode { port in
            let base = "http://127.0.0.1:\(port)"
            let ada = Firebase(url: "\(base)/users/ada?ns=fb2")
            #expect(ada.key == "ada" && ada.parent?.key == "users" && ada.root.key == nil && ada.parent?.parent?.parent == nil)
            #expect(ada.description == "\(base)/users/ada?ns=fb2" && ada.ref === ada)
            #expect(ada.childByAppendingPath("a/b").key == "b" && ada.childByAppendingPath("a/b").parent?.key == "a")
            #expect(FEventType.value == .Value && FEventType.childAdded == .ChildAdded && FEventType.childRemoved == .ChildRemoved)
            #expect(FEventType.childChanged == .ChildChanged && FEventType.childMoved == .ChildMoved && FEventType.Value.dataEventType == .value)

            // A value observer sees the write; the completion block comes with the reference.
            let values = R()
            let handle = ada.observeEventType(.Value) { s in values.add(DatabaseTests.json(s.value)) }
            #expect(await values.wait { $0 == "null" })
            await Self.check("ok") { ada.setValue(["name": "Ada"], withCompletionBlock: $0) }
            #expect(await values.wait { $0 == #"{"name":"Ada"}"# }, "\(values.all)")
            ada.childByAppendingPath("born").setValue(1815)
            #expect(await values.wait { $0 == #"{"born":1815,"name":"Ada"}"# }, "\(values.all)")
            await Self.check("ok") { ada.updateChildValues(["name": "Ada L.", "title/short": "Countess"], withCompletionBlock: $0) }
            #expect(await values.wait { $0 == #"{"born":1815,"name":"Ada L.","title":{"short":"Countess"}}"# }, "\(values.all)")
            ada.updateChildValues(["born": 1816])
            #expect(await values.wait { $0.contains(#""born":1816"#) })
            ada.removeObserverWithHandle(handle)

            // Child events on a list, with previous keys; priorities move children.
            let list = Firebase(url: "\(base)/list?ns=fb2")
            let events = R()
            list.observeEventType(.ChildAdded, andPreviousSiblingKeyWithBlock: { s, prev in events.add("added \(s.key ?? "") after \(prev ?? "-")") })
            list.observeEventType(.ChildChanged, withBlock: { s in events.add("changed \(s.key ?? "") \(DatabaseTests.json(s.value))") }, withCancelBlock: { _ in })
            list.observeEventType(.ChildRemoved, andPreviousSiblingKeyWithBlock: { s, _ in events.add("removed \(s.key ?? "")") }, withCancelBlock: { _ in })
            list.observeEventType(.ChildMoved, andPreviousSiblingKeyWithBlock: { s, prev in events.add("moved \(s.key ?? "") after \(prev ?? "-")") })
            await Self.check("ok") { list.childByAppendingPath("a").setValue("A", andPriority: 1, withCompletionBlock: $0) }
            list.childByAppendingPath("b").setValue("B", andPriority: 2)
            #expect(await events.wait { $0 == "added b after a" }, "\(events.all)")
            await Self.check("ok") { list.childByAppendingPath("a").setPriority(3, withCompletionBlock: $0) }
            #expect(await events.wait { $0 == "moved a after b" }, "\(events.all)")
            list.childByAppendingPath("b").setPriority(4)
            #expect(await events.wait { $0 == "moved b after a" }, "\(events.all)")
            list.childByAppendingPath("b").setValue("B2")
            #expect(await events.wait { $0 == #"changed b "B2""# }, "\(events.all)")
            let pushed = list.childByAutoId()
            #expect((pushed.key ?? "").count == 20)
            pushed.setValue("P")
            #expect(await events.wait { $0.hasPrefix("added \(pushed.key ?? "?")") }, "\(events.all)")
            await Self.check("ok") { list.childByAppendingPath("a").removeValueWithCompletionBlock($0) }
            #expect(await events.wait { $0 == "removed a" }, "\(events.all)")
            list.childByAppendingPath("b").removeValue()
            #expect(await events.wait { $0 == "removed b" }, "\(events.all)")
            list.removeAllObservers()
            let count = events.all.count
            list.childByAppendingPath("c").setValue("C")
            _ = try await Self.once(list)
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(events.all.count == count, "removeAllObservers stopped them: \(events.all)")

            // Single events, with and without previous keys.
            let single = R()
            list.observeSingleEventOfType(.ChildAdded) { s in single.add("first \(s.key ?? "")") }
            list.observeSingleEventOfType(.ChildAdded, andPreviousSiblingKeyWithBlock: { s, prev in single.add("first \(s.key ?? "") after \(prev ?? "-")") })
            list.queryOrderedByKey().observeSingleEventOfType(.ChildAdded, andPreviousSiblingKeyWithBlock: { s, _ in single.add("by key \(s.key ?? "")") }, withCancelBlock: { _ in })
            #expect(await single.wait { _ in single.all.count == 3 }, "\(single.all)")
            #expect(single.all.contains("by key \(pushed.key ?? "?")"), "push ids sort before letters: \(single.all)")

            // A URL that cannot be used: every call fails with invalid_url, nothing raises.
            let bad = Firebase(url: "not a url")
            #expect(bad.reference == nil && bad.key == nil && bad.parent == nil)
            await Self.check("invalid_url") { bad.setValue(1, withCompletionBlock: $0) }
            let cancelled = R()
            bad.childByAppendingPath("x").observeEventType(.Value, withBlock: { _ in cancelled.add("event") }, withCancelBlock: { e in cancelled.add("\((e as? DatabaseError)?.code ?? "")") })
            #expect(await cancelled.wait { $0 == "invalid_url" })
            // Another namespace on the same node is another database.
            #expect(Firebase(url: "\(base)/x?ns=other").reference?.database !== ada.reference?.database)
            #expect(Firebase(url: "\(base)/y?ns=fb2").reference?.database === ada.reference?.database)
        }
    }

    @Test("the 2.x query names, the deprecated priority queries and queryLimitedToNumberOfChildren")
    func queries() async throws {
        try await DatabaseTests.withNode { (port: Int) async throws in
            let scores = Firebase(url: "http://127.0.0.1:\(port)/scores?ns=fb2q")
            let data: [String: Any] = [
                "ada": ["score": 30, "v": 3, ".priority": 3], "bob": ["score": 10, "v": 1, ".priority": 1],
                "cy": ["score": 20, "v": 2, ".priority": 2], "dee": ["score": 40, "v": 4, ".priority": 4],
            ]
            await Self.check("ok") { scores.setValue(data, withCompletionBlock: $0) }
            let values = Firebase(url: "http://127.0.0.1:\(port)/values?ns=fb2q")
            await Self.check("ok") { values.setValue(["x": 3, "y": 1, "z": 2], withCompletionBlock: $0) }

            #expect(try await Self.keysOnce(scores.queryOrderedByChild("score").queryLimitedToLast(2)) == ["ada", "dee"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("score").queryLimitedToFirst(1)) == ["bob"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("score").queryStartingAtValue(20).queryEndingAtValue(30)) == ["cy", "ada"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("score").queryEqualToValue(40)) == ["dee"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("v").queryEqualToValue(2, childKey: "cy")) == ["cy"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("v").queryStartingAtValue(2, childKey: "d")) == ["ada", "dee"])
            #expect(try await Self.keysOnce(scores.queryOrderedByChild("v").queryEndingAtValue(3, childKey: "a")) == ["bob", "cy"])
            #expect(try await Self.keysOnce(scores.queryOrderedByKey().queryStartingAtValue("b").queryEndingAtValue("cz")) == ["bob", "cy"])
            #expect(try await Self.keysOnce(values.queryOrderedByValue().queryLimitedToFirst(2)) == ["y", "z"])
            #expect(try await Self.keysOnce(scores.queryOrderedByPriority().queryLimitedToLast(1)) == ["dee"])

            // The deprecated priority bounds, on the default (priority) order.
            #expect(try await Self.keysOnce(scores.queryStartingAtPriority(2)) == ["cy", "ada", "dee"])
            #expect(try await Self.keysOnce(scores.queryEndingAtPriority(2)) == ["bob", "cy"])
            #expect(try await Self.keysOnce(scores.queryEqualToPriority(3)) == ["ada"])
            #expect(try await Self.keysOnce(scores.queryStartingAtPriority(3, andChildName: "a")) == ["ada", "dee"])
            #expect(try await Self.keysOnce(scores.queryEndingAtPriority(3, andChildName: "a")) == ["bob", "cy"])
            #expect(try await Self.keysOnce(scores.queryEqualToPriority(3, andChildName: "ada")) == ["ada"])
            // queryLimitedToNumberOfChildren: the last n, or the first n after a start bound
            // (also when the start comes after the limit).
            #expect(try await Self.keysOnce(scores.queryLimitedToNumberOfChildren(2)) == ["ada", "dee"])
            #expect(try await Self.keysOnce(scores.queryStartingAtPriority(2).queryLimitedToNumberOfChildren(2)) == ["cy", "ada"])
            #expect(try await Self.keysOnce(scores.queryLimitedToNumberOfChildren(2).queryStartingAtPriority(1)) == ["bob", "cy"])

            // Invalid combinations fail the cancel block with invalid_query.
            for bad in [
                scores.queryOrderedByChild("score").queryStartingAtPriority(1), scores.queryLimitedToNumberOfChildren(1).queryLimitedToFirst(1),
                scores.queryLimitedToNumberOfChildren(1).queryLimitedToNumberOfChildren(2), scores.queryStartingAtPriority(true),
                scores.queryOrderedByKey().queryOrderedByValue(),
            ] {
                do {
                    _ = try await Self.once(bad)
                    Issue.record("an invalid query was observed")
                } catch {
                    #expect((error as? DatabaseError)?.code == "invalid_query", "\(error)")
                }
            }
            #expect(scores.queryLimitedToNumberOfChildren(3).databaseQuery?.params.limit == 3)
            scores.keepSynced(true)
            scores.queryOrderedByChild("score").keepSynced(false)
        }
    }

    @Test("transactions, onDisconnect writes run by the class-level goOffline, and .info/connected following goOffline/goOnline")
    func transactionsAndOnDisconnect() async throws {
        try await DatabaseTests.withNode { port in
            let base = "http://127.0.0.1:\(port)"
            let counter = Firebase(url: "\(base)/counter?ns=fb2t")
            let results = R()
            for _ in 0..<5 {
                counter.runTransactionBlock({ data in
                    data.value = ((data.value as? Int) ?? 0) + 1
                    return FTransactionResult.successWithValue(data)
                }, andCompletionBlock: { error, committed, _ in results.add("\(committed) \(error.map { "\($0)" } ?? "")") })
            }
            #expect(await results.wait { _ in results.all.count == 5 }, "\(results.all)")
            #expect(results.all.allSatisfy { $0 == "true " }, "\(results.all)")
            #expect(try await Self.once(counter).value as? Int == 5)
            // An abort reports the data there (synced here by an observer, as in Firebase).
            let synced = R()
            counter.observeEventType(.Value) { s in synced.add(DatabaseTests.json(s.value)) }
            #expect(await synced.wait { $0 == "5" })
            let aborted = R()
            counter.runTransactionBlock({ _ in FTransactionResult.abort() }, andCompletionBlock: { _, committed, s in
                aborted.add("\(committed) \(DatabaseTests.json(s?.value))")
            }, withLocalEvents: false)
            #expect(await aborted.wait { $0 == "false 5" }, "\(aborted.all)")
            let nested = R()
            counter.childByAppendingPath("nested").observeEventType(.Value) { s in nested.add(DatabaseTests.json(s.value)) }
            counter.runTransactionBlock { data in
                let child = data.childDataByAppendingPath("nested")
                child.value = "n"
                nested.add("has child: \(data.hasChildAtPath("nested"))")
                return .success(withValue: data)
            }
            #expect(await nested.wait { $0 == #""n""# }, "\(nested.all)")
            #expect(nested.all.contains("has child: true"))

            // A watcher on a database of its own (not affected by Firebase.goOffline()).
            let watcher = try SDKFeatureTests.database(port, ns: "fb2t")
            defer { watcher.shutdown() }
            let presence = R()
            watcher.reference(withPath: "presence").observe(.value) { s in presence.add(DatabaseTests.json(s.value)) }
            let me = Firebase(url: "\(base)/presence/ada?ns=fb2t")
            await Self.check("ok") { me.setValue("online", withCompletionBlock: $0) }
            await Self.check("ok") { me.onDisconnectSetValue("offline", withCompletionBlock: $0) }
            let temp = Firebase(url: "\(base)/presence/temp?ns=fb2t")
            let all = Firebase(url: "\(base)/presence?ns=fb2t")
            await Self.check("ok") { temp.onDisconnectSetValue("gone", andPriority: 1, withCompletionBlock: $0) }
            await Self.check("ok") { temp.cancelDisconnectOperationsWithCompletionBlock($0) }
            await Self.check("ok") { all.onDisconnectUpdateChildValues(["seen": FirebaseServerValue.timestamp()], withCompletionBlock: $0) }
            let bob = Firebase(url: "\(base)/presence/bob?ns=fb2t")
            bob.setValue("here")
            await Self.check("ok") { bob.onDisconnectRemoveValueWithCompletionBlock($0) }
            let cy = Firebase(url: "\(base)/presence/cy?ns=fb2t")
            cy.onDisconnectSetValue("was here")
            cy.onDisconnectSetValue("with priority", andPriority: 2)
            cy.onDisconnectUpdateChildValues(["x": 1])
            cy.onDisconnectRemoveValue()
            cy.cancelDisconnectOperations()
            cy.onDisconnectSetValue("cy left")
            me.onDisconnectUpdateChildValues(["ignored": true])
            me.cancelDisconnectOperations()
            me.onDisconnectSetValue("offline")
            #expect(await presence.wait { $0 == #"{"ada":"online","bob":"here"}"# }, "\(presence.all)")

            let connected = R()
            Firebase(url: "\(base)/.info/connected?ns=fb2t").observeEventType(.Value) { s in connected.add("\(s.value as? Bool ?? false)") }
            #expect(await connected.wait { $0 == "true" })
            Firebase.goOffline()
            #expect(await connected.wait { $0 == "false" })
            #expect(await presence.wait { $0.hasPrefix(#"{"ada":"offline","cy":"cy left","seen":"#) }, "\(presence.all)")
            #expect(!presence.all.contains { $0.contains("temp") })
            Firebase.goOnline()
            #expect(await connected.wait { _ in connected.all.last == "true" }, "\(connected.all)")
        }
    }

    @Test("setDispatchQueue: callbacks of databases first used after it run on that queue")
    func dispatchQueue() async throws {
        try await DatabaseTests.withNode { port in
            let key = DispatchSpecificKey<String>()
            let queue = DispatchQueue(label: "fb2x.test.queue")
            queue.setSpecific(key: key, value: "mine")
            Firebase.setDispatchQueue(queue)
            let ref = Firebase(url: "http://127.0.0.1:\(port)/q?ns=fb2d")
            let seen = R()
            ref.observeEventType(.Value) { _ in seen.add(DispatchQueue.getSpecific(key: key) ?? "other queue") }
            ref.setValue(1) { _, _ in seen.add("done on " + (DispatchQueue.getSpecific(key: key) ?? "other queue")) }
            #expect(await seen.wait { $0 == "done on mine" }, "\(seen.all)")
            #expect(seen.all.allSatisfy { $0 == "mine" || $0 == "done on mine" }, "\(seen.all)")
        }
    }

    /// A 2.x auth call awaited: "ok" or the 2.x code of its error, and the auth data.
    static func auth(_ start: (@escaping @Sendable ((any Error)?, FAuthData?) -> Void) -> Void) async -> (String, FAuthData?) {
        await withCheckedContinuation { (c: CheckedContinuation<(String, FAuthData?), Never>) in
            start { e, data in
                let outcome = e.map { "\(($0 as? AuthError)?.firebase2xCode ?? .Unknown)" } ?? "ok"
                c.resume(returning: (outcome, data))
            }
        }
    }

    /// A 2.x account call awaited: "ok" or the toolkit's code.
    static func plain(_ start: (@escaping @Sendable ((any Error)?) -> Void) -> Void) async -> String {
        await withCheckedContinuation { (c: CheckedContinuation<String, Never>) in
            start { e in c.resume(returning: e.map { ($0 as? AuthError)?.code ?? "\($0)" } ?? "ok") }
        }
    }

    /// `createUser(_:password:withValueCompletionBlock:)` awaited: the new uid.
    static func createdUID(_ ref: Firebase, _ email: String, _ password: String) async -> String? {
        await withCheckedContinuation { (c: CheckedContinuation<String?, Never>) in
            ref.createUser(email, password: password) { (_: (any Error)?, result: [String: Any]?) in
                let uid = result?["uid"] as? String
                c.resume(returning: uid)
            }
        }
    }

    static func b64(_ s: String) -> String {
        Data(s.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    @Test("the 2.x auth methods on the reference: createUser, authUser, authAnonymously, authWithCustomToken, password and email changes, reset, removeUser, unauth, observeAuthEvent, authData")
    func authMethods() async throws {
        try await AuthTests.withAccountsNode { port, dir in
            try await AuthTests.setRules(port, ns: "fb2a", AuthTests.ownRecordRules)
            let root = Firebase(url: "http://127.0.0.1:\(port)?ns=fb2a")
            let events = R()
            let handle = root.observeAuthEventWithBlock { data in events.add(data.map { "auth \($0.uid)" } ?? "none") }
            #expect(await events.wait { $0 == "none" })

            let created = await Self.createdUID(root, "ada@x.y", "lovelace1")
            let uid = try #require(created)
            #expect(!uid.isEmpty && root.authData == nil, "2.x createUser does not sign in")
            #expect(await Self.plain { root.createUser("ada@x.y", password: "again-1", withCompletionBlock: $0) } == "EMAIL_EXISTS")
            #expect(await Self.auth { root.authUser("ada@x.y", password: "wrong-one", withCompletionBlock: $0) }.0 == "InvalidPassword")
            #expect(await Self.auth { root.authUser("nobody@x.y", password: "wrong-one", withCompletionBlock: $0) }.0 == "UserDoesNotExist")

            let (outcome, data) = await Self.auth { root.authUser("ada@x.y", password: "lovelace1", withCompletionBlock: $0) }
            #expect(outcome == "ok" && data?.uid == uid && data?.provider == "password" && data?.email == "ada@x.y", "\(outcome)")
            #expect(data?.auth["uid"] as? String == uid && (data?.expires ?? 0) > Int(Date().timeIntervalSince1970))
            #expect(data?.providerData["email"] as? String == "ada@x.y" && !(data?.token ?? "").isEmpty)
            #expect(root.authData?.uid == uid && root.childByAppendingPath("users").authData?.uid == uid)
            #expect(await events.wait { $0 == "auth \(uid)" })
            // The connection uses the token: own record yes, another's no.
            await Self.check("ok") { root.childByAppendingPath("users/\(uid)").setValue(["n": 1], withCompletionBlock: $0) }
            await Self.check("permission_denied") { root.childByAppendingPath("users/other").setValue(["n": 1], withCompletionBlock: $0) }

            try await Task.sleep(nanoseconds: 1_100_000_000)  // validSince has a second's resolution
            #expect(await Self.plain { root.changePasswordForUser("ada@x.y", fromOld: "lovelace1", toNew: "babbage-2", withCompletionBlock: $0) } == "ok")
            #expect(await Self.plain { root.changePasswordForUser("ada@x.y", fromOld: "lovelace1", toNew: "x-3", withCompletionBlock: $0) } == "INVALID_PASSWORD")
            // The session took the new tokens: the connection keeps its access.
            await Self.check("ok") { root.childByAppendingPath("users/\(uid)/n").setValue(2, withCompletionBlock: $0) }
            #expect(await Self.plain { root.changeEmailForUser("ada@x.y", password: "babbage-2", toNewEmail: "countess@x.y", withCompletionBlock: $0) } == "ok")
            #expect(root.authData?.email == "countess@x.y")
            #expect(await Self.plain { root.resetPasswordForUser("countess@x.y", withCompletionBlock: $0) } == "ok")
            #expect(AuthTests.resetCode(dir, "countess@x.y") != nil)

            root.unauth()
            #expect(root.authData == nil)
            #expect(await events.wait { _ in events.all.last == "none" }, "\(events.all)")
            await Self.check("permission_denied") { root.childByAppendingPath("users/\(uid)/n").setValue(3, withCompletionBlock: $0) }

            let (anonymousOutcome, anonymous) = await Self.auth { root.authAnonymouslyWithCompletionBlock($0) }
            #expect(anonymousOutcome == "ok" && anonymous?.provider == "anonymous" && anonymous?.uid != uid)
            let token = Self.b64(#"{"alg":"none","typ":"JWT"}"#) + "." + Self.b64(#"{"uid":"custom-9","claims":{"admin":false}}"#) + "."
            let (customOutcome, custom) = await Self.auth { root.authWithCustomToken(token, withCompletionBlock: $0) }
            #expect(customOutcome == "ok" && custom?.uid == "custom-9" && custom?.provider == "custom" && custom?.auth["admin"] as? Bool == false)
            #expect(await Self.auth { root.authWithCustomToken("garbage", withCompletionBlock: $0) }.0 == "InvalidToken")

            // removeUser of the signed-in account ends the session.
            _ = await Self.auth { root.authUser("countess@x.y", password: "babbage-2", withCompletionBlock: $0) }
            #expect(root.authData?.uid == uid)
            #expect(await Self.plain { root.removeUser("countess@x.y", password: "babbage-2", withCompletionBlock: $0) } == "ok")
            #expect(root.authData == nil)
            #expect(await Self.auth { root.authUser("countess@x.y", password: "babbage-2", withCompletionBlock: $0) }.0 == "UserDoesNotExist")
            root.removeAuthEventObserverWithHandle(handle)
            let count = events.all.count
            _ = await Self.auth { root.authAnonymouslyWithCompletionBlock($0) }
            try await Task.sleep(nanoseconds: 200_000_000)
            #expect(events.all.count == count, "the removed observer stays quiet: \(events.all)")
            root.unauth()
        }
    }
}
