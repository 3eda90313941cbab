import BanyanTree
import Testing

@Suite struct KeyAndPathTests {
    @Test("keys sort as Firebase's nameCompare: int32 keys numerically first, then UTF-16 order")
    func specOrder() throws {
        let expected = ["-2147483648", "-1", "7", "007", "9", "10", "-", "2147483648", "A", "_", "a", "b", "z", "é", "😀", "\u{FFFF}"]
        let keys = expected.map { ChildKey(unchecked: $0) }
        #expect(keys.reversed().sorted().map(\.string) == expected)
        #expect((keys[8...] + keys[..<8]).sorted().map(\.string) == expected)
        for (a, b) in zip(keys, keys.dropFirst()) {
            #expect(a < b, "\(a) < \(b)")
            #expect(!(b < a))
        }
    }

    @Test("canonically equivalent strings are different keys, ordered by UTF-16 units")
    func canonicalEquivalence() {
        let composed = ChildKey(unchecked: "\u{E9}")
        let decomposed = ChildKey(unchecked: "e\u{301}")
        #expect(composed != decomposed)
        #expect(decomposed < composed)  // 'e' (0x65) < 0xE9
        #expect(Set([composed, decomposed]).count == 2)
    }

    @Test("int32 parsing follows the Android/iOS rule")
    func intKeys() {
        #expect(ChildKey(unchecked: "2147483647").intValue == Int32.max)
        #expect(ChildKey(unchecked: "-2147483648").intValue == Int32.min)
        #expect(ChildKey(unchecked: "2147483648").intValue == nil)
        #expect(ChildKey(unchecked: "-").intValue == nil)
        #expect(ChildKey(unchecked: "00000000007").intValue == 7)  // 11 characters: still an int
        #expect(ChildKey(unchecked: "000000000007").intValue == nil)  // 12 characters
        #expect(ChildKey(unchecked: "-0000000007").intValue == -7)
        #expect(ChildKey(unchecked: "99999999999").intValue == nil)  // out of range
        #expect(ChildKey(unchecked: "0000000007").intValue == 7)
        #expect(ChildKey(unchecked: "1a").intValue == nil)
        #expect(ChildKey(unchecked: "0") < ChildKey(unchecked: "-0"))
    }

    @Test("invalid keys are rejected with a typed error naming the key", arguments: [
        "", "a.b", "a$", "#", "[x", "x]", "a/b", "tab\there", "\u{7F}", String(repeating: "k", count: 769),
    ])
    func invalidKeys(key: String) {
        #expect(throws: TreeError.self) { try ChildKey(validating: key) }
        do {
            _ = try ChildKey(validating: key)
        } catch {
            #expect(error.code == .invalidKey)
        }
    }

    @Test("768 bytes of UTF-8 is the key limit, measured in bytes")
    func keyLength() throws {
        _ = try ChildKey(validating: String(repeating: "k", count: 768))
        _ = try ChildKey(validating: String(repeating: "é", count: 384))  // 768 bytes
        #expect(throws: TreeError.self) { try ChildKey(validating: String(repeating: "é", count: 385)) }
    }

    @Test("paths ignore empty segments and enforce depth and length limits")
    func paths() throws {
        #expect(try Path(parsing: "//a///b/").description == "/a/b")
        #expect(try Path(parsing: "").isRoot)
        let deep = (0..<32).map { "k\($0)" }.joined(separator: "/")
        #expect(try Path(parsing: deep).count == 32)
        do {
            _ = try Path(parsing: deep + "/x")
            Issue.record("33 levels accepted")
        } catch {
            #expect(error.code == .depthExceeded)
        }
        let long = (0..<10).map { _ in String(repeating: "x", count: 80) }.joined(separator: "/")
        do {
            _ = try Path(parsing: long)
            Issue.record("long path accepted")
        } catch {
            #expect(error.code == .pathTooLong)
        }
        do {
            _ = try Path(parsing: "a/.priority")
            Issue.record(".priority accepted as a key")
        } catch {
            #expect(error.code == .invalidPath)
        }
        let write = try WritePath(parsing: "a/b/.priority")
        #expect(write.isPriority && write.path.description == "/a/b")
    }

    @Test("paths split on bytes: keys keep their exact UTF-8, errors name the segment and the path")
    func pathBytes() throws {
        let p = try Path(parsing: "/caf\u{E9}/e\u{301}/-12/\u{1F600}x//")
        #expect(p.segments.map(\.string) == ["caf\u{E9}", "e\u{301}", "-12", "\u{1F600}x"])
        #expect(p.segments.map(\.string.utf8.count) == [5, 3, 3, 5])
        #expect(p.segments[2].intValue == -12 && p.segments[0].intValue == nil)
        #expect(p.segments == ["caf\u{E9}", "e\u{301}", "-12", "\u{1F600}x"].map { ChildKey(unchecked: $0) })
        // A "/" followed by a combining mark still separates (Firebase splits on code units), and
        // so does one after a prepended mark (U+0600 and "/" are one Character in Swift).
        #expect(try Path(parsing: "a/\u{301}b").segments.map(\.string) == ["a", "\u{301}b"])
        #expect(try Path(parsing: "\u{600}/b").segments.map(\.string) == ["\u{600}", "b"])
        let prepended = try WritePath(parsing: "/\u{600}/.priority")
        #expect(prepended.isPriority && prepended.path.segments.map(\.string) == ["\u{600}"])
        for (text, segment) in [("a/b$c/d", "b$c"), ("a/b\u{7}", "b\\u{7}"), ("x/./y", "."), ("a/[", "[")] {
            do {
                _ = try Path(parsing: text)
                Issue.record("\(text) accepted")
            } catch {
                #expect(error.code == .invalidPath)
                #expect(error.message.contains("segment \"\(segment)\" is invalid"), "\(error.message)")
            }
        }
        do {
            _ = try Path(parsing: "a/" + String(repeating: "k", count: 769))
            Issue.record("a 769-byte key accepted")
        } catch {
            #expect(error.code == .invalidPath && error.message.contains("769"))
        }
        // Write paths: `.priority` only last; errors show the path without empty segments.
        let w = try WritePath(parsing: "//a//.priority/")
        #expect(w.isPriority && w.path.description == "/a")
        #expect(try WritePath(parsing: ".priority").isPriority && WritePath(parsing: ".priority").path.isRoot)
        #expect(try !WritePath(parsing: "a/b").isPriority)
        do {
            _ = try WritePath(parsing: "a//.priority/b")
            Issue.record(".priority accepted in the middle")
        } catch {
            #expect(error.code == .invalidPath)
            #expect(error.path == "a/.priority/b", "\(error.path)")
        }
        let deep = (0..<32).map { "k\($0)" }.joined(separator: "/")
        #expect(throws: TreeError.self) { try WritePath(parsing: deep + "/.priority") }
        #expect(try WritePath(parsing: (0..<31).map { "k\($0)" }.joined(separator: "/") + "/.priority").isPriority)
    }
}
