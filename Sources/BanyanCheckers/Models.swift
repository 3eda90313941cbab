/// A register that starts absent, with read, write and compare-and-set (Jepsen's etcd test).
public struct RegisterModel: SequentialModel {
    public enum Input: Sendable, Equatable {
        case read
        case write(Int)
        case cas(expected: Int, new: Int)
    }

    public enum Output: Sendable, Equatable {
        /// A read's value (nil: absent).
        case value(Int?)
        /// A write's acknowledgement.
        case written
        /// Whether a cas swapped.
        case swapped(Bool)
        /// The outcome is not known (timed out).
        case unknown
    }

    public init() {}
    public var initialState: Int? { nil }

    public func step(_ state: Int?, _ input: Input, _ output: Output) -> Int?? {
        switch (input, output) {
        case (.read, .value(let v)): return v == state ? .some(state) : nil
        case (.read, .unknown): return .some(state)
        case (.write(let v), .written), (.write(let v), .unknown): return .some(v)
        case let (.cas(expected, new), .swapped(true)): return state == expected ? .some(new) : nil
        case (.cas(let expected, _), .swapped(false)): return state != expected ? .some(state) : nil
        case let (.cas(expected, new), .unknown): return .some(state == expected ? new : state)
        default: return nil
        }
    }
}

/// Independent string registers by key with get, put and append (Porcupine's KV histories).
public struct KeyValueModel: SequentialModel {
    public enum Input: Sendable, Equatable {
        case get(key: String)
        case put(key: String, value: String)
        case append(key: String, value: String)

        public var key: String {
            switch self {
            case .get(let k), .put(let k, _), .append(let k, _): return k
            }
        }
    }

    public enum Output: Sendable, Equatable {
        case value(String)
        case done
        case unknown
    }

    public init() {}
    public var initialState: String { "" }

    public func step(_ state: String, _ input: Input, _ output: Output) -> String? {
        switch (input, output) {
        case (.get, .value(let v)): return v == state ? state : nil
        case (.get, .unknown): return state
        case (.put(_, let v), .done), (.put(_, let v), .unknown): return v
        case (.append(_, let v), .done), (.append(_, let v), .unknown): return state + v
        default: return nil
        }
    }
}

extension LinearizabilityChecker {
    /// A register history (specialised here, so callers in unoptimised code stay fast).
    public static func checkRegister(
        _ history: [HistoryOperation<RegisterModel.Input, RegisterModel.Output>], maxSteps: Int = 50_000_000
    ) -> LinearizabilityVerdict {
        check(RegisterModel(), history, maxSteps: maxSteps)
    }

    /// A key-value history, checked per key.
    public static func checkKeyValue(
        _ history: [HistoryOperation<KeyValueModel.Input, KeyValueModel.Output>], maxSteps: Int = 50_000_000
    ) -> LinearizabilityVerdict {
        check(KeyValueModel(), history, partition: { $0.input.key }, maxSteps: maxSteps)
    }
}

/// Parsers for the public history formats in `testdata/jepsen-etcd-histories`.
public enum HistoryParsers {
    /// Jepsen etcd register logs: `INFO jepsen.util - P <tab> :invoke|:ok|:fail|:info <tab> :f <tab> value`.
    /// Times are line numbers. A call left without a return (`:info`, timed out) has an unknown
    /// outcome; a read that failed has an unknown value.
    public static func jepsenRegister(_ text: String) -> [HistoryOperation<RegisterModel.Input, RegisterModel.Output>] {
        var ops: [HistoryOperation<RegisterModel.Input, RegisterModel.Output>] = []
        var pending: [Int: Int] = [:]
        for (line, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            guard let dash = raw.firstRange(of: "jepsen.util - ") else { continue }
            let fields = raw[dash.upperBound...].split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
            guard fields.count >= 3, let process = Int(fields[0]) else { continue }
            let type = fields[1]
            let function = fields[2]
            let value = Array(fields.dropFirst(3))
            func int(_ s: String) -> Int? { Int(s.trimmingCharacters(in: "[]")) }
            switch type {
            case ":invoke":
                let input: RegisterModel.Input
                switch function {
                case ":read": input = .read
                case ":write":
                    guard let v = value.first.flatMap(int) else { continue }
                    input = .write(v)
                case ":cas":
                    guard value.count >= 2, let a = int(value[0]), let b = int(value[1]) else { continue }
                    input = .cas(expected: a, new: b)
                default: continue
                }
                pending[process] = ops.count
                ops.append(HistoryOperation(client: process, input: input, output: .unknown, callTime: line, returnTime: nil))
            case ":ok", ":fail":
                guard let i = pending.removeValue(forKey: process) else { continue }
                ops[i].returnTime = line
                switch (ops[i].input, type) {
                case (.read, ":ok"): ops[i].output = .value(value.first == "nil" ? nil : value.first.flatMap(int))
                case (.read, _): ops[i].output = .unknown
                case (.write, ":ok"): ops[i].output = .written
                case (.write, _): ops[i].output = .unknown  // not seen in the data; treated as unknown
                case (.cas, ":ok"): ops[i].output = .swapped(true)
                case (.cas, _): ops[i].output = .swapped(false)
                }
            default:
                continue  // :info and anything else: the call stays without a return
            }
        }
        return ops
    }

    /// Porcupine's KV histories: one EDN map per line with :process, :type, :f, :key, :value.
    public static func keyValue(_ text: String) -> [HistoryOperation<KeyValueModel.Input, KeyValueModel.Output>] {
        var ops: [HistoryOperation<KeyValueModel.Input, KeyValueModel.Output>] = []
        var pending: [Int: Int] = [:]
        for (line, raw) in text.split(separator: "\n").enumerated() {
            let s = String(raw)
            guard let process = field(s, ":process ").flatMap({ Int($0) }), let type = field(s, ":type "),
                let function = field(s, ":f "), let key = quoted(s, ":key ")
            else { continue }
            let value = quoted(s, ":value ")
            switch type {
            case ":invoke":
                let input: KeyValueModel.Input
                switch function {
                case ":get": input = .get(key: key)
                case ":put": input = .put(key: key, value: value ?? "")
                case ":append": input = .append(key: key, value: value ?? "")
                default: continue
                }
                pending[process] = ops.count
                ops.append(HistoryOperation(client: process, input: input, output: .unknown, callTime: line, returnTime: nil))
            case ":ok":
                guard let i = pending.removeValue(forKey: process) else { continue }
                ops[i].returnTime = line
                if case .get = ops[i].input { ops[i].output = .value(value ?? "") } else { ops[i].output = .done }
            default:
                continue
            }
        }
        return ops
    }

    /// The token after `marker`, up to a comma or closing brace.
    static func field(_ s: String, _ marker: String) -> String? {
        guard let r = s.firstRange(of: marker) else { return nil }
        return String(s[r.upperBound...].prefix { $0 != "," && $0 != "}" })
    }

    /// The quoted string after `marker` (nil for `nil`).
    static func quoted(_ s: String, _ marker: String) -> String? {
        guard let r = s.firstRange(of: marker), s[r.upperBound...].first == "\"" else { return nil }
        let rest = s[s.index(after: r.upperBound)...]
        return String(rest.prefix { $0 != "\"" })
    }
}

extension String {
    func trimmingCharacters(in set: String) -> String {
        var s = Substring(self)
        while let c = s.first, set.contains(c) { s.removeFirst() }
        while let c = s.last, set.contains(c) { s.removeLast() }
        return String(s)
    }
}
