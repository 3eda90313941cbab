import Foundation

/// A node's `/metrics` page (the Prometheus text format) as the tests and tools read it.
public enum MetricsText {
    /// The samples of `name` in `text`: each line's labels (the text between the braces, ""
    /// for none) and value. A longer name that begins with `name` is not a match.
    public static func samples(_ text: String, _ name: String) -> [(labels: String, value: Double)] {
        text.split(separator: "\n").compactMap { line in
            guard line.hasPrefix(name) else { return nil }
            let rest = line.dropFirst(name.count)
            var labels = ""
            var valueText = rest
            if rest.hasPrefix("{"), let close = rest.firstIndex(of: "}") {
                labels = String(rest[rest.index(after: rest.startIndex)..<close])
                valueText = rest[rest.index(after: close)...]
            } else if !rest.hasPrefix(" ") {
                return nil
            }
            guard let value = Double(valueText.trimmingCharacters(in: .whitespaces)) else { return nil }
            return (labels, value)
        }
    }

    /// The sum of `name`'s samples over every label set (0 when it has none yet: a counter
    /// appears with its first increment).
    public static func sum(_ text: String, _ name: String) -> Double {
        samples(text, name).reduce(0) { $0 + $1.value }
    }
}
