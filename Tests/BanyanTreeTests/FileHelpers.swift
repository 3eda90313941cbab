import Foundation

/// Names in a directory, sorted (tests only; the cores have no file I/O).
func listDirectory(_ path: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: path).sorted()
}

/// The bytes of a file.
func readFile(_ path: String) throws -> [UInt8] {
    Array(try Data(contentsOf: URL(fileURLWithPath: path)))
}
