public import BanyanStateMachine
public import BanyanTree

/// From a v5 write request (`p`, `m`, `o`, `om`, `oc`) to the state machine's command, checked
/// before it is proposed (`WriteValidation`, as REST checks), and from the outcome back to the
/// protocol's answer (docs/realtime.md). Pure.
public enum SessionWrites {
    /// A write refused before it is proposed: the answer's status and message.
    public struct Refusal: Error, Sendable, Equatable {
        public var status: String
        public var message: String
    }

    /// The command for `write`, issued by a connection whose secret is `secret`, held by its node
    /// under lease `holder` (its onDisconnect commands carry both). Values keep the client's own
    /// bytes.
    public static func command(
        for write: SessionCore.Write, secret: UInt64, holder: UInt64 = 0, maxUpdatePaths: Int = WriteValidation.defaultMaxUpdatePaths
    ) -> Result<Command, Refusal> {
        do throws(WriteValidation.Problem) {
            switch write {
            case let .put(path, value, hash):
                let json = Array(value.bytes)
                try WriteValidation.value(json, at: path)
                guard let hash else { return .success(.set(path: path.description, json: json)) }
                if path.isPriority { return .failure(refusal("A transaction cannot set a priority alone.")) }
                return .success(.compareAndSet(path: path.path.description, expectedHash: hash, json: json))
            case let .merge(path, value):
                return .success(.update(path: path.description, entries: try WriteValidation.updateItems(Array(value.bytes), at: path, maxPaths: maxUpdatePaths)))
            case let .onDisconnectPut(path, value):
                if path.isPriority { return .failure(refusal("onDisconnect cannot set a priority alone; set the value with its priority.")) }
                let json = Array(value.bytes)
                try WriteValidation.value(json, at: path.path)
                return .success(.onDisconnectSet(path: path.path.description, json: json, secret: secret, holder: holder))
            case let .onDisconnectMerge(path, value):
                let items = try WriteValidation.updateItems(Array(value.bytes), at: path, maxPaths: maxUpdatePaths)
                return .success(.onDisconnectUpdate(path: path.description, entries: items, secret: secret, holder: holder))
            case .onDisconnectCancel(let path):
                return .success(.onDisconnectCancel(path: path.description, secret: secret))
            }
        } catch {
            return .failure(refusal(error.description))
        }
    }

    /// The answer for an applied write: status and data (JSON).
    public static func answer(_ outcome: StateMachine.Outcome) -> (status: String, data: JSONValue) {
        switch outcome {
        case .ok: return ("ok", .string(""))
        // Applied earlier, outcome not known here (a compare-and-set may have been datastale):
        // never `ok` for a write that may not have applied.
        case .duplicate: return ("failure", .string("The write was applied earlier; its outcome is not known here."))
        case .datastale: return ("datastale", .string("The transaction's hash does not match the current data."))
        case .rejected(let e): return ("failure", .string(e.message))
        case .refused(let reason): return ("failure", .string(reason))
        case .malformed: return ("failure", .string("The write could not be decoded by the state machine."))
        // Never answered (the replica proposes it again after its predecessor), but total.
        case .outOfOrder: return ("failure", .string("The write arrived before an earlier write of its connection."))
        // The SDKs raise PERMISSION_DENIED for this status (the reason stays in the server's log).
        case .permissionDenied: return ("permission_denied", .string("Permission denied"))
        case .noSpace(let nodes): return ("failure", .string(StateMachine.Outcome.noSpaceMessage(nodes)))
        case let .overQuota(namespace, used, wouldHold, quota):
            return ("failure", .string(StateMachine.Outcome.overQuotaMessage(namespace: namespace, used: used, wouldHold: wouldHold, quota: quota)))
        // A client write resent after a reconnect whose first copy was decided: that copy's answer.
        case .alreadyApplied(let earlier): return (earlier.status, .string(earlier.message))
        }
    }

    private static func refusal(_ message: String) -> Refusal { Refusal(status: "failure", message: message) }
}
