import BanyanClient
import BanyanQuery
import BanyanServer
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Testing

/// The Wilddog Sync names (`WDGApp`, `WDGSync`, `WDGSyncReference`, `WDGSyncQuery`, …) against a
/// real node, and Wilddog's documented behaviour under `compatibility: .wilddog` next to the
/// Firebase behaviour of the same calls. One serialized suite: `WDGSyncReference.goOffline()` is
/// process-wide.
@Suite(.serialized) struct WilddogTests {
    typealias R = DatabaseTests.Recorder

    static func once(_ query: WDGSyncQuery) async throws -> WDGDataSnapshot {
        try await DatabaseTests.bounded {
            try await withCheckedThrowingContinuation { (c: CheckedContinuation<WDGDataSnapshot, any Error>) in
                query.observeSingleEvent(of: .value, with: { c.resume(returning: $0) }, withCancel: { c.resume(throwing: $0) })
            }
        }
    }

    /// A write with a completion block, awaited: "ok", a Wilddog code, or a `DatabaseError` code.
    static func completed(_ start: (@escaping WDGSyncReference.CompletionBlock) -> Void) async -> String {
        await withCheckedContinuation { (c: CheckedContinuation<String, Never>) in
            start { error, _ in
                let text: String =
                    switch error {
                    case nil: "ok"
                    case let e as WDGSyncError: "\(e.code)"
                    case let e as DatabaseError: e.code
                    case let e?: "\(e)"
                    }
                c.resume(returning: text)
            }
        }
    }

    /// `completed`, expected to give `expected` (the outcome shows when it does not).
    static func check(_ expected: String, sourceLocation: SourceLocation = #_sourceLocation, _ start: (@escaping WDGSyncReference.CompletionBlock) -> Void) async {
        let got = await completed(start)
        #expect(got == expected, sourceLocation: sourceLocation)
    }

    @Test("WDGApp, WDGSync and the reference and query names: writes, events, queries, a transaction, onDisconnect")
    func namesOverTheSameImplementation() async throws {
        try await DatabaseTests.withNode { port in
            let url = "http://127.0.0.1:\(port)?ns=wdg"
            try WDGApp.configure(withName: "wdg\(port)", options: WDGOptions(syncURL: url))
            #expect(throws: DatabaseError.self) { try WDGApp.configure(withName: "wdg\(port)", options: WDGOptions(syncURL: url)) }
            let app = try #require(WDGApp.app(named: "wdg\(port)"))
            #expect(WDGApp.allApps()["wdg\(port)"] === app)
            let sync = try WDGSync.sync(app: app)
            #expect(sync.app === app && sync.options.compatibility == .firebase)
            #expect(try WDGSync.sync(url: url).database === sync.database, "one database per URL")
            if WDGApp.defaultApp() == nil { try WDGApp.configure(with: WDGOptions(syncURL: url)) }
            #expect(try WDGSync.sync().database.nodes.isEmpty == false)

            let ada = sync.reference(withPath: "users").child("ada")
            #expect(ada.key == "ada" && ada.parent?.key == "users" && ada.root.key == nil && ada.url == "http://127.0.0.1:\(port)/users/ada?ns=wdg")
            #expect(ada.description == ada.url && ada.ref === ada && ada.sync === sync)
            #expect(ada.child(byAppendingPath: "a/b").key == "b" && sync.reference().child("users/ada").url == ada.url)
            #expect(sync.reference(fromURL: "http://127.0.0.1:\(port)/x/y?ns=wdg").key == "y")

            let values = R()
            let handle = ada.observe(WDGDataEventType.value) { s in values.add(DatabaseTests.json(s.value)) }
            #expect(await values.wait { $0 == "null" })
            await Self.check("ok") { ada.setValue(["name": "Ada"], withCompletionBlock: $0) }
            #expect(await values.wait { $0 == #"{"name":"Ada"}"# }, "\(values.all)")
            ada.setValue(["name": "Ada", "born": 1815])
            #expect(await values.wait { $0 == #"{"born":1815,"name":"Ada"}"# })
            await Self.check("ok") { ada.updateChildValues(["born": 1816], withCompletionBlock: $0) }
            ada.updateChildValues(["title": "Countess"])
            #expect(await values.wait { $0 == #"{"born":1816,"name":"Ada","title":"Countess"}"# }, "\(values.all)")
            ada.removeObserver(withHandle: handle)

            let list = sync.reference(withPath: "list")
            let events = R()
            list.observe(.childAdded, andPreviousSiblingKeyWith: { s, prev in events.add("added \(s.key ?? "") after \(prev ?? "-")") })
            list.observe(.childChanged, with: { s in events.add("changed \(s.key ?? "")") }, withCancel: { _ in })
            list.observe(.childRemoved, andPreviousSiblingKeyWith: { s, _ in events.add("removed \(s.key ?? "")") }, withCancel: { _ in })
            list.observe(.childMoved, with: { s in events.add("moved \(s.key ?? "")") })
            await Self.check("ok") { list.child("a").setValue("A", andPriority: 1, withCompletionBlock: $0) }
            list.child("b").setValue("B", andPriority: 2)
            #expect(await events.wait { $0 == "added b after a" }, "\(events.all)")
            await Self.check("ok") { list.child("a").setPriority(3, withCompletionBlock: $0) }
            #expect(await events.wait { $0 == "moved a" }, "\(events.all)")
            list.child("b").setPriority(5)
            list.child("b").setValue("B2")
            #expect(await events.wait { $0 == "changed b" }, "\(events.all)")
            let pushed = list.childByAutoId()
            pushed.setValue("P")
            #expect(await events.wait { $0.hasPrefix("added \(pushed.key ?? "?")") })
            await Self.check("ok") { list.child("a").removeValue(completionBlock: $0) }
            list.child("b").removeValue()
            #expect(await events.wait { $0 == "removed b" } && events.all.contains("removed a"), "\(events.all)")
            list.removeAllObservers()
            list.keepSynced(true)

            // Queries.
            let scores = sync.reference(withPath: "scores")
            await Self.check("ok") { scores.setValue(["ada": ["s": 30], "bob": ["s": 10], "cy": ["s": 20]], withCompletionBlock: $0) }
            func keys(_ q: WDGSyncQuery) async throws -> [String] { try await Self.once(q).children.map { $0.key ?? "" } }
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryLimited(toLast: 2)) == ["cy", "ada"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryLimited(toFirst: 1)) == ["bob"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryStarting(atValue: 20)) == ["cy", "ada"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryEnding(atValue: 20)) == ["bob", "cy"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryEqual(toValue: 30)) == ["ada"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryStarting(atValue: 20, childKey: "d")) == ["ada"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryEnding(atValue: 20, childKey: "a")) == ["bob"])
            #expect(try await keys(scores.queryOrdered(byChild: "s").queryEqual(toValue: 20, childKey: "cy")) == ["cy"])
            #expect(try await keys(scores.queryOrderedByKey().queryStarting(atValue: "b")) == ["bob", "cy"])
            #expect(try await keys(scores.queryOrderedByPriority().queryLimited(toFirst: 2)) == ["ada", "bob"])
            #expect(try await keys(sync.reference(withPath: "list").queryOrderedByValue()).isEmpty == false)
            let single = R()
            scores.queryOrderedByKey().observeSingleEvent(of: .childAdded, andPreviousSiblingKeyWith: { s, _ in single.add(s.key ?? "") })
            scores.observeSingleEvent(of: .childAdded) { s in single.add("plain \(s.key ?? "")") }
            #expect(await single.wait { _ in single.all.count == 2 } && single.all.contains("ada"), "\(single.all)")

