import BanyanBasics
public import BanyanTree

/// One user account of the built-in account service (docs/accounts.md), as the replicated state
/// holds it. Everything random (the uid the service chose, the password's salt, the refresh
/// key) and everything costly (the scrypt hash) is computed by the proposer and carried in the
/// command; the state machine only decides and stamps times with the log's timestamp.
public struct AccountRecord: Sendable, Equatable {
    public var uid: String
    /// As given; unique per project in ASCII-case-insensitive comparison (`AccountStore.emailKey`).
    public var email: String?
    /// The password hash in the self-describing form `BanyanAuth.PasswordHasher` writes
    /// (algorithm, parameters, salt, hash); nil: no password.
    public var passwordHash: String?
    public var displayName: String?
    /// The developer claims as the text of a JSON object (nil: none).
    public var claims: String?
    public var disabled: Bool
    public var emailVerified: Bool
    /// How the account was made: `password`, `anonymous` or `custom`.
    public var provider: String
    /// Milliseconds since the epoch, the log's timestamp of the command that made it.
    public var createdAt: Int64
    public var lastSignInAt: Int64?
    /// Seconds since the epoch: ID and refresh tokens issued before this are refused.
    public var validSince: Int64
    /// The base64url secret this account's refresh tokens are signed with; replaced when the
    /// password changes or tokens are revoked, which ends every refresh token issued before.
    public var refreshKey: String
    /// The identity provider's user this account is (`accounts:signInWithIdp`; the uid is
    /// `<provider>:<id>`), with the profile its last sign-in brought.
    public var federated: FederatedIdentity?

    public init(
        uid: String, email: String? = nil, passwordHash: String? = nil, displayName: String? = nil, claims: String? = nil, disabled: Bool = false,
        emailVerified: Bool = false, provider: String, createdAt: Int64 = 0, lastSignInAt: Int64? = nil, validSince: Int64 = 0, refreshKey: String,
        federated: FederatedIdentity? = nil
    ) {
        self.uid = uid
        self.email = email
        self.passwordHash = passwordHash
        self.displayName = displayName
        self.claims = claims
        self.disabled = disabled
        self.emailVerified = emailVerified
        self.provider = provider
        self.createdAt = createdAt
        self.lastSignInAt = lastSignInAt
        self.validSince = validSince
        self.refreshKey = refreshKey
        self.federated = federated
    }

    public var json: JSONValue {
        var m: [(String, JSONValue)] = [("uid", .string(uid))]
        if let email { m.append(("email", .string(email))) }
        if let passwordHash { m.append(("passwordHash", .string(passwordHash))) }
        if let displayName { m.append(("displayName", .string(displayName))) }
        if let claims { m.append(("claims", .string(claims))) }
        m.append(("disabled", .bool(disabled)))
        m.append(("emailVerified", .bool(emailVerified)))
        m.append(("provider", .string(provider)))
        m.append(("createdAt", .int(createdAt)))
        if let lastSignInAt { m.append(("lastSignInAt", .int(lastSignInAt))) }
        m.append(("validSince", .int(validSince)))
        m.append(("refreshKey", .string(refreshKey)))
        if let federated { m.append(("federated", federated.json)) }
        return .object(m)
    }

    public init?(json v: JSONValue) {
        guard case .string(let uid)? = v["uid"], case .string(let provider)? = v["provider"], case .string(let refreshKey)? = v["refreshKey"] else {
            return nil
        }
        func string(_ k: String) -> String? { if case .string(let s)? = v[k] { return s } else { return nil } }
        func int(_ k: String) -> Int64? { if case .int(let i)? = v[k] { return i } else { return nil } }
        func bool(_ k: String) -> Bool { if case .bool(true)? = v[k] { return true } else { return false } }
        self.init(
            uid: uid, email: string("email"), passwordHash: string("passwordHash"), displayName: string("displayName"), claims: string("claims"),
            disabled: bool("disabled"), emailVerified: bool("emailVerified"), provider: provider, createdAt: int("createdAt") ?? 0,
            lastSignInAt: int("lastSignInAt"), validSince: int("validSince") ?? 0, refreshKey: refreshKey,
            federated: v["federated"].flatMap(FederatedIdentity.init(json:)))
    }

