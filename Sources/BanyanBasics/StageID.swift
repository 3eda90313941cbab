/// The name of a staged payload (docs/staged-payloads.md): the term of the leader that staged
/// it and that leader's counter. One leader per term makes it unique in a cluster.
public struct StageID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var term: UInt64
    public var n: UInt64

    public init(term: UInt64, n: UInt64) {
        self.term = term
        self.n = n
    }

    public static func < (a: StageID, b: StageID) -> Bool { (a.term, a.n) < (b.term, b.n) }

    public var description: String { "\(term)-\(n)" }

    /// The file that holds it in a staged store, `<term>-<n>.staged`.
    public var fileName: String { "\(term)-\(n).staged" }

    /// The id a staged file's name gives (nil for any other name, a temporary one included).
    public init?(fileName: String) {
        guard fileName.hasSuffix(".staged") else { return nil }
        let stem = fileName.dropLast(".staged".count)
        let parts = stem.split(separator: "-", omittingEmptySubsequences: false)
        guard parts.count == 2, let term = UInt64(parts[0]), let n = UInt64(parts[1]), "\(term)-\(n)" == stem else { return nil }
        self.init(term: term, n: n)
    }
}
