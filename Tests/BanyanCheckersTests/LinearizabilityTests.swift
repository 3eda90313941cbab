import BanyanCheckers
import Foundation
import Testing

private let corpus: String = {
    var parts = #filePath.split(separator: "/", omittingEmptySubsequences: false)
    parts.removeLast(3)
    return parts.joined(separator: "/") + "/Tests/Corpora/jepsen-etcd-histories"
}()

private typealias RegisterOp = HistoryOperation<RegisterModel.Input, RegisterModel.Output>

private func op(_ client: Int, _ input: RegisterModel.Input, _ output: RegisterModel.Output, _ call: Int, _ ret: Int?) -> RegisterOp {
    HistoryOperation(client: client, input: input, output: output, callTime: call, returnTime: ret)
}

/// (file, expected verdict) for every line of verdicts.tsv.
private func verdictTable() -> [(String, String)] {
    guard let table = try? String(contentsOfFile: corpus + "/verdicts.tsv", encoding: .utf8) else { return [] }
    return table.split(separator: "\n").compactMap { line in
        let parts = line.split(separator: "\t").map(String.init)
        return parts.count == 2 ? (parts[0], parts[1]) : nil
    }
}

@Suite struct LinearizabilityTests {
    @Test("the verdict table is complete: 102 histories, 23 linearizable")
    func table() {
        let table = verdictTable()
        #expect(table.count == 102)
        #expect(table.filter { $0.1 == "linearizable" }.count == 23)
    }

    @Test("every Jepsen etcd history gets the verdict the reference checker gives it", arguments: verdictTable())
    func jepsenVerdict(file: String, expectedText: String) throws {
        let expected: LinearizabilityVerdict = expectedText == "linearizable" ? .linearizable : .notLinearizable
        let history = HistoryParsers.jepsenRegister(try String(contentsOfFile: corpus + "/" + file, encoding: .utf8))
        #expect(history.count > 10, "\(file) parsed to \(history.count) operations")
        let verdict = LinearizabilityChecker.checkRegister(history)
        #expect(verdict == expected, "\(file): expected \(expected), got \(verdict)")
    }

    @Test("Porcupine's KV histories: -ok linearizable, -bad not, checked per key", arguments: ["c01", "c10", "c50"])
    func keyValue(name: String) throws {
        for (suffix, expected) in [("ok", LinearizabilityVerdict.linearizable), ("bad", .notLinearizable)] {
            let history = HistoryParsers.keyValue(try String(contentsOfFile: corpus + "/kv/\(name)-\(suffix).txt", encoding: .utf8))
            #expect(history.count > 10)
            let verdict = LinearizabilityChecker.checkKeyValue(history)
            #expect(verdict == expected, "\(name)-\(suffix)")
        }
    }

    @Test("hand-made histories: stale read, concurrency, lost cas, unknown writes, touching intervals")
    func small() {
        let check = { (h: [RegisterOp]) in LinearizabilityChecker.checkRegister(h) }
        // A read after a completed write must see it.
        #expect(check([op(0, .write(1), .written, 0, 1), op(1, .read, .value(nil), 2, 3)]) == .notLinearizable)
        // Concurrent with the write, either value is fine.
        #expect(check([op(0, .write(1), .written, 0, 3), op(1, .read, .value(nil), 1, 2)]) == .linearizable)
        #expect(check([op(0, .write(1), .written, 0, 3), op(1, .read, .value(1), 1, 2)]) == .linearizable)
        // Two cas from the same value cannot both succeed.
        let lost = [op(0, .write(0), .written, 0, 1), op(1, .cas(expected: 0, new: 1), .swapped(true), 2, 5),
                    op(2, .cas(expected: 0, new: 2), .swapped(true), 3, 6)]
        #expect(check(lost) == .notLinearizable)
        // A write that timed out may have happened (a later read saw it) ...
        #expect(check([op(0, .write(7), .unknown, 0, nil), op(1, .read, .value(7), 5, 6)]) == .linearizable)
        // ... or not.
        #expect(check([op(0, .write(7), .unknown, 0, nil), op(1, .read, .value(nil), 5, 6)]) == .linearizable)
        // But it cannot take effect before it was called.
        #expect(check([op(1, .read, .value(7), 0, 1), op(0, .write(7), .unknown, 2, nil)]) == .notLinearizable)
        // Closed intervals: a read whose call touches the write's return may see either value.
        #expect(check([op(0, .write(1), .written, 0, 5), op(1, .read, .value(nil), 5, 6)]) == .linearizable)
        // A failed cas must have seen a different value.
        #expect(check([op(0, .write(3), .written, 0, 1), op(1, .cas(expected: 3, new: 4), .swapped(false), 2, 3)]) == .notLinearizable)
        #expect(check([]) == .linearizable)
    }

    @Test("a step budget gives unknown, never a pass")
    func budget() throws {
        let history = HistoryParsers.jepsenRegister(try String(contentsOfFile: corpus + "/jepsen/etcd_000.log", encoding: .utf8))
        #expect(LinearizabilityChecker.checkRegister(history, maxSteps: 3) == .unknown)
    }

    @Test("flipping one read value in a linearizable history is caught")
    func mutation() throws {
        let history = HistoryParsers.jepsenRegister(try String(contentsOfFile: corpus + "/jepsen/etcd_002.log", encoding: .utf8))
        #expect(LinearizabilityChecker.checkRegister(history) == .linearizable)
        var caught = 0
        var tried = 0
        for i in history.indices {
            guard case .value(let v?) = history[i].output, history[i].returnTime != nil else { continue }
            var mutated = history
            mutated[i].output = .value(v + 100)  // a value nobody wrote
            tried += 1
            if LinearizabilityChecker.checkRegister(mutated) == .notLinearizable { caught += 1 }
            if tried == 20 { break }
        }
        #expect(tried > 0 && caught == tried)
    }
}
