import BanyanTree

extension ClientCore {
    /// The unanswered writes in the order they were made, each under a sequence number (its
    /// position since the queue began): appending, finding by sequence or id, and removing one
    /// (usually the oldest) cost O(1) amortized, whatever the queue's length.
    struct WriteQueue: Sendable {
        /// Slot `i` holds the write with sequence `firstSeq + i` (nil: answered).
        private var slots: [PendingWrite?] = []
        /// The first slot that may hold a write (those before it are nil).
        private var head = 0
        private var firstSeq: UInt64 = 1
        private var byID: [WriteID: UInt64] = [:]
        private(set) var count = 0

        var isEmpty: Bool { count == 0 }

        /// The sequence the next appended write gets.
        var endSeq: UInt64 { firstSeq + UInt64(slots.count) }

        /// The sequence of the oldest write (or `endSeq` when empty).
        var startSeq: UInt64 { firstSeq + UInt64(head) }

        var first: PendingWrite? {
            var i = head
            while i < slots.count {
                if let w = slots[i] { return w }
                i += 1
            }
            return nil
        }

        /// Sequences of the writes, oldest first.
        var seqs: [UInt64] {
            var list: [UInt64] = []
            list.reserveCapacity(count)
            for i in head..<slots.count where slots[i] != nil { list.append(firstSeq + UInt64(i)) }
            return list
        }

        /// The writes, oldest first.
        var all: [PendingWrite] { slots[head...].compactMap { $0 } }

        @discardableResult
        mutating func append(_ write: PendingWrite) -> UInt64 {
            let seq = endSeq
            slots.append(write)
            byID[write.id] = seq
            count += 1
            return seq
        }

        func seq(of id: WriteID) -> UInt64? { byID[id] }

        subscript(seq: UInt64) -> PendingWrite? {
            get {
                guard seq >= firstSeq, seq < endSeq else { return nil }
                return slots[Int(seq - firstSeq)]
            }
            set {
                guard seq >= firstSeq, seq < endSeq, slots[Int(seq - firstSeq)] != nil, let newValue else { return }
                slots[Int(seq - firstSeq)] = newValue
            }
        }

        /// Calls `body` on each write in order, in place.
        mutating func modifyAll(_ body: (inout PendingWrite) -> Void) {
            for i in head..<slots.count where slots[i] != nil {
                if var w = slots[i] {
                    slots[i] = nil
                    body(&w)
                    slots[i] = w
                }
            }
        }

        mutating func remove(_ seq: UInt64) -> PendingWrite? {
            guard seq >= firstSeq, seq < endSeq, let write = slots[Int(seq - firstSeq)] else { return nil }
            slots[Int(seq - firstSeq)] = nil
            if byID[write.id] == seq { byID[write.id] = nil }
            count -= 1
            while head < slots.count, slots[head] == nil { head += 1 }
            // Drop the answered prefix once it is most of the array (amortized O(1)).
            if head > 64, head * 2 > slots.count {
                slots.removeFirst(head)
                firstSeq += UInt64(head)
                head = 0
            }
            return write
        }
    }

    /// The visible pending writes by the paths they change: a trie from path segments to the
    /// sequences of the writes that set or prioritise there, so the writes at a location's
    /// ancestors are a walk of its depth and those below it a subtree.
    struct WriteIndex: Sendable {
        struct Entry: Sendable {
            var seq: UInt64
            var isSet: Bool
        }

        /// Entries at this node in sequence order; those before `head` were removed.
        private var entries: [Entry] = []
        private var head = 0
        /// Live set entries at this node.
        private var sets = 0
        /// Live entries in this subtree.
        private var total = 0
        private var children: [ChildKey: WriteIndex] = [:]

        var isEmpty: Bool { total == 0 }
        private var hasOwn: Bool { entries.count > head }

        mutating func insert(_ seq: UInt64, change: Change) {
            let isSet: Bool
            if case .set = change { isSet = true } else { isSet = false }
            insert(Entry(seq: seq, isSet: isSet), at: change.path.segments[...])
        }

