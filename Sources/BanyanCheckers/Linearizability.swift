/// A linearizability checker: Wing & Gong's search with Lowe's memoisation, in the shape of
/// Porcupine (which etcd's robustness tests use). Pure and generic over a sequential model;
/// used by the simulator and the real-process tests to check client histories.
///
/// - Intervals are closed: operations whose endpoints touch are concurrent.
/// - An operation whose outcome is unknown (timed out) has `returnTime == nil`: it may take
///   effect at any point after its call, including never (it is placed after everything).
/// - Histories are split per object (`partition`) and each part is checked alone
///   (linearizability is local).
/// - A step budget bounds the search; running out gives `.unknown`, never a pass.

/// A sequential specification of one object.
public protocol SequentialModel {
    associatedtype State: Hashable
    associatedtype Input
    associatedtype Output

    var initialState: State { get }
    /// The state after applying `input` with the observed `output`, or nil when that output is
    /// impossible from `state`.
    func step(_ state: State, _ input: Input, _ output: Output) -> State?
}

/// One operation of a history.
public struct HistoryOperation<Input, Output> {
    // Sendable when its input and output are (see the extension below).

    public var client: Int
    public var input: Input
    public var output: Output
    public var callTime: Int
    /// nil when the outcome is unknown (the operation may or may not have taken effect).
    public var returnTime: Int?

    public init(client: Int, input: Input, output: Output, callTime: Int, returnTime: Int?) {
        self.client = client
        self.input = input
        self.output = output
        self.callTime = callTime
        self.returnTime = returnTime
    }
}

public enum LinearizabilityVerdict: Sendable, Equatable {
    case linearizable
    case notLinearizable
    /// The step budget ran out before a verdict.
    case unknown
}

public enum LinearizabilityChecker {
    /// Checks a history of one object.
    public static func check<M: SequentialModel>(
        _ model: M, _ history: [HistoryOperation<M.Input, M.Output>], maxSteps: Int = 50_000_000
    ) -> LinearizabilityVerdict {
        var search = Search(model: model, history: history)
        return search.run(maxSteps: maxSteps)
    }

    /// Checks a history of independent objects, split by `partition` (for example by key).
    public static func check<M: SequentialModel, Key: Hashable>(
        _ model: M, _ history: [HistoryOperation<M.Input, M.Output>], partition: (HistoryOperation<M.Input, M.Output>) -> Key,
        maxSteps: Int = 50_000_000
    ) -> LinearizabilityVerdict {
        var parts: [Key: [HistoryOperation<M.Input, M.Output>]] = [:]
        var order: [Key] = []
        for op in history {
            let key = partition(op)
            if parts[key] == nil { order.append(key) }
            parts[key, default: []].append(op)
        }
        var sawUnknown = false
        for key in order {
            switch check(model, parts[key] ?? [], maxSteps: maxSteps) {
            case .notLinearizable: return .notLinearizable
            case .unknown: sawUnknown = true
            case .linearizable: break
            }
        }
        return sawUnknown ? .unknown : .linearizable
    }
}

/// The search state: entries (a call and a return per operation) in time order, kept in a
/// doubly linked list from which linearized operations are lifted out.
private struct Search<M: SequentialModel> {
    let model: M
    let history: [HistoryOperation<M.Input, M.Output>]
    /// Entry e: operation `op[e]`, `isCall[e]`, `match[e]` (the other entry of the operation).
    var op: [Int] = []
    var isCall: [Bool] = []
    var match: [Int] = []
    /// Linked list over entries; index `head` is a sentinel before the first entry.
    var next: [Int] = []
    var prev: [Int] = []
    let none = -1
    var head = 0

    /// A visited (linearized set, state) pair. The state's hash is computed once: the set grows
    /// to millions of entries, and rehashing long states on every resize dominated the search.
    struct CacheKey: Hashable {
        var linearized: Bits
        var state: M.State
        var stateHash: Int

        init(linearized: Bits, state: M.State) {
            self.linearized = linearized
            self.state = state
            self.stateHash = state.hashValue
        }

        func hash(into hasher: inout Hasher) {
            hasher.combine(linearized)
            hasher.combine(stateHash)
        }

        static func == (a: CacheKey, b: CacheKey) -> Bool {
            a.stateHash == b.stateHash && a.linearized == b.linearized && a.state == b.state
        }
    }

