import BanyanBasics
import Crypto
import _CryptoExtras

/// Password hashing for the account service (docs/accounts.md, "Passwords"): scrypt from
/// swift-crypto's extras, never a fast hash. A hash records its own parameters and salt,
/// `scrypt$<log2 N>$<r>$<p>$<salt>$<hash>` (base64url), so the cost can be raised later without
/// making existing passwords unreadable. CPU- and memory-hard by design: callers run it on a
/// worker thread, never on the replica thread or an event loop.
public struct PasswordHasher: Sendable, Equatable {
    /// log2 of scrypt's N (the cost: memory is 128 · r · N bytes).
    public var logN: Int
    /// scrypt's block size r.
    public var blockSize: Int
    /// scrypt's parallelism p.
    public var parallelism: Int

    /// N = 2^15, r = 8, p = 1: 32 MiB and about a tenth of a second per hash on the benchmark
    /// machine (docs/benchmarks.md), the parameters RFC 7914 suggests for interactive logins.
    public static let standard = PasswordHasher(logN: 15, blockSize: 8, parallelism: 1)

    /// What a stored hash may ask for: anything costlier is refused, so a damaged or hostile
    /// record cannot make a sign-in take gigabytes (N ≤ 2^20, r ≤ 32, p ≤ 16, 128·r·N·p ≤ 1 GiB).
    public static func isAcceptable(logN: Int, blockSize: Int, parallelism: Int) -> Bool {
        guard (1...20).contains(logN), (1...32).contains(blockSize), (1...16).contains(parallelism) else { return false }
        return 128 * blockSize * (1 << logN) * parallelism <= 1 << 30
    }

    public init(logN: Int, blockSize: Int, parallelism: Int) {
        self.logN = logN
        self.blockSize = blockSize
        self.parallelism = parallelism
    }

    public static let saltBytes = 16
    public static let hashBytes = 32
    /// Passwords longer than this are refused before hashing (the Identity Toolkit's own bound
    /// is far lower for most providers; 4096 bytes keeps scrypt's input cost trivial).
    public static let maxPasswordBytes = 4096

    public enum HashError: Error, Sendable, Equatable {
        /// The parameters are outside `isAcceptable`.
        case unacceptableParameters
        /// The salt is not `saltBytes` long.
        case badSalt
        /// swift-crypto refused (it should not for acceptable parameters).
        case derivationFailed(String)
    }

    /// The stored form of `password` hashed with `salt` (from the caller's random source).
    public func hash(_ password: String, salt: [UInt8]) throws(HashError) -> String {
        guard Self.isAcceptable(logN: logN, blockSize: blockSize, parallelism: parallelism) else { throw .unacceptableParameters }
        guard salt.count == Self.saltBytes else { throw .badSalt }
        let digest = try Self.derive(Array(password.utf8), salt: salt, logN: logN, r: blockSize, p: parallelism)
        return "scrypt$\(logN)$\(blockSize)$\(parallelism)$\(Base64.encodeURL(salt))$\(Base64.encodeURL(digest))"
    }

    /// Whether `password` matches `stored` (in time independent of where they differ). A
    /// stored hash that is not in this form, or asks for unacceptable parameters, matches
    /// nothing.
    public static func verify(_ password: String, against stored: String) -> Bool {
        let parts = stored.utf8.split(separator: UInt8(ascii: "$"), omittingEmptySubsequences: false)
        guard parts.count == 6, String(decoding: parts[0], as: UTF8.self) == "scrypt",
            let logN = Int(String(decoding: parts[1], as: UTF8.self)), let r = Int(String(decoding: parts[2], as: UTF8.self)),
            let p = Int(String(decoding: parts[3], as: UTF8.self)), isAcceptable(logN: logN, blockSize: r, parallelism: p),
            let salt = Base64.decode(parts[4]), let expected = Base64.decode(parts[5]), expected.count == hashBytes,
            password.utf8.count <= maxPasswordBytes,
            let got = try? derive(Array(password.utf8), salt: salt, logN: logN, r: r, p: p)
        else { return false }
        return TokenVerifier.constantTimeEqual(got, expected)
    }

    private static func derive(_ password: [UInt8], salt: [UInt8], logN: Int, r: Int, p: Int) throws(HashError) -> [UInt8] {
        do {
            let key = try KDF.Scrypt.deriveKey(
                from: password, salt: salt, outputByteCount: hashBytes, rounds: 1 << logN, blockSize: r, parallelism: p)
            return key.withUnsafeBytes { Array($0) }
        } catch {
            throw .derivationFailed("\(error)")
        }
    }
}
