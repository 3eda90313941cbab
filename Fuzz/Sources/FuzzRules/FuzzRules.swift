/// The security-rules language: the document (JSON with comments and its rule tree), the
/// expression parser and type checker, and decisions made with what parses.
///
/// Input: the rules text.
///
/// Invariants: parsing refuses with a typed error or gives rules that decide reads and writes
/// over a small tree without crashing, within the evaluator's limits.
import BanyanRules
import BanyanTree
import FuzzSupport

let data: Tree = (try? TreeReader.read(Array(#"{"users":{"ada":{"age":36,"name":"Ada","bio":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"}},"open":{"n":1,"s":"x@y.z"}}"#.utf8))) ?? .empty
let paths: [Path] = ["", "users", "users/ada", "users/ada/age", "users/ada/bio", "open/n", "open/s", "x/y/z"].compactMap { try? Path(parsing: $0) }

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRules(_ bytes: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(bytes, size) { bytes in
        let text = String(decoding: bytes, as: UTF8.self)
        let rules: Rules
        do throws(RulesError) {
            rules = try Rules.parse(text)
        } catch {
            return
        }
        let contexts = [
            RulesRequestContext(auth: nil, time: 1_700_000_000_000),
            RulesRequestContext(auth: .object([("uid", .string("ada")), ("token", .object([("admin", .bool(true))]))]), time: 0),
        ]
        for context in contexts {
            for path in paths {
                _ = rules.decideRead(at: path, context: context, tree: data)
                _ = rules.decideWrite(targets: [path], context: context, current: data, proposed: data.setting(Tree(.int(37)), at: path))
            }
        }
    }
}
