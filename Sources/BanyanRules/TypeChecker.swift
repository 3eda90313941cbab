/// The static types of the expression language, as far as they are known when the rules are set.
/// `any` is a value only known at run time (`val()`, members of `auth`); `object` is `auth` or
/// its `token` (a JSON object, or null when signed out).
enum StaticType: String, Sendable, Equatable {
    case boolean, number, string, null, snapshot, object, query, regex, list, any

    var name: String {
        switch self {
        case .boolean: return "boolean"
        case .number: return "number"
        case .string: return "string"
        case .null: return "null"
        case .snapshot: return "snapshot"
        case .object: return "object"
        case .query: return "query"
        case .regex: return "regular expression"
        case .list: return "list"
        case .any: return "value"
        }
    }

    func canBe(_ other: StaticType) -> Bool { self == other || self == .any }
}

extension Expression {
    /// Whether this is the bare `auth` variable.
    var isAuth: Bool {
        if case .variable(.auth) = kind { return true }
        return false
    }
}

/// The kind of a rule: which variables it may use and what it must return.
public enum RuleKind: String, Sendable, Hashable, CaseIterable {
    case read = ".read"
    case write = ".write"
    case validate = ".validate"
}

/// Type checking at set time: every expression must be boolean, mention only variables and
/// `$captures` in scope, and call only methods its receiver has. Errors carry the line and column
/// of the offending part.
struct TypeChecker {
    let kind: RuleKind
    let captures: Set<String>
    let source: SourceText

    func fail(_ message: String, _ expression: Expression) -> RulesError {
        source.error(.type, message, at: expression.offset)
    }

    static let snapshotMethods: Set<String> = [
        "val", "child", "parent", "hasChild", "hasChildren", "exists", "getPriority", "isNumber", "isString", "isBoolean",
    ]
    static let stringMethods: Set<String> = ["contains", "beginsWith", "endsWith", "replace", "toLowerCase", "toUpperCase", "matches"]
    static let queryMembers: [String: StaticType] = [
        "orderByChild": .any, "orderByKey": .boolean, "orderByValue": .boolean, "orderByPriority": .boolean,
        "startAt": .any, "endAt": .any, "equalTo": .any, "limitToFirst": .any, "limitToLast": .any,
    ]

    /// Checks a whole rule; `start` is where its expression begins (where a non-boolean rule's
    /// error points).
    func checkRule(_ expression: Expression, start: Int) throws(RulesError) {
        let type = try check(expression)
        guard type.canBe(.boolean) else {
            throw source.error(.type, "A \(kind.rawValue) rule must be boolean, but this expression is a \(type.name)", at: start)
        }
    }

    func check(_ e: Expression) throws(RulesError) -> StaticType {
        switch e.kind {
        case .null: return .null
        case .bool: return .boolean
        case .number: return .number
        case .string: return .string
        case .regex: throw fail("A regular expression can only be the argument of matches()", e)
        case .array: throw fail("A list can only be the argument of hasChildren()", e)
        case .variable(let v):
            switch v {
            case .auth: return .object
            case .data, .root: return .snapshot
            case .newData:
                guard kind != .read else { throw fail("newData is not available in .read rules", e) }
                return .snapshot
            case .query:
                guard kind == .read else { throw fail("query is only available in .read rules", e) }
                return .query
            case .currentTime: return .number
            }
        case .capture(let name):
            guard captures.contains(name) else { throw fail("Unknown variable '\(name)': no enclosing \(name) location", e) }
            return .string
        case .member(let base, let name):
            let type = try check(base)
            switch type {
            case .snapshot:
                if TypeChecker.snapshotMethods.contains(name) { throw fail("'\(name)' is a snapshot method: call it as \(name)()", e) }
                throw fail("A snapshot has no property '\(name)'", e)
            case .string:
                guard name == "length" else { throw fail("A string has no property '\(name)'", e) }
                return .number
            case .any: return .any
            case .object:
                // `auth.uid` and `auth.provider` are strings; `token` is the claims object; other
                // members (Firebase 2.x custom-token data, nested claims) are only known at run time.
                switch name {
                case "token": return .object
                case "uid", "provider": return base.isAuth ? .string : .any
                default: return .any
                }
            case .query:
                guard let t = TypeChecker.queryMembers[name] else { throw fail("query has no property '\(name)'", e) }
                return t
            default: throw fail("A \(type.name) has no property '\(name)'", e)
            }
        case .index(let base, let index):
            let type = try check(base)
            guard type == .object || type == .any else { throw fail("A \(type.name) cannot be indexed with []", e) }
            let indexType = try check(index)
            guard indexType.canBe(.string) || indexType == .number else { throw fail("An index must be a string, not a \(indexType.name)", index) }
            return .any
        case .call(let base, let name, let arguments):
            return try checkCall(e, base, name, arguments)
        case .unary(let op, let operand):
            let type = try check(operand)
            switch op {
            case .not:
                guard type.canBe(.boolean) else { throw fail("'!' needs a boolean, not a \(type.name)", e) }
                return .boolean
            case .negate:
                guard type.canBe(.number) else { throw fail("'-' needs a number, not a \(type.name)", e) }
                return .number
            }
        case .binary(let op, let left, let right):
            let l = try check(left)
            let r = try check(right)
            return try checkBinary(e, op, l, r)
        case .conditional(let condition, let whenTrue, let whenFalse):
            let c = try check(condition)
            guard c.canBe(.boolean) else { throw fail("The condition of '?:' must be boolean, not a \(c.name)", condition) }
            let a = try check(whenTrue)
            let b = try check(whenFalse)
            return a == b ? a : .any
        }
    }