    /// The email the account presents: its own, else its identity provider's (which is not in
    /// the email index: it is not unique, and no password sign-in or reset finds it).
    public var profileEmail: String? { email ?? federated?.email }
    /// Whether `profileEmail` is verified.
    public var profileEmailVerified: Bool { email != nil ? emailVerified : federated?.emailVerified ?? false }
    /// The display name the account presents: its own, else its identity provider's.
    public var profileDisplayName: String? { displayName ?? federated?.displayName }
}

/// A user at an identity provider, as an account made by `accounts:signInWithIdp` records it:
/// the provider's id and the user's id there (`sub`), and the profile claims of the provider's
/// last token (email, its verification, name, picture).
public struct FederatedIdentity: Sendable, Equatable {
    public var providerID: String
    /// The user's id at the provider (`sub`).
    public var rawID: String
    /// The provider's name for the user: its issuer and `rawID` (`https://accounts.google.com/<sub>`).
    public var federatedID: String
    public var email: String?
    public var emailVerified: Bool
    public var displayName: String?
    public var photoURL: String?

    public init(
        providerID: String, rawID: String, federatedID: String? = nil, email: String? = nil, emailVerified: Bool = false, displayName: String? = nil,
        photoURL: String? = nil
    ) {
        self.providerID = providerID
        self.rawID = rawID
        self.federatedID = federatedID ?? rawID
        self.email = email
        self.emailVerified = emailVerified
        self.displayName = displayName
        self.photoURL = photoURL
    }

    var json: JSONValue {
        var m: [(String, JSONValue)] = [("providerId", .string(providerID)), ("rawId", .string(rawID)), ("federatedId", .string(federatedID))]
        if let email { m.append(("email", .string(email))) }
        m.append(("emailVerified", .bool(emailVerified)))
        if let displayName { m.append(("displayName", .string(displayName))) }
        if let photoURL { m.append(("photoUrl", .string(photoURL))) }
        return .object(m)
    }

    init?(json v: JSONValue) {
        guard case .string(let provider)? = v["providerId"], case .string(let raw)? = v["rawId"] else { return nil }
        func string(_ k: String) -> String? { if case .string(let s)? = v[k] { return s } else { return nil } }
        self.init(
            providerID: provider, rawID: raw, federatedID: string("federatedId"), email: string("email"), emailVerified: v["emailVerified"] == .bool(true), displayName: string("displayName"),
            photoURL: string("photoUrl"))
    }
}

/// What an update changes (nil: unchanged).
public struct AccountChanges: Sendable, Equatable {
    public var email: String?
    public var removeEmail = false
    public var passwordHash: String?
    public var displayName: String?
    public var removeDisplayName = false
    /// A JSON object's text; `{}` removes the claims.
    public var claims: String?
    public var disabled: Bool?
    public var emailVerified: Bool?
    /// Seconds since the epoch (the admin API's `validSince`).
    public var validSince: Int64?
    /// A new refresh key (with a new password, or to revoke refresh tokens): `validSince`
    /// becomes the command's time too.
    public var refreshKey: String?
    /// Applies only if the password hash is still this one (a reset code names the password it
    /// was issued under; empty: no password).
    public var expectedPasswordHash: String?

    public init() {}