        private mutating func insert(_ entry: Entry, at path: ArraySlice<ChildKey>) {
            total += 1
            guard let key = path.first else {
                // Sequences only grow, so an append keeps the order (a restored rebuild also
                // inserts in order).
                if let last = entries.last, last.seq > entry.seq {
                    let at = entries[head...].firstIndex { $0.seq > entry.seq } ?? entries.count
                    entries.insert(entry, at: at)
                } else {
                    entries.append(entry)
                }
                if entry.isSet { sets += 1 }
                return
            }
            children[key, default: WriteIndex()].insert(entry, at: path.dropFirst())
        }

        mutating func remove(_ seq: UInt64, change: Change) {
            remove(seq, at: change.path.segments[...])
        }

        @discardableResult
        private mutating func remove(_ seq: UInt64, at path: ArraySlice<ChildKey>) -> Bool {
            guard let key = path.first else {
                guard let at = position(of: seq) else { return false }
                if entries[at].isSet { sets -= 1 }
                if at == head {
                    head += 1
                    if head == entries.count {
                        entries.removeAll(keepingCapacity: entries.count < 64)
                        head = 0
                    } else if head > 32, head * 2 > entries.count {
                        entries.removeFirst(head)
                        head = 0
                    }
                } else {
                    entries.remove(at: at)
                }
                total -= 1
                return true
            }
            guard let removed = children[key]?.remove(seq, at: path.dropFirst()), removed else { return false }
            if children[key]?.isEmpty == true { children[key] = nil }
            total -= 1
            return true
        }

        /// Binary search among the live entries.
        private func position(of seq: UInt64) -> Int? {
            var low = head
            var high = entries.count
            while low < high {
                let mid = (low + high) / 2
                if entries[mid].seq < seq { low = mid + 1 } else { high = mid }
            }
            return low < entries.count && entries[low].seq == seq ? low : nil
        }

        /// The depth (0: the root) of the highest strict ancestor of `path` where a write sets or
        /// prioritises, if any.
        func firstAncestorWithWrites(of path: Path) -> Int? {
            var node = self
            for (depth, key) in path.segments.enumerated() {
                if node.hasOwn { return depth }
                guard let next = node.children[key] else { return nil }
                node = next
            }
            return nil
        }

        /// Whether a write sets a location containing `path` (`path` or an ancestor).
        func coversBySet(_ path: Path) -> Bool {
            var node = self
            if node.sets > 0 { return true }
            for key in path.segments {
                guard let next = node.children[key] else { return false }
                node = next
                if node.sets > 0 { return true }
            }
            return false
        }

        /// The sequences of the writes that can change the data at `path`, in order: those after
        /// the last set of `path` or an ancestor (which replaces everything before it) that set
        /// an ancestor, or set or prioritise `path` or below.
        func relevant(to path: Path) -> [UInt64] {
            var chain: [Entry] = []
            var node = self
            var found = true
            let segments = path.segments
            for key in segments {
                chain.append(contentsOf: node.entries[node.head...].filter(\.isSet))
                guard let next = node.children[key] else {
                    found = false
                    break
                }
                node = next
            }
            if found { chain.append(contentsOf: node.entries[node.head...]) }
            let cut = chain.lazy.filter(\.isSet).map(\.seq).max() ?? 0
            var list = chain.filter { $0.seq >= cut }.map(\.seq)
            if found {
                for child in node.children.values { child.collect(from: cut, into: &list) }
            }
            list.sort()
            var unique: [UInt64] = []
            unique.reserveCapacity(list.count)
            for s in list where unique.last != s { unique.append(s) }
            return unique
        }

        private func collect(from cut: UInt64, into list: inout [UInt64]) {
            for e in entries[head...] where e.seq >= cut { list.append(e.seq) }
            for child in children.values { child.collect(from: cut, into: &list) }
        }
    }
}
