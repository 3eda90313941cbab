/// A typed error from the data model: invalid keys, paths, values or JSON, with the offending path.
///
/// `code` is a small open set (a struct, so adding codes is not source-breaking). `path` names the
/// location the error is about (the Firebase-style `/a/b` form, `/` for the root). `offset` is the
/// byte offset in the JSON input where the problem was found, when the input was JSON.
public struct TreeError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        init(_ name: String) { self.name = name }
        public var description: String { name }

        /// A key is empty, too long, or contains `. $ # [ ] /` or a control character.
        public static let invalidKey = Code("invalid_key")
        /// A path is malformed (for example, contains an invalid segment).
        public static let invalidPath = Code("invalid_path")
        /// Location depth plus data nesting exceeds 32 levels.
        public static let depthExceeded = Code("depth_exceeded")
        /// The UTF-8 length of a key path exceeds 768 bytes.
        public static let pathTooLong = Code("path_too_long")
        /// The input is not valid JSON (syntax, encoding, trailing data).
        public static let invalidJSON = Code("invalid_json")
        /// An object has the same key twice.
        public static let duplicateKey = Code("duplicate_key")
        /// A number is NaN, infinite or out of the double range.
        public static let invalidNumber = Code("invalid_number")
        /// A priority is not null, a finite number, a string or a server value.
        public static let invalidPriority = Code("invalid_priority")
        /// A `.sv` placeholder is unknown or malformed, or server values are not allowed here.
        public static let invalidServerValue = Code("invalid_server_value")
        /// `.value` mixed with children, or another misuse of metadata keys.
        public static let invalidMetadata = Code("invalid_metadata")
        /// A multi-path update whose paths overlap (one is an ancestor of another).
        public static let overlappingPaths = Code("overlapping_paths")
        /// An operation that needs data found none (for example setPriority on an empty location).
        public static let emptyLocation = Code("empty_location")
        /// A string longer than 10 MiB of UTF-8.
        public static let stringTooLong = Code("string_too_long")
        /// The input exceeds a configured size or value-count limit.
        public static let inputTooLarge = Code("input_too_large")
    }

    public let code: Code
    /// The location the error is about, as `/a/b` (`/` for the root).
    public let path: String
    /// A human-readable explanation naming the offending part.
    public let message: String
    /// Byte offset in the JSON input, when the error came from parsing JSON.
    public let offset: Int?

    public init(_ code: Code, path: String, _ message: String, offset: Int? = nil) {
        self.code = code
        self.path = path
        self.message = message
        self.offset = offset
    }

    public var description: String {
        var text = "\(code): \(message) (at \(path)"
        if let offset { text += ", byte \(offset)" }
        return text + ")"
    }
}