    var json: JSONValue {
        var m: [(String, JSONValue)] = []
        if let email { m.append(("email", .string(email))) }
        if removeEmail { m.append(("removeEmail", .bool(true))) }
        if let passwordHash { m.append(("passwordHash", .string(passwordHash))) }
        if let displayName { m.append(("displayName", .string(displayName))) }
        if removeDisplayName { m.append(("removeDisplayName", .bool(true))) }
        if let claims { m.append(("claims", .string(claims))) }
        if let disabled { m.append(("disabled", .bool(disabled))) }
        if let emailVerified { m.append(("emailVerified", .bool(emailVerified))) }
        if let validSince { m.append(("validSince", .int(validSince))) }
        if let refreshKey { m.append(("refreshKey", .string(refreshKey))) }
        if let expectedPasswordHash { m.append(("expectedPasswordHash", .string(expectedPasswordHash))) }
        return .object(m)
    }

    init?(json v: JSONValue) {
        guard case .object = v else { return nil }
        func string(_ k: String) -> String? { if case .string(let s)? = v[k] { return s } else { return nil } }
        func bool(_ k: String) -> Bool? { if case .bool(let b)? = v[k] { return b } else { return nil } }
        email = string("email")
        removeEmail = bool("removeEmail") ?? false
        passwordHash = string("passwordHash")
        displayName = string("displayName")
        removeDisplayName = bool("removeDisplayName") ?? false
        claims = string("claims")
        disabled = bool("disabled")
        emailVerified = bool("emailVerified")
        if case .int(let s)? = v["validSince"] { validSince = s }
        refreshKey = string("refreshKey")
        expectedPasswordHash = string("expectedPasswordHash")
    }
}

/// A key the cluster signs ID tokens, refresh tokens and reset codes with (HMAC-SHA256).
public struct SigningKey: Sendable, Equatable {
    /// The token header's `kid`.
    public var id: String
    /// Base64url of the key bytes (32 random bytes from the proposer).
    public var secret: String
    /// Milliseconds since the epoch: when it was installed (current key), or until when it is
    /// still accepted (a previous key).
    public var time: Int64

    public init(id: String, secret: String, time: Int64 = 0) {
        self.id = id
        self.secret = secret
        self.time = time
    }

    var json: JSONValue { .object([("id", .string(id)), ("secret", .string(secret)), ("time", .int(time))]) }

    init?(json v: JSONValue?) {
        guard let v, case .string(let id)? = v["id"], case .string(let secret)? = v["secret"], case .int(let time)? = v["time"] else { return nil }
        self.init(id: id, secret: secret, time: time)
    }
}

/// A project's signing keys: the one that signs now, and the one it replaced, accepted until
/// its last tokens expire.
public struct SigningKeys: Sendable, Equatable {
    public var current: SigningKey?
    /// `time` is when it stops being accepted.
    public var previous: SigningKey?

    public init(current: SigningKey? = nil, previous: SigningKey? = nil) {
        self.current = current
        self.previous = previous
    }

    /// The keys accepted at `now` (milliseconds): the current one, and the previous one until
    /// its time.
    public func accepted(now: Int64) -> [SigningKey] {
        var keys: [SigningKey] = []
        if let current { keys.append(current) }
        if let previous, previous.time > now { keys.append(previous) }
        return keys
    }

    var json: JSONValue {
        var m: [(String, JSONValue)] = []
        if let current { m.append(("current", current.json)) }
        if let previous { m.append(("previous", previous.json)) }
        return .object(m)
    }

    public init(json v: JSONValue) {
        current = SigningKey(json: v["current"])
        previous = SigningKey(json: v["previous"])
    }
}