            // A transaction.
            let counter = sync.reference(withPath: "counter")
            let committed = R()
            for _ in 0..<3 {
                counter.runTransactionBlock({ data in
                    data.value = ((data.value as? Int) ?? 0) + 1
                    return WDGTransactionResult.success(withValue: data)
                }, andCompletionBlock: { error, ok, _ in committed.add("\(ok) \(error.map { "\($0)" } ?? "")") })
            }
            #expect(await committed.wait { _ in committed.all.count == 3 } && committed.all.allSatisfy { $0 == "true " }, "\(committed.all)")
            #expect(try await Self.once(counter).value as? Int == 3)
            counter.runTransactionBlock { _ in WDGTransactionResult.abort() }

            // onDisconnect, run by the class-level goOffline; a watcher on its own database.
            let watcher = try SDKFeatureTests.database(port, ns: "wdg")
            defer { watcher.shutdown() }
            let presence = R()
            watcher.reference(withPath: "presence").observe(.value) { s in presence.add(DatabaseTests.json(s.value)) }
            let me = sync.reference(withPath: "presence/ada")
            await Self.check("ok") { me.setValue("online", withCompletionBlock: $0) }
            await Self.check("ok") { me.onDisconnectSetValue("offline", withCompletionBlock: $0) }
            let temp = sync.reference(withPath: "presence/temp")
            await Self.check("ok") { temp.onDisconnectSetValue("x", andPriority: 1, withCompletionBlock: $0) }
            temp.onDisconnectSetValue("y")
            temp.onDisconnectSetValue("z", andPriority: 2)
            await Self.check("ok") { temp.cancelDisconnectOperations(completionBlock: $0) }
            await Self.check("ok") { sync.reference(withPath: "presence").onDisconnectUpdateChildValues(["seen": WDGServerValue.timestamp()], withCompletionBlock: $0) }
            let bob = sync.reference(withPath: "presence/bob")
            bob.setValue("here")
            await Self.check("ok") { bob.onDisconnectRemoveValue(completionBlock: $0) }
            let cy = sync.reference(withPath: "presence/cy")
            cy.onDisconnectRemoveValue()
            cy.onDisconnectUpdateChildValues(["left": true])
            cy.cancelDisconnectOperations()
            cy.onDisconnectSetValue("cy left")
            #expect(await presence.wait { $0 == #"{"ada":"online","bob":"here"}"# }, "\(presence.all)")
            WDGSyncReference.goOffline()
            #expect(await presence.wait { $0.hasPrefix(#"{"ada":"offline","cy":"cy left","seen":"#) }, "\(presence.all)")
            WDGSyncReference.goOnline()
            let back = try await DatabaseTests.bounded { try await sync.database.reference(withPath: "presence/ada").getData() }
            #expect(back.value as? String == "offline")
            sync.goOffline()
            sync.goOnline()
        }
    }

    @Test("compatibility .wilddog: setPriority on a location without data fails (26301), writes over 2 MiB or strings over 1 MiB are refused (26104, 26105), queries return at most 500 children, errors carry Wilddog's codes; .firebase keeps Banyan's behaviour")
    func wilddogBehaviour() async throws {
        try await DatabaseTests.withNode { port in
            var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(port)/.settings/rules.json?ns=wdgb&auth=owner")))
            request.httpMethod = "PUT"
            request.httpBody = Data(#"{"rules":{".read":true,"$top":{".write":"$top !== 'locked'"}}}"#.utf8)
            #expect(try await DatabaseTests.status(request) == 200)
            let url = "http://127.0.0.1:\(port)?ns=wdgb"
            let wilddog = try WDGSync.sync(options: WDGOptions(syncURL: url, compatibility: .wilddog))
            let firebase = try WDGSync.sync(url: url)
            #expect(wilddog !== firebase && wilddog.database === firebase.database)

            // Priority on a location without data.
            await Self.check("26301") { wilddog.reference(withPath: "nothing/here").setPriority(1, withCompletionBlock: $0) }
            // Banyan refuses it too, with the protocol's generic status (docs/data-model.md).
            await Self.check("failure") { firebase.reference(withPath: "nothing/here").setPriority(1, withCompletionBlock: $0) }
            await Self.check("ok") { wilddog.reference(withPath: "item").setValue("v", withCompletionBlock: $0) }
            await Self.check("ok") { wilddog.reference(withPath: "item").setPriority(7, withCompletionBlock: $0) }
            let item = try await DatabaseTests.bounded { try await firebase.database.reference(withPath: "item").getData() }
            #expect(item.value as? String == "v" && item.priority as? Double == 7)
            await Self.check("29999") { wilddog.reference(withPath: "item").setPriority(true, withCompletionBlock: $0) }

            // Write bounds.
            let longString = String(repeating: "x", count: 1_100_000)
            await Self.check("26105") { wilddog.reference(withPath: "big/leaf").setValue(longString, withCompletionBlock: $0) }
            await Self.check("26105") { wilddog.reference(withPath: "big").updateChildValues(["leaf": ["deep": longString]], withCompletionBlock: $0) }
            let wide = (0..<2200).map { _ in String(repeating: "y", count: 1000) }
            await Self.check("26104") { wilddog.reference(withPath: "big/wide").setValue(wide, withCompletionBlock: $0) }
            await Self.check("26104") { wilddog.reference(withPath: "big/wide").onDisconnectSetValue(wide, withCompletionBlock: $0) }
            await Self.check("ok") { firebase.reference(withPath: "big/leaf").setValue(longString, withCompletionBlock: $0) }
            await Self.check("ok") { firebase.reference(withPath: "big/wide").setValue(wide, withCompletionBlock: $0) }

            // Errors: Wilddog's codes, or Firebase's.
            await Self.check("26101") { wilddog.reference(withPath: "locked").setValue(1, withCompletionBlock: $0) }
            await Self.check("permission_denied") { firebase.reference(withPath: "locked").setValue(1, withCompletionBlock: $0) }
            let cancelled = R()
            wilddog.reference(withPath: "x").queryOrderedByKey().queryOrderedByValue().observe(.value, with: { _ in }, withCancel: { e in
                cancelled.add("\((e as? WDGSyncError)?.code ?? 0) \((e as? WDGSyncError)?.underlying.code ?? "")")
            })
            #expect(await cancelled.wait { $0 == "29999 invalid_query" }, "\(cancelled.all)")

            // At most 500 children per query.
            var many: [String: Int] = [:]
            for i in 0..<600 { many[String(format: "k%03d", i)] = i }
            await Self.check("ok") { firebase.reference(withPath: "many").setValue(many, withCompletionBlock: $0) }
            #expect(try await Self.once(wilddog.reference(withPath: "many").queryOrderedByKey().queryLimited(toFirst: 1000)).childrenCount == 500)
            #expect(try await Self.once(firebase.reference(withPath: "many").queryOrderedByKey().queryLimited(toFirst: 1000)).childrenCount == 600)
            let range = try await Self.once(wilddog.reference(withPath: "many").queryOrdered(byChild: "x").queryStarting(atValue: nil))
            #expect(range.childrenCount == 500)
            #expect(wilddog.reference(withPath: "many").queryOrderedByValue().queryStarting(atValue: 10).databaseQuery.params.limit == 500)
            #expect(firebase.reference(withPath: "many").queryOrderedByValue().queryStarting(atValue: 10).databaseQuery.params.limit == nil)
            #expect(try await Self.once(wilddog.reference(withPath: "many")).childrenCount == 600, "a plain location is not a query")
        }
    }
}
