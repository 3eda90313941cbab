/// What every fuzz target shares: the entry point's conversion, invariant checks that stop the
/// run with a message libFuzzer records next to the input, and ways to cut one input into parts.

/// Runs `body` on the input's bytes; the return value is libFuzzer's (0: keep going).
public func fuzzEntry(_ data: UnsafePointer<UInt8>?, _ size: Int, _ body: ([UInt8]) -> Void) -> CInt {
    let bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    body(bytes)
    return 0
}

/// As `fuzzEntry`, for a target whose first byte selects what it reads: `body(selector, rest)`
/// (selector 0 for an empty input).
public func fuzzEntry(_ data: UnsafePointer<UInt8>?, _ size: Int, selecting body: (UInt8, [UInt8]) -> Void) -> CInt {
    fuzzEntry(data, size) { bytes in body(bytes.first ?? 0, Array(bytes.dropFirst())) }
}

/// Stops the run when an invariant does not hold: libFuzzer saves the input as a crash.
public func require(
    _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line
) {
    if !condition() { fatalError("fuzz invariant: \(message())", file: file, line: line) }
}

/// An input read from the front, in parts cut at separators.
public struct FuzzInput {
    public private(set) var rest: ArraySlice<UInt8>

    public init(_ bytes: [UInt8]) { rest = bytes[...] }

    /// The bytes up to the next `separator` (or the end), consuming the separator.
    public mutating func part(until separator: UInt8) -> [UInt8] {
        guard let at = rest.firstIndex(of: separator) else {
            defer { rest = rest[rest.endIndex...] }
            return Array(rest)
        }
        defer { rest = rest[(at + 1)...] }
        return Array(rest[..<at])
    }

    /// What remains, split at every `separator` (empty parts kept).
    public func parts(separator: UInt8) -> [[UInt8]] {
        rest.split(separator: separator, omittingEmptySubsequences: false).map(Array.init)
    }

    public var remaining: [UInt8] { Array(rest) }
}