/// An operation on a project's accounts, carried by `Command.account` (JSON in the log, so
/// the command codec stays small). The envelope's namespace is the project id.
public enum AccountOp: Sendable, Equatable {
    /// Makes an account: refused with `DUPLICATE_LOCAL_ID` if the uid exists, `EMAIL_EXISTS`
    /// if another account has the email. `createdAt` is stamped with the log's time.
    case create(AccountRecord)
    /// Changes an account: `USER_NOT_FOUND`, `EMAIL_EXISTS`, or `INVALID_OOB_CODE` when
    /// `expectedPasswordHash` no longer matches.
    case update(uid: String, AccountChanges)
    /// Deletes accounts (those that do not exist are skipped).
    case delete(uids: [String])
    /// Records a sign-in (`lastSignInAt`): refused with `USER_NOT_FOUND`, `USER_DISABLED`, or
    /// `INVALID_PASSWORD` when the password changed since the proposer checked `passwordHash`.
    /// With `createIfAbsent`, a missing account is made from it (custom-token and identity
    /// provider sign-in); when it carries a `federated` identity, an existing account's is
    /// replaced by it (the provider's profile as of this sign-in).
    case signIn(uid: String, passwordHash: String?, createIfAbsent: AccountRecord?)
    /// Installs a signing key. `rotate`: the current key becomes the previous one, accepted for
    /// `retainMilliseconds` more. Not rotating: installs it only when the project has none
    /// (every node that needs a first key proposes one; the first in the log wins).
    case installKey(SigningKey, rotate: Bool, retainMilliseconds: Int64)

    var json: JSONValue {
        switch self {
        case .create(let record): return .object([("op", .string("create")), ("record", record.json)])
        case let .update(uid, changes): return .object([("op", .string("update")), ("uid", .string(uid)), ("changes", changes.json)])
        case .delete(let uids): return .object([("op", .string("delete")), ("uids", .array(uids.map { .string($0) }))])
        case let .signIn(uid, hash, create):
            var m: [(String, JSONValue)] = [("op", .string("signIn")), ("uid", .string(uid))]
            if let hash { m.append(("passwordHash", .string(hash))) }
            if let create { m.append(("create", create.json)) }
            return .object(m)
        case let .installKey(key, rotate, retain):
            return .object([("op", .string("installKey")), ("key", key.json), ("rotate", .bool(rotate)), ("retain", .int(retain))])
        }
    }

    var encoded: [UInt8] { Array(json.jsonString.utf8) }

    init?(decoding bytes: [UInt8]) {
        guard let v = try? JSONValue(parsing: bytes, maxDepth: 8), case .string(let op)? = v["op"] else { return nil }
        switch op {
        case "create":
            guard let r = v["record"].flatMap(AccountRecord.init(json:)) else { return nil }
            self = .create(r)
        case "update":
            guard case .string(let uid)? = v["uid"], let c = v["changes"].flatMap(AccountChanges.init(json:)) else { return nil }
            self = .update(uid: uid, c)
        case "delete":
            guard case .array(let list)? = v["uids"] else { return nil }
            var uids: [String] = []
            for item in list {
                guard case .string(let uid) = item else { return nil }
                uids.append(uid)
            }
            self = .delete(uids: uids)
        case "signIn":
            guard case .string(let uid)? = v["uid"] else { return nil }
            var hash: String?
            if case .string(let h)? = v["passwordHash"] { hash = h }
            var create: AccountRecord?
            if let c = v["create"] {
                guard let r = AccountRecord(json: c) else { return nil }
                create = r
            }
            self = .signIn(uid: uid, passwordHash: hash, createIfAbsent: create)
        case "installKey":
            guard let key = SigningKey(json: v["key"]), case .bool(let rotate)? = v["rotate"], case .int(let retain)? = v["retain"] else { return nil }
            self = .installKey(key, rotate: rotate, retainMilliseconds: retain)
        default:
            return nil
        }
    }
}

/// Why an account operation was refused: the Identity Toolkit's own error codes, so the
/// endpoint answers them as they are.
public enum AccountRefusal: String, Sendable, Equatable, CaseIterable {
    case emailExists = "EMAIL_EXISTS"
    case duplicateLocalID = "DUPLICATE_LOCAL_ID"
    case userNotFound = "USER_NOT_FOUND"
    case userDisabled = "USER_DISABLED"
    case invalidPassword = "INVALID_PASSWORD"
    case invalidOobCode = "INVALID_OOB_CODE"
    case invalidProject = "INVALID_PROJECT_ID"
    case notAdministrator = "INSUFFICIENT_PERMISSION"
    /// A rotation while the key the last one replaced is still accepted.
    case rotationTooSoon = "ROTATION_TOO_SOON"