    /// The set of linearized operations: four inline words for up to 256 operations (no
    /// allocation per search step), an array beyond that.
    enum Bits: Hashable {
        case small(UInt64, UInt64, UInt64, UInt64)
        case large([UInt64])

        init(count: Int) {
            self = count <= 256 ? .small(0, 0, 0, 0) : .large([UInt64](repeating: 0, count: (count + 63) / 64))
        }

        func setting(_ i: Int, _ on: Bool) -> Bits {
            let bit: UInt64 = 1 << UInt64(i % 64)
            func apply(_ w: UInt64) -> UInt64 { on ? w | bit : w & ~bit }
            switch self {
            case .small(var a, var b, var c, var d):
                switch i / 64 {
                case 0: a = apply(a)
                case 1: b = apply(b)
                case 2: c = apply(c)
                default: d = apply(d)
                }
                return .small(a, b, c, d)
            case .large(var words):
                words[i / 64] = apply(words[i / 64])
                return .large(words)
            }
        }
    }

    init(model: M, history: [HistoryOperation<M.Input, M.Output>]) {
        self.model = model
        self.history = history
        let latest = history.reduce(0) { Swift.max($0, Swift.max($1.callTime, $1.returnTime ?? $1.callTime)) }
        // (time, kind, operation): calls sort before returns at equal times (closed intervals);
        // unknown outcomes return after everything.
        var events: [(time: Int, kind: Int, op: Int)] = []
        for (i, o) in history.enumerated() {
            events.append((o.callTime, 0, i))
            events.append((o.returnTime ?? latest + 1 + i, 1, i))
        }
        events.sort { a, b in a.time != b.time ? a.time < b.time : (a.kind != b.kind ? a.kind < b.kind : a.op < b.op) }
        let n = events.count
        head = n
        op = events.map(\.op)
        isCall = events.map { $0.kind == 0 }
        match = [Int](repeating: 0, count: n)
        var callEntry = [Int](repeating: 0, count: history.count)
        for (e, event) in events.enumerated() where event.kind == 0 { callEntry[event.op] = e }
        for (e, event) in events.enumerated() where event.kind == 1 {
            match[e] = callEntry[event.op]
            match[callEntry[event.op]] = e
        }
        next = [Int](repeating: none, count: n + 1)
        prev = [Int](repeating: none, count: n + 1)
        var last = head
        for e in 0..<n {
            next[last] = e
            prev[e] = last
            last = e
        }
    }

    @inline(__always)
    mutating func remove(_ e: Int) {
        next[prev[e]] = next[e]
        if next[e] != none { prev[next[e]] = prev[e] }
    }

    @inline(__always)
    mutating func restore(_ e: Int) {
        next[prev[e]] = e
        if next[e] != none { prev[next[e]] = e }
    }

    /// Removes a call entry and its return from the list.
    mutating func lift(_ call: Int) {
        remove(call)
        remove(match[call])
    }

    /// Puts them back (in reverse order of lifting).
    mutating func unlift(_ call: Int) {
        restore(match[call])
        restore(call)
    }

    mutating func run(maxSteps: Int) -> LinearizabilityVerdict {
        var state = model.initialState
        var linearized = Bits(count: history.count)
        var cache = Set<CacheKey>()
        var stack: [(call: Int, state: M.State)] = []
        var entry = next[head]
        var steps = 0
        while next[head] != none {
            steps += 1
            if steps > maxSteps { return .unknown }
            if entry == none { return .notLinearizable }
            if isCall[entry] {
                let i = op[entry]
                if let newState = model.step(state, history[i].input, history[i].output) {
                    let bits = linearized.setting(op[entry], true)
                    if cache.insert(CacheKey(linearized: bits, state: newState)).inserted {
                        stack.append((entry, state))
                        state = newState
                        linearized = bits
                        lift(entry)
                        entry = next[head]
                        continue
                    }
                }
                entry = next[entry]
            } else {
                // An operation that already returned is not linearized yet: nothing later may
                // go first. Undo the last choice.
                guard let (call, previous) = stack.popLast() else { return .notLinearizable }
                state = previous
                linearized = linearized.setting(op[call], false)
                unlift(call)
                entry = next[call]
            }
        }
        return .linearizable
    }
}

extension HistoryOperation: Sendable where Input: Sendable, Output: Sendable {}
