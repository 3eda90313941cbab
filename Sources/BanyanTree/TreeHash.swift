/// Firebase's hash of a value (the SDKs' "node hash", the `h` of transactions and listens): base64 of SHA-1 over a canonical
/// text form of the tree. Bit-for-bit compatible with the Firebase SDKs (spec section 3.9).
extension Tree {
    /// The hash: `""` for the empty tree, otherwise 28 characters of base64.
    public var hashString: String {
        switch storage {
        case .empty:
            return ""
        case .leaf(let leaf, let priority):
            var text = Tree.priorityPrefix(priority)
            switch leaf {
            case .bool(let b): text += "boolean:" + (b ? "true" : "false")
            case .int(let i): text += "number:" + Tree.hex16(Double(i))
            case .double(let d): text += "number:" + Tree.hex16(d)
            case .string(let s): text += "string:" + s
            }
            var sha = SHA1()
            sha.update(text)
            return Base64.encode(sha.finalize())
        case .children(let map, let priority, _):
            var sha = SHA1()
            sha.update(Tree.priorityPrefix(priority))
            var anyPriority = false
            for (_, child) in map.elements() where child.priority != .none {
                anyPriority = true
                break
            }
            if anyPriority {
                // Priority order: by priority, then key.
                var ordered = Array(map.elements())
                ordered.sort { IndexEntry(value: $0.value.priority.tree, key: $0.key) < IndexEntry(value: $1.value.priority.tree, key: $1.key) }
                for (key, child) in ordered { Tree.hashChild(key, child, into: &sha) }
            } else {
                map.forEach { key, child in Tree.hashChild(key, child, into: &sha) }
            }
            return Base64.encode(sha.finalize())
        }
    }

    private static func hashChild(_ key: ChildKey, _ child: Tree, into sha: inout SHA1) {
        let childHash = child.hashString
        guard !childHash.isEmpty else { return }
        sha.update(":" + key.string + ":" + childHash)
    }

    static func priorityPrefix(_ priority: Priority) -> String {
        switch priority {
        case .none: return ""
        case .number(let d): return "priority:number:" + hex16(d) + ":"
        case .string(let s): return "priority:string:" + s + ":"
        }
    }

    /// The 8 bytes of the IEEE-754 binary64 form, big-endian, lower-case hex.
    static func hex16(_ d: Double) -> String {
        let bits = d.bitPattern
        let digits = String(bits, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