    /// The refusal an outcome carries, if it is one.
    public init?(_ outcome: StateMachine.Outcome) {
        guard case .refused(let code) = outcome, let r = AccountRefusal(rawValue: code) else { return nil }
        self = r
    }
}

/// Reads a project's accounts from the `$accounts` tree (docs/accounts.md, "State"):
/// `/<project>/u/<uid key>` holds each account's record as JSON text, `/<project>/e/<email
/// key>` the uid that owns an email, `/<project>/k` the signing keys as JSON text. Keys are
/// escaped (`escape`) so any uid or email is a valid tree key.
public struct AccountStore: Sendable {
    public let tree: Tree
    public let project: String

    public init(tree: Tree, project: String) {
        self.tree = tree
        self.project = project
    }

    static let users = ChildKey(unchecked: "u")
    static let emails = ChildKey(unchecked: "e")
    static let keys = ChildKey(unchecked: "k")

    /// A string as a tree key: `%` and the characters keys may not hold (`.`, `$`, `#`, `[`, `]`,
    /// `/`, control characters) become `%XX`. Injective, so distinct strings stay distinct.
    public static func escape(_ s: String) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count)
        let hex = Array("0123456789ABCDEF".utf8)
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "."), UInt8(ascii: "$"), UInt8(ascii: "#"), UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "/"),
                UInt8(ascii: "%"), 0x00...0x1F, 0x7F:
                out.append(UInt8(ascii: "%"))
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 0xF)])
            default: out.append(b)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The index key of an email: ASCII letters lowercased (so uniqueness ignores their case,
    /// identically on every platform and version), then escaped.
    public static func emailKey(_ email: String) -> String {
        let lowered = email.utf8.map { (0x41...0x5A).contains($0) ? $0 | 0x20 : $0 }
        return escape(String(decoding: lowered, as: UTF8.self))
    }

    static func key(_ s: String) throws(TreeError) -> ChildKey { try ChildKey(validating: s) }

    /// The longest escaped uid or email key whose path fits in `Path.maxBytes` under any
    /// project (`/<63-byte project>/e/<key>`).
    public static let maxKeyBytes = Path.maxBytes - 70

    var projectPath: Path { Path(segments: [ChildKey(unchecked: project)]) }
    func userPath(_ uid: String) throws(TreeError) -> Path { projectPath.appending(Self.users).appending(try Self.key(Self.escape(uid))) }
    func emailPath(_ email: String) throws(TreeError) -> Path { projectPath.appending(Self.emails).appending(try Self.key(Self.emailKey(email))) }
    var keysPath: Path { projectPath.appending(Self.keys) }

    static func text(_ value: Tree) -> String? { if case .string(let s)? = value.leaf { return s } else { return nil } }

    /// The account with this uid.
    public func user(_ uid: String) -> AccountRecord? {
        guard let path = try? userPath(uid), let text = Self.text(tree.child(at: path)), let v = try? JSONValue(parsing: text) else { return nil }
        return AccountRecord(json: v)
    }

    /// The uid that owns `email` (compared ASCII-case-insensitively).
    public func uid(forEmail email: String) -> String? {
        guard let path = try? emailPath(email) else { return nil }
        return Self.text(tree.child(at: path))
    }

    public func user(email: String) -> AccountRecord? { uid(forEmail: email).flatMap { user($0) } }

    public var signingKeys: SigningKeys {
        guard let text = Self.text(tree.child(at: keysPath)), let v = try? JSONValue(parsing: text) else { return SigningKeys() }
        return SigningKeys(json: v)
    }

    /// Up to `limit` accounts in key order, starting after the account whose uid is `after`;
    /// and the uid to continue after, if more follow.
    public func list(after: String?, limit: Int) -> (users: [AccountRecord], next: String?) {
        let map = tree.child(at: projectPath.appending(Self.users)).children
        var users: [AccountRecord] = []
        var iterator: ChildMap.Iterator
        if let after, let key = ChildKey(validKey: Self.escape(after)) {
            iterator = map.elements(fromKey: key)
        } else {
            iterator = map.elements()
        }
        while let (key, value) = iterator.next() {
            if let after, key.string == Self.escape(after) { continue }
            guard let text = Self.text(value), let v = try? JSONValue(parsing: text), let record = AccountRecord(json: v) else { continue }
            if users.count == limit { return (users, users.last?.uid) }
            users.append(record)
        }
        return (users, nil)
    }

    /// How many accounts the project has.
    public var count: Int { tree.child(at: projectPath.appending(Self.users)).childCount }
}

