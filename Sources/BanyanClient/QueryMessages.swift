import BanyanQuery

/// The Firebase iOS SDK's checks of query arguments and its messages for them, which
/// `DatabaseQuery` reports as `queryError` (the iOS SDK raises an exception with the same text).
/// Checked in the iOS SDK's order: what the call itself can tell first, then the endpoints for
/// the ordering (the query builder's checks, reworded here).
enum IOSQueryMessages {
    static let multipleOrderings = "Cannot use multiple queryOrderedBy calls!"

    /// `queryOrdered(byChild:)`: the reserved names, a second ordering, an empty path.
    static func orderByChild(_ key: String, alreadyOrdered: Bool) -> String? {
        switch key {
        case "$key", ".key": return "(queryOrderedByChild:) \(key) is invalid.  Use queryOrderedByKey: instead."
        case "$priority", ".priority": return "(queryOrderedByChild:) \(key) is invalid.  Use queryOrderedByPriority: instead."
        case "$value", ".value": return "(queryOrderedByChild:) \(key) is invalid.  Use queryOrderedByValue: instead."
        default: break
        }
        if alreadyOrdered { return multipleOrderings }
        if key.split(separator: "/", omittingEmptySubsequences: true).isEmpty {
            return "(queryOrderedByChild:) with an empty path is invalid.  Use queryOrderedByValue: instead."
        }
        return nil
    }

    /// `queryLimited(toFirst:)` and `queryLimited(toLast:)`.
    static func limit(_ limit: UInt, first: Bool, alreadySet: Bool) -> String? {
        if alreadySet { return "Can't call \(first ? "queryLimitedToFirst:" : "queryLimitedToLast:") if a limit was previously set" }
        if limit == 0 { return "Limit can't be zero" }
        if limit >= 1 << 31 { return "Limit must be less than 2,147,483,648" }
        return nil
    }

    enum Bound { case startAt, startAfter, endAt, endBefore, equalTo }

    struct State {
        var keyOrdered: Bool
        var hasStart: Bool
        var hasEnd: Bool
    }

    static func valueType(_ method: String) -> String { "You can only pass nil, NSString or NSNumber to \(method)" }

    /// A start, end or equality: a child key under key ordering, then an endpoint already set.
    static func bound(_ call: Bound, method: String, childKey: String?, _ state: State) -> String? {
        if state.keyOrdered, childKey != nil {
            switch call {
            case .startAt: return "You must use queryStartingAtValue: instead of queryStartingAtValue:childKey: when using queryOrderedByKey:"
            case .startAfter: return "You must use queryStartingAfterValue: instead of queryStartingAfterValue:childKey: when using queryOrderedByKey:"
            case .endAt: return "You must use queryEndingAtValue: instead of queryEndingAtValue:childKey: when using queryOrderedByKey:"
            case .endBefore: return "You must use queryEndingBeforeValue: instead of queryEndingBeforeValue:childKey: when using queryOrderedByKey:"
            case .equalTo: return "You must use queryEqualToValue: instead of queryEqualTo:childKey: when using queryOrderedByKey:"
            }
        }
        switch call {
        case .startAt where state.hasStart, .startAfter where state.hasStart:
            return "Can't call \(method) after queryStartingAtValue, queryStartingAfterValue, or queryEqualToValue was previously called"
        case .endAt where state.hasEnd, .endBefore where state.hasEnd:
            return "Can't call \(method) after queryEndingAtValue or queryEqualToValue was previously called"
        case .equalTo where state.hasStart || state.hasEnd:
            return "Can't call \(method) after queryStartingAtValue, queryStartingAfterValue, queryEndingAtValue, queryEndingBeforeValue or queryEqualToValue was previously called"
        default:
            return nil
        }
    }

    /// The builder's endpoint checks as the iOS SDK words them (nil: not one of them).
    static func endpoint(_ kind: QueryError.Kind) -> String? {
        switch kind {
        case .keyOrderingWithChildKey(start: true):
            return "Can't use queryStartingAtValue:childKey:, queryStartingAfterValue:childKey:, or queryEqualTo:andChildKey: in combination with queryOrderedByKey"
        case .keyOrderingWithChildKey(start: false):
            return "Can't use queryEndingAtValue:childKey: or queryEndingBeforeValue:childKey: queryEqualToValue:childKey: in combination with queryOrderedByKey"
        case .keyOrderingWithNonString(start: true):
            return "Can't use queryStartingAtValue: or queryStartingAfterValue: with non-string types when used with queryOrderedByKey"
        case .keyOrderingWithNonString(start: false):
            return "Can't use queryEndingAtValue: or queryEndingBeforeValue: with other types than string in combination with queryOrderedByKey"
        case .invalidPriority:
            return "When using queryOrderedByPriority, values provided to queryStartingAtValue:, queryStartingAfterValue:, queryEndingAtValue:, queryEndingBeforeValue:, or queryEqualToValue: must be valid priorities."
        case .other:
            return nil
        }
    }
}
