/// The JSON readers: `JSONValue` (envelopes, queries, rules) and `TreeReader` (tree data, with
/// and without server values), and `JSONValue.members(rawIn:)` (multi-path update bodies).
///
/// Invariants: a value read is written back and reads again to the same value (the canonical
/// bytes of a `JSONValue`; the export format of a tree), and the raw members of an object agree
/// with the object read whole.
import BanyanTree
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { bytes in
        checkJSONValue(bytes)
        checkTree(bytes)
        checkMembers(bytes)
    }
}

func checkJSONValue(_ bytes: [UInt8]) {
    guard let value = try? JSONValue(parsing: bytes) else { return }
    let canonical = value.canonicalBytes
    do {
        let again = try JSONValue(parsing: canonical)
        require(again.canonicalBytes == canonical, "canonical bytes are not a fixed point")
    } catch {
        require(false, "the canonical form of a value does not parse: \(error)")
    }
}

func checkTree(_ bytes: [UInt8]) {
    let location = try? Path(parsing: "fuzz/location")
    for context in [nil, ServerValueContext(timestamp: 1_700_000_000_000, existing: Tree(.int(7)))] {
        guard let tree = try? TreeReader.read(bytes, at: location ?? .root, serverValues: context) else { continue }
        let exported = JSONWriter.bytes(tree, format: .export)
        do {
            let again = try TreeReader.read(exported, at: location ?? .root)
            require(again == tree, "export round trip changed the tree: \(tree) became \(again)")
        } catch {
            require(false, "the export of a tree read does not read back: \(error)")
        }
        // The plain rendering (arrays, no priorities) must be JSON a client can read.
        require((try? JSONValue(parsing: JSONWriter.bytes(tree), maxDepth: 1000)) != nil, "plain rendering is not JSON")
        _ = tree.hashString
    }
}

func checkMembers(_ bytes: [UInt8]) {
    guard let members = (try? JSONValue.members(rawIn: bytes)) ?? nil else { return }
    for member in members {
        require(member.value.lowerBound >= 0 && member.value.upperBound <= bytes.count, "member range outside the input")
    }
    // When the whole object parses, its members are the ones delimited, in order.
    if case .object(let whole)? = try? JSONValue(parsing: bytes, maxDepth: 10_000) {
        require(whole.map(\.0) == members.map(\.key), "raw members differ from the object's keys")
        for (member, (_, value)) in zip(members, whole) {
            let raw = try? JSONValue(parsing: Array(bytes[member.value]), maxDepth: 10_000)
            require(raw == value, "a raw member's bytes do not hold its value")
        }
    }
}