extension StateMachine {
    /// The system namespace that holds every project's accounts and signing keys (clients
    /// cannot name it: client namespaces never start with `$`).
    public static let accountsNamespace = "$accounts"

    /// The accounts of `project`.
    public func accounts(_ project: String) -> AccountStore { AccountStore(tree: tree(Self.accountsNamespace), project: project) }

    /// The signing keys of `projects` (what the network threads verify tokens with): only
    /// the projects named are read, so a node's cost does not grow with projects it does not
    /// serve.
    public func signingKeys(projects: some Sequence<String>) -> [String: SigningKeys] {
        var out: [String: SigningKeys] = [:]
        let accounts = tree(Self.accountsNamespace)
        for project in projects where Self.isValidProject(project) {
            let keys = AccountStore(tree: accounts, project: project).signingKeys
            if keys.current != nil { out[project] = keys }
        }
        return out
    }

    /// Whether `project` can name a project (1 to 63 lowercase ASCII letters, digits, `-`).
    public static func isValidProject(_ project: String) -> Bool {
        let bytes = Array(project.utf8)
        return (1...63).contains(bytes.count) && bytes.allSatisfy { (0x61...0x7A).contains($0) || (0x30...0x39).contains($0) || $0 == 0x2D }
    }

    /// `Command.account`: decided here, at the command's position in the log, identically on
    /// every node (docs/accounts.md, "Invariants"). Only the node's own account service
    /// proposes them: a command that carries a client's `auth` is refused.
    mutating func applyAccount(_ envelope: CommandEnvelope, op: AccountOp) -> Applied {
        var applied = Applied(namespace: envelope.namespace, session: envelope.session, seq: envelope.seq, outcome: .ok, written: [])
        func refuse(_ r: AccountRefusal) -> Applied {
            applied.outcome = .refused(r.rawValue)
            return applied
        }
        guard envelope.auth == nil else { return refuse(.notAdministrator) }
        guard Self.isValidProject(envelope.namespace) else { return refuse(.invalidProject) }
        let now = lastTimestamp
        var tree = namespaces.removeValue(forKey: Self.accountsNamespace) ?? .empty
        // All or nothing: a command whose write fails leaves the tree as it found it.
        let before = tree
        defer { if !tree.isEmpty { namespaces[Self.accountsNamespace] = tree } }
        let store = { AccountStore(tree: tree, project: envelope.namespace) }
        func put(_ record: AccountRecord) throws(TreeError) {
            try tree.apply(set: Tree(.string(record.json.jsonString)), at: WritePath(path: try store().userPath(record.uid)))
        }
        func index(_ email: String, to uid: String?) throws(TreeError) {
            try tree.apply(set: uid.map { Tree(.string($0)) } ?? .empty, at: WritePath(path: try store().emailPath(email)))
        }
        /// Whether `email` belongs to an account other than `uid`.
        func taken(_ email: String, by uid: String) -> Bool {
            guard let owner = store().uid(forEmail: email) else { return false }
            return owner != uid
        }
        do throws(TreeError) {
            switch op {
            case .create(var record):
                if store().user(record.uid) != nil { return refuse(.duplicateLocalID) }
                if let email = record.email, taken(email, by: record.uid) { return refuse(.emailExists) }
                record.createdAt = now
                record.validSince = now / 1000
                try put(record)
                if let email = record.email { try index(email, to: record.uid) }
                applied.value = Tree(.string(record.json.jsonString))
            case let .update(uid, changes):
                guard var record = store().user(uid) else { return refuse(.userNotFound) }
                if let expected = changes.expectedPasswordHash, expected != (record.passwordHash ?? "") { return refuse(.invalidOobCode) }
                if let email = changes.email, taken(email, by: uid) { return refuse(.emailExists) }
                let oldEmail = record.email
                if changes.removeEmail || changes.email != nil, let old = record.email {
                    try index(old, to: nil)
                    record.email = nil
                }
                if let email = changes.email {
                    try index(email, to: uid)
                    // A new address is not verified unless the change says so.
                    if oldEmail.map(AccountStore.emailKey) != AccountStore.emailKey(email) { record.emailVerified = false }
                    record.email = email
                    if record.provider == "anonymous" { record.provider = "password" }
                }
                if let hash = changes.passwordHash {
                    record.passwordHash = hash
                    if record.provider == "anonymous" { record.provider = "password" }
                }
                if changes.removeDisplayName { record.displayName = nil }
                if let name = changes.displayName { record.displayName = name }
                if let claims = changes.claims { record.claims = claims == "{}" ? nil : claims }
                if let disabled = changes.disabled { record.disabled = disabled }
                if let verified = changes.emailVerified { record.emailVerified = verified }
                if let since = changes.validSince { record.validSince = since }
                if let key = changes.refreshKey {
                    record.refreshKey = key
                    record.validSince = now / 1000
                }
                try put(record)
                applied.value = Tree(.string(record.json.jsonString))
            case .delete(let uids):
                var deleted: [JSONValue] = []
                for uid in uids {
                    guard let record = store().user(uid) else { continue }
                    if let email = record.email { try index(email, to: nil) }
                    try tree.apply(set: .empty, at: WritePath(path: try store().userPath(uid)))
                    deleted.append(.string(uid))
                }
                applied.value = Tree(.string(JSONValue.array(deleted).jsonString))
            case let .signIn(uid, hash, create):
                var record: AccountRecord
                if let existing = store().user(uid) {
                    record = existing
                    if let identity = create?.federated, create?.uid == uid { record.federated = identity }
                } else if var fresh = create, fresh.uid == uid {
                    if let email = fresh.email, taken(email, by: uid) { return refuse(.emailExists) }
                    fresh.createdAt = now
                    fresh.validSince = now / 1000
                    if let email = fresh.email { try index(email, to: uid) }
                    record = fresh
                } else {
                    return refuse(.userNotFound)
                }
                if record.disabled { return refuse(.userDisabled) }
                if let hash, hash != record.passwordHash { return refuse(.invalidPassword) }
                record.lastSignInAt = now
                try put(record)
                applied.value = Tree(.string(record.json.jsonString))
            case let .installKey(key, rotate, retain):
                var keys = store().signingKeys
                guard rotate || keys.current == nil else {
                    applied.value = Tree(.string(keys.json.jsonString))
                    return applied
                }
                // One retained key at a time: a second rotation while the replaced key is still
                // accepted would drop it before the tokens it signed expire.
                if let previous = keys.previous, previous.time > now { return refuse(.rotationTooSoon) }
                if var old = keys.current {
                    old.time = now &+ max(0, retain)
                    keys.previous = old
                }
                var fresh = key
                fresh.time = now
                keys.current = fresh
                try tree.apply(set: Tree(.string(keys.json.jsonString)), at: WritePath(path: store().keysPath))
                applied.value = Tree(.string(keys.json.jsonString))
                applied.signingKeysChanged = true
            }
        } catch {
            tree = before
            applied.outcome = .rejected(error)
            applied.value = nil
            applied.signingKeysChanged = false
        }
        return applied
    }
}