    func checkBinary(_ e: Expression, _ op: Expression.BinaryOperator, _ l: StaticType, _ r: StaticType) throws(RulesError) -> StaticType {
        switch op {
        case .add:
            if l == .number && r == .number { return .number }
            if l == .string && r == .string { return .string }
            if (l == .any && (r.canBe(.number) || r.canBe(.string))) || (r == .any && (l.canBe(.number) || l.canBe(.string))) {
                return l == .any ? (r == .any ? .any : r) : l
            }
            throw fail("'+' needs two numbers or two strings, not \(l.name) and \(r.name)", e)
        case .subtract, .multiply, .divide, .remainder:
            guard l.canBe(.number) && r.canBe(.number) else {
                throw fail("'\(op.rawValue)' needs numbers, not \(l.name) and \(r.name)", e)
            }
            return .number
        case .less, .lessOrEqual, .greater, .greaterOrEqual:
            let ok = (l.canBe(.number) && r.canBe(.number)) || (l.canBe(.string) && r.canBe(.string))
            guard ok else { throw fail("'\(op.rawValue)' compares two numbers or two strings, not \(l.name) and \(r.name)", e) }
            return .boolean
        case .equal, .notEqual, .strictEqual, .strictNotEqual:
            for t in [l, r] where t == .snapshot || t == .query || t == .regex || t == .list {
                throw fail("A \(t.name) cannot be compared (compare snapshot values with val())", e)
            }
            return .boolean
        case .and, .or:
            guard l.canBe(.boolean) && r.canBe(.boolean) else {
                throw fail("'\(op.rawValue)' needs booleans, not \(l.name) and \(r.name)", e)
            }
            return .boolean
        }
    }

    func checkCall(_ e: Expression, _ base: Expression, _ name: String, _ arguments: [Expression]) throws(RulesError) -> StaticType {
        let type = try check(base)
        func arity(_ n: Int) throws(RulesError) {
            guard arguments.count == n else {
                throw fail("\(name)() takes \(n) argument\(n == 1 ? "" : "s"), not \(arguments.count)", e)
            }
        }
        func stringArgument(_ k: Int) throws(RulesError) {
            let t = try check(arguments[k])
            guard t.canBe(.string) else { throw fail("\(name)() needs a string argument, not a \(t.name)", arguments[k]) }
        }
        switch type {
        case .snapshot:
            switch name {
            case "val", "getPriority":
                try arity(0)
                return .any
            case "exists", "isNumber", "isString", "isBoolean":
                try arity(0)
                return .boolean
            case "parent":
                try arity(0)
                return .snapshot
            case "child":
                try arity(1)
                try stringArgument(0)
                return .snapshot
            case "hasChild":
                try arity(1)
                try stringArgument(0)
                return .boolean
            case "hasChildren":
                guard arguments.count <= 1 else { throw fail("hasChildren() takes at most one list of keys", e) }
                if let list = arguments.first {
                    guard case .array(let items) = list.kind else { throw fail("hasChildren() takes a list literal such as ['a', 'b']", list) }
                    for item in items {
                        let t = try check(item)
                        guard t.canBe(.string) else { throw fail("hasChildren() keys must be strings, not a \(t.name)", item) }
                    }
                }
                return .boolean
            default:
                if TypeChecker.stringMethods.contains(name) { throw fail("\(name)() is a string method; call it on val()", e) }
                throw fail("A snapshot has no method '\(name)'", e)
            }
        case .string, .any:
            switch name {
            case "contains", "beginsWith", "endsWith":
                try arity(1)
                try stringArgument(0)
                return .boolean
            case "replace":
                try arity(2)
                try stringArgument(0)
                try stringArgument(1)
                return .string
            case "toLowerCase", "toUpperCase":
                try arity(0)
                return .string
            case "matches":
                try arity(1)
                guard case .regex = arguments[0].kind else { throw fail("matches() takes a regular expression literal such as /^a+$/", arguments[0]) }
                return .boolean
            default:
                if TypeChecker.snapshotMethods.contains(name) { throw fail("\(name)() is a snapshot method, not a method of a \(type.name)", e) }
                throw fail("A \(type.name) has no method '\(name)'", e)
            }
        default:
            throw fail("A \(type.name) has no method '\(name)'", e)
        }
    }
}
