import BanyanClient
import Testing

/// Query argument checks with the Firebase iOS SDK's messages (docs/swift-sdk.md, "Queries"):
/// each invalid call leaves a query whose `queryError` carries the message the iOS SDK raises.
@Suite struct QueryMessageTests {
    @Test("every check the iOS SDK makes on query arguments gives its message, in its order; valid combinations give none")
    func iosMessages() throws {
        let db = try Database(url: "http://127.0.0.1:1?ns=messages", nodes: [])
        defer { db.shutdown() }
        db.goOffline()
        let ref = db.reference(withPath: "posts")
        func message(_ q: DatabaseQuery) -> String? { q.queryError?.message }

        // Orderings.
        #expect(message(ref.queryOrdered(byChild: "$key")) == "(queryOrderedByChild:) $key is invalid.  Use queryOrderedByKey: instead.")
        #expect(message(ref.queryOrdered(byChild: ".priority")) == "(queryOrderedByChild:) .priority is invalid.  Use queryOrderedByPriority: instead.")
        #expect(message(ref.queryOrdered(byChild: "$value")) == "(queryOrderedByChild:) $value is invalid.  Use queryOrderedByValue: instead.")
        #expect(message(ref.queryOrdered(byChild: "/")) == "(queryOrderedByChild:) with an empty path is invalid.  Use queryOrderedByValue: instead.")
        #expect(message(ref.queryOrderedByKey().queryOrderedByValue()) == "Cannot use multiple queryOrderedBy calls!")
        #expect(message(ref.queryOrderedByPriority().queryOrdered(byChild: "stars")) == "Cannot use multiple queryOrderedBy calls!")

        // Limits.
        #expect(message(ref.queryLimited(toFirst: 0)) == "Limit can't be zero")
        #expect(message(ref.queryLimited(toLast: 1 << 31)) == "Limit must be less than 2,147,483,648")
        #expect(message(ref.queryLimited(toFirst: 2).queryLimited(toLast: 2)) == "Can't call queryLimitedToLast: if a limit was previously set")
        #expect(message(ref.queryLimited(toLast: 2).queryLimited(toFirst: 2)) == "Can't call queryLimitedToFirst: if a limit was previously set")

        // Values and endpoints already set.
        #expect(message(ref.queryStarting(atValue: [1, 2])) == "You can only pass nil, NSString or NSNumber to queryStartingAtValue:")
        #expect(
            message(ref.queryStarting(atValue: 1).queryStarting(afterValue: 2))
                == "Can't call queryStartingAfterValue:childKey: after queryStartingAtValue, queryStartingAfterValue, or queryEqualToValue was previously called")
        #expect(
            message(ref.queryEnding(atValue: 1).queryEnding(atValue: 2, childKey: "k"))
                == "Can't call queryEndingAtValue:childKey: after queryEndingAtValue or queryEqualToValue was previously called")
        #expect(
            message(ref.queryEnding(beforeValue: 1).queryEqual(toValue: 2))
                == "Can't call queryEqualToValue: after queryStartingAtValue, queryStartingAfterValue, queryEndingAtValue, queryEndingBeforeValue or queryEqualToValue was previously called")

        // Key ordering.
        let byKey = ref.queryOrderedByKey()
        #expect(message(byKey.queryStarting(atValue: "a", childKey: "k")) == "You must use queryStartingAtValue: instead of queryStartingAtValue:childKey: when using queryOrderedByKey:")
        #expect(message(byKey.queryEqual(toValue: "a", childKey: "k")) == "You must use queryEqualToValue: instead of queryEqualTo:childKey: when using queryOrderedByKey:")
        #expect(message(byKey.queryStarting(atValue: 3)) == "Can't use queryStartingAtValue: or queryStartingAfterValue: with non-string types when used with queryOrderedByKey")
        #expect(message(byKey.queryEnding(atValue: true)) == "Can't use queryEndingAtValue: or queryEndingBeforeValue: with other types than string in combination with queryOrderedByKey")
        // Ordering by key after an endpoint with a child key, or a non-string one.
        #expect(
            message(ref.queryStarting(atValue: "a", childKey: "k").queryOrderedByKey())
                == "Can't use queryStartingAtValue:childKey:, queryStartingAfterValue:childKey:, or queryEqualTo:andChildKey: in combination with queryOrderedByKey")
        #expect(
            message(ref.queryEnding(atValue: 5).queryOrderedByKey())
                == "Can't use queryEndingAtValue: or queryEndingBeforeValue: with other types than string in combination with queryOrderedByKey")
        // Priority ordering.
        #expect(
            message(ref.queryOrderedByPriority().queryStarting(atValue: true))
                == "When using queryOrderedByPriority, values provided to queryStartingAtValue:, queryStartingAfterValue:, queryEndingAtValue:, queryEndingBeforeValue:, or queryEqualToValue: must be valid priorities.")

        // Valid combinations.
        #expect(message(ref.queryOrdered(byChild: "stars").queryStarting(atValue: 3, childKey: "k").queryLimited(toLast: 10)) == nil)
        #expect(message(byKey.queryStarting(afterValue: "a").queryEnding(beforeValue: "z").queryLimited(toFirst: 5)) == nil)
        #expect(message(ref.queryOrderedByValue().queryEqual(toValue: nil)) == nil)
        #expect(message(ref.queryOrderedByPriority().queryStarting(atValue: 1).queryEnding(atValue: "x")) == nil)
        // The first error stays: later calls do not replace it.
        #expect(message(ref.queryLimited(toFirst: 0).queryOrderedByKey().queryOrderedByKey()) == "Limit can't be zero")
    }
}
