import BanyanBasics
@testable import BanyanStateMachine
import BanyanTree
import Testing

/// The account service's decisions in the replicated state machine (docs/accounts.md):
/// uniqueness and existence decided at the command's position in the log, identically on every
/// replica; signing keys installed once and rotated with the previous key retained.
@Suite struct AccountTests {
    struct Log {
        var machine = StateMachine()
        var index: UInt64 = 0
        var seq: UInt64 = 0

        mutating func apply(_ op: AccountOp, project: String = "demo", at time: Int64 = 1_000_000, auth: ClientAuth? = nil) -> StateMachine.Applied? {
            index += 1
            seq += 1
            let payload = CommandEnvelope(namespace: project, session: 1, seq: seq, timestamp: time, command: .account(op), auth: auth).encoded()
            return machine.apply(payload, index: index)
        }

        func store(_ project: String = "demo") -> AccountStore { machine.accounts(project) }
    }

    static func record(_ uid: String, email: String? = nil, hash: String? = "scrypt$10$8$1$c2FsdA$aGFzaA") -> AccountRecord {
        AccountRecord(uid: uid, email: email, passwordHash: hash, provider: "password", refreshKey: "rk-" + uid)
    }

    static func refusal(_ applied: StateMachine.Applied?) -> AccountRefusal? { applied.flatMap { AccountRefusal($0.outcome) } }

    /// The record an identity-provider sign-in proposes for `google:<sub>`.
    static func federated(_ sub: String, name: String?, email: String? = "ada@example.com") -> AccountRecord {
        let identity = FederatedIdentity(
            providerID: "google.com", rawID: sub, federatedID: "https://accounts.google.com/" + sub, email: email, emailVerified: true, displayName: name,
            photoURL: "https://p.example/a.png")
        return AccountRecord(uid: "google:" + sub, provider: "google.com", refreshKey: "rk-" + sub, federated: identity)
    }

    @Test("identity-provider sign-in: the first makes the account with its profile (its email not indexed), a later one replaces the profile, a disabled account is refused unchanged")
    func federatedSignIn() throws {
        var log = Log()
        #expect(log.apply(.create(Self.record("pw", email: "ada@example.com")))?.outcome == .ok)
        let first = log.apply(.signIn(uid: "google:1", passwordHash: nil, createIfAbsent: Self.federated("1", name: "Ada")), at: 2_000_000)
        #expect(first?.outcome == .ok)
        let made = try #require(log.store().user("google:1"))
        #expect(made.createdAt == 2_000_000 && made.lastSignInAt == 2_000_000 && made.email == nil && made.federated?.displayName == "Ada")
        #expect(made.profileEmail == "ada@example.com" && made.profileEmailVerified && made.profileDisplayName == "Ada")
        #expect(log.store().uid(forEmail: "ada@example.com") == "pw", "the provider's email does not take the index")
        #expect(AccountRecord(json: made.json) == made)

        #expect(log.apply(.signIn(uid: "google:1", passwordHash: nil, createIfAbsent: Self.federated("1", name: "Ada L", email: nil)), at: 3_000_000)?.outcome == .ok)
        let again = try #require(log.store().user("google:1"))
        #expect(again.createdAt == 2_000_000 && again.lastSignInAt == 3_000_000 && again.federated?.displayName == "Ada L" && again.profileEmail == nil)
        #expect(log.store().count == 2)

        var disable = AccountChanges()
        disable.disabled = true
        #expect(log.apply(.update(uid: "google:1", disable))?.outcome == .ok)
        let before = log.store().user("google:1")
        #expect(Self.refusal(log.apply(.signIn(uid: "google:1", passwordHash: nil, createIfAbsent: Self.federated("1", name: "Eve")), at: 4_000_000)) == .userDisabled)
        #expect(log.store().user("google:1") == before)
    }

    @Test("every account command survives the log's codec (version 7, kind 11)")
    func codec() throws {
        var changes = AccountChanges()
        changes.email = "a@b.c"
        changes.removeDisplayName = true
        changes.claims = #"{"admin":true}"#
        changes.disabled = true
        changes.validSince = 12
        changes.refreshKey = "k"
        changes.expectedPasswordHash = ""
        let ops: [AccountOp] = [
            .create(Self.record("u1", email: "x@y.z")), .update(uid: "u1", changes), .delete(uids: ["a", "b.c/$"]),
            .signIn(uid: "u1", passwordHash: "h", createIfAbsent: Self.record("u1", hash: nil)), .signIn(uid: "u2", passwordHash: nil, createIfAbsent: nil),
            .installKey(SigningKey(id: "banyan-1", secret: "c2VjcmV0"), rotate: true, retainMilliseconds: 3_900_000),
            .signIn(uid: "google:1", passwordHash: nil, createIfAbsent: Self.federated("1", name: "Ada")),
        ]
        for op in ops {
            let envelope = CommandEnvelope(namespace: "demo", session: 3, seq: 4, timestamp: 5, command: .account(op))
            let bytes = envelope.encoded()
            #expect(bytes[0] == 7)
            #expect(bytes.count == envelope.byteCount)
            #expect(CommandEnvelope(decoding: bytes) == envelope)
        }
        // A damaged account body is malformed, never a crash.
        var bad = CommandEnvelope(namespace: "demo", session: 3, seq: 4, timestamp: 5, command: .account(.delete(uids: ["a"]))).encoded()
        if let brace = bad.firstIndex(of: UInt8(ascii: "{")) { bad[brace] = UInt8(ascii: "[") }
        #expect(CommandEnvelope(decoding: bad) == nil)
    }

    @Test("two sign-ups with one email (in any letter case): the first in the log wins, the second is EMAIL_EXISTS, on every replica")
    func emailUniqueAtLogPosition() {
        let first = AccountOp.create(Self.record("u1", email: "Ada@Example.com"))
        let second = AccountOp.create(Self.record("u2", email: "ada@EXAMPLE.com"))
        var a = Log()
        var b = Log()
        #expect(a.apply(first)?.outcome == .ok)
        #expect(Self.refusal(a.apply(second)) == .emailExists)
        #expect(b.apply(first)?.outcome == .ok)
        #expect(Self.refusal(b.apply(second)) == .emailExists)
        #expect(a.machine.image() == b.machine.image(), "replicas that applied the same log hold the same state")
        #expect(a.store().user(email: "ADA@example.COM")?.uid == "u1")
        #expect(a.store().user("u2") == nil)
        // The order of the log decides: reversed, the other account wins.
        var c = Log()
        #expect(c.apply(second)?.outcome == .ok)
        #expect(Self.refusal(c.apply(first)) == .emailExists)
        #expect(c.store().user(email: "ada@example.com")?.uid == "u2")
    }

    @Test("a uid is unique; the creation time is the log's, not the proposer's")
    func uidUniqueAndStamped() throws {
        var log = Log()
        var proposed = Self.record("u1")
        proposed.createdAt = 42
        let applied = log.apply(.create(proposed), at: 5_000_000)
        #expect(applied?.outcome == .ok)
        #expect(log.store().user("u1")?.createdAt == 5_000_000)
        #expect(log.store().user("u1")?.validSince == 5_000)
        #expect(Self.refusal(log.apply(.create(Self.record("u1", email: "new@x.y")))) == .duplicateLocalID)
        #expect(log.store().uid(forEmail: "new@x.y") == nil, "a refused command changes nothing")
        // An earlier leader stamp never moves time backwards.
        _ = log.apply(.signIn(uid: "u1", passwordHash: proposed.passwordHash, createIfAbsent: nil), at: 4_000_000)
        #expect(log.store().user("u1")?.lastSignInAt == 5_000_000)
    }

    @Test("uids and emails with characters keys cannot hold are escaped, injectively")
    func escaping() {
        var log = Log()
        #expect(log.apply(.create(Self.record("a.b/c$d#[e]%", email: "x.y+z@ex.am.ple")))?.outcome == .ok)
        #expect(log.apply(.create(Self.record("a%2Eb")))?.outcome == .ok)
        #expect(log.store().user("a.b/c$d#[e]%")?.email == "x.y+z@ex.am.ple")
        #expect(log.store().user("a%2Eb") != nil)
        #expect(AccountStore.escape("a.b") != AccountStore.escape("a%2Eb"))
        #expect(log.store().count == 2)
    }

    @Test("sign-in: refused for a disabled or missing account, or when the password changed after the proposer checked it")
    func signInDecisions() {
        var log = Log()
        let original = Self.record("u1", email: "u@x.y")
        #expect(log.apply(.create(original))?.outcome == .ok)
        #expect(log.apply(.signIn(uid: "u1", passwordHash: original.passwordHash, createIfAbsent: nil))?.outcome == .ok)
        #expect(Self.refusal(log.apply(.signIn(uid: "nobody", passwordHash: nil, createIfAbsent: nil))) == .userNotFound)
        var changes = AccountChanges()
        changes.passwordHash = "scrypt$10$8$1$bmV3$bmV3"
        changes.refreshKey = "rotated"
        #expect(log.apply(.update(uid: "u1", changes), at: 2_000_000)?.outcome == .ok)
        #expect(log.store().user("u1")?.refreshKey == "rotated")
        #expect(log.store().user("u1")?.validSince == 2_000, "a new refresh key ends tokens issued before")
        #expect(Self.refusal(log.apply(.signIn(uid: "u1", passwordHash: original.passwordHash, createIfAbsent: nil))) == .invalidPassword)
        var disable = AccountChanges()
        disable.disabled = true
        #expect(log.apply(.update(uid: "u1", disable))?.outcome == .ok)
        #expect(Self.refusal(log.apply(.signIn(uid: "u1", passwordHash: changes.passwordHash, createIfAbsent: nil))) == .userDisabled)
        // A custom-token sign-in makes the account once.
        let custom = AccountRecord(uid: "c1", provider: "custom", refreshKey: "r")
        let made = log.apply(.signIn(uid: "c1", passwordHash: nil, createIfAbsent: custom), at: 3_000_000)
        #expect(made?.outcome == .ok)
        #expect(log.store().user("c1")?.createdAt == 3_000_000)
        #expect(log.store().user("c1")?.lastSignInAt == 3_000_000)
        _ = log.apply(.signIn(uid: "c1", passwordHash: nil, createIfAbsent: custom), at: 3_500_000)
        #expect(log.store().user("c1")?.createdAt == 3_000_000)
        #expect(log.store().user("c1")?.lastSignInAt == 3_500_000)
    }

    @Test("updates: email moves its index entry; a taken email and a reset code for an old password are refused; claims {} clears them")
    func updates() {
        var log = Log()
        _ = log.apply(.create(Self.record("u1", email: "one@x.y")))
        _ = log.apply(.create(Self.record("u2", email: "two@x.y")))
        var taken = AccountChanges()
        taken.email = "TWO@x.y"
        #expect(Self.refusal(log.apply(.update(uid: "u1", taken))) == .emailExists)
        var move = AccountChanges()
        move.email = "three@x.y"
        move.claims = #"{"role":"editor"}"#
        move.displayName = "One"
        #expect(log.apply(.update(uid: "u1", move))?.outcome == .ok)
        #expect(log.store().uid(forEmail: "one@x.y") == nil)
        #expect(log.store().user(email: "three@x.y")?.claims == #"{"role":"editor"}"#)
        var clear = AccountChanges()
        clear.claims = "{}"
        clear.removeDisplayName = true
        _ = log.apply(.update(uid: "u1", clear))
        #expect(log.store().user("u1")?.claims == nil)
        #expect(log.store().user("u1")?.displayName == nil)
        var reset = AccountChanges()
        reset.passwordHash = "scrypt$10$8$1$eA$eA"
        reset.expectedPasswordHash = "not the current one"
        #expect(Self.refusal(log.apply(.update(uid: "u1", reset))) == .invalidOobCode)
        #expect(Self.refusal(log.apply(.update(uid: "ghost", move))) == .userNotFound)
    }

    @Test("deletion removes the account and frees its email; deleting a missing uid changes nothing")
    func deletion() {
        var log = Log()
        _ = log.apply(.create(Self.record("u1", email: "a@x.y")))
        let deleted = log.apply(.delete(uids: ["u1", "ghost"]))
        #expect(deleted?.outcome == .ok)
        #expect(deleted?.value == Tree(.string(#"["u1"]"#)))
        #expect(log.store().user("u1") == nil)
        #expect(log.store().uid(forEmail: "a@x.y") == nil)
        #expect(log.apply(.create(Self.record("u9", email: "a@x.y")))?.outcome == .ok)
        #expect(log.machine.tree(StateMachine.accountsNamespace).child(at: Path(segments: [ChildKey(unchecked: "demo"), ChildKey(unchecked: "u")])).childCount == 1)
    }

    @Test("signing keys: the first install wins, a later one without rotate changes nothing; rotation keeps the previous key until its tokens expire")
    func keys() {
        var log = Log()
        let k1 = SigningKey(id: "banyan-1", secret: "AAAA")
        let k2 = SigningKey(id: "banyan-2", secret: "BBBB")
        let first = log.apply(.installKey(k1, rotate: false, retainMilliseconds: 0), at: 1_000)
        #expect(first?.signingKeysChanged == true)
        let second = log.apply(.installKey(k2, rotate: false, retainMilliseconds: 0), at: 2_000)
        #expect(second?.outcome == .ok && second?.signingKeysChanged == false)
        #expect(log.store().signingKeys.current?.id == "banyan-1")
        let rotated = log.apply(.installKey(k2, rotate: true, retainMilliseconds: 3_600_000), at: 10_000)
        #expect(rotated?.signingKeysChanged == true)
        let keys = log.machine.signingKeys(projects: ["demo"])["demo"]
        #expect(keys?.current?.id == "banyan-2")
        #expect(keys?.previous?.id == "banyan-1")
        #expect(keys?.accepted(now: 3_609_999).map(\.id) == ["banyan-2", "banyan-1"])
        #expect(keys?.accepted(now: 3_610_000).map(\.id) == ["banyan-2"], "the previous key lapses once its last tokens expired")
        // Keys travel in snapshots: a machine restored from the image holds them.
        let restored = try? StateMachine(image: log.machine.image())
        #expect(restored?.signingKeys(projects: ["demo"]) == log.machine.signingKeys(projects: ["demo"]))
        #expect(restored?.accounts("demo").signingKeys.current?.secret == "BBBB")
    }

    @Test("account commands carrying a client's auth, or naming an invalid project, are refused and change nothing")
    func refusals() {
        var log = Log()
        #expect(Self.refusal(log.apply(.create(Self.record("u1")), auth: .signedOut)) == .notAdministrator)
        #expect(Self.refusal(log.apply(.create(Self.record("u1")), auth: .user(json: Array(#"{"uid":"u1"}"#.utf8)))) == .notAdministrator)
        #expect(Self.refusal(log.apply(.create(Self.record("u1")), project: "Bad.Project")) == .invalidProject)
        #expect(log.machine.tree(StateMachine.accountsNamespace).isEmpty)
    }

    @Test("projects keep separate accounts")
    func projects() {
        var log = Log()
        #expect(log.apply(.create(Self.record("u1", email: "a@x.y")), project: "one")?.outcome == .ok)
        #expect(log.apply(.create(Self.record("u1", email: "a@x.y")), project: "two")?.outcome == .ok)
        #expect(log.store("one").count == 1 && log.store("two").count == 1)
    }

    @Test("listing pages through accounts in key order")
    func listing() {
        var log = Log()
        for i in 0..<7 { _ = log.apply(.create(Self.record("user\(i)"))) }
        let first = log.store().list(after: nil, limit: 3)
        #expect(first.users.map(\.uid) == ["user0", "user1", "user2"])
        #expect(first.next == "user2")
        let second = log.store().list(after: first.next, limit: 3)
        #expect(second.users.map(\.uid) == ["user3", "user4", "user5"])
        let last = log.store().list(after: second.next, limit: 3)
        #expect(last.users.map(\.uid) == ["user6"])
        #expect(last.next == nil)
    }

    /// An email whose index key (each `%` escaped to three bytes) makes the path too long.
    static let overlongEmail = String(repeating: "%", count: 252) + "@%"

    @Test("a command whose write fails is all or nothing: a create leaves no record, an update keeps the old email's index entry")
    func failedCommandLeavesNothing() {
        var log = Log()
        let created = log.apply(.create(Self.record("u1", email: Self.overlongEmail)), project: "demo-banyan")
        guard case .rejected? = created?.outcome else { Issue.record("expected a rejection: \(String(describing: created?.outcome))"); return }
        #expect(log.store("demo-banyan").user("u1") == nil, "no record without its index entry")
        #expect(log.machine.tree(StateMachine.accountsNamespace).isEmpty)

        #expect(log.apply(.create(Self.record("u2", email: "b@x.y")), project: "demo-banyan")?.outcome == .ok)
        var changes = AccountChanges()
        changes.email = Self.overlongEmail
        let updated = log.apply(.update(uid: "u2", changes), project: "demo-banyan")
        guard case .rejected? = updated?.outcome else { Issue.record("expected a rejection: \(String(describing: updated?.outcome))"); return }
        #expect(log.store("demo-banyan").user("u2")?.email == "b@x.y")
        #expect(log.store("demo-banyan").uid(forEmail: "b@x.y") == "u2", "the old email stays indexed")
        #expect(Self.refusal(log.apply(.create(Self.record("u3", email: "b@x.y")), project: "demo-banyan")) == .emailExists, "nobody else can take it")
    }

    @Test("a new email is not verified unless the change says so")
    func emailChangeResetsVerified() {
        var log = Log()
        var ada = Self.record("u1", email: "a@x.y")
        ada.emailVerified = true
        #expect(log.apply(.create(ada))?.outcome == .ok)
        var same = AccountChanges()
        same.email = "A@x.y"
        #expect(log.apply(.update(uid: "u1", same))?.outcome == .ok)
        #expect(log.store().user("u1")?.emailVerified == true, "the same address in another case stays verified")
        var changes = AccountChanges()
        changes.email = "b@x.y"
        #expect(log.apply(.update(uid: "u1", changes))?.outcome == .ok)
        #expect(log.store().user("u1")?.emailVerified == false)
        changes.email = "c@x.y"
        changes.emailVerified = true
        #expect(log.apply(.update(uid: "u1", changes))?.outcome == .ok)
        #expect(log.store().user("u1")?.emailVerified == true, "an explicit emailVerified wins")
    }

    @Test("a second rotation while the replaced key is still accepted is refused; once it lapsed, rotation works again")
    func rotationWhileRetained() {
        var log = Log()
        #expect(log.apply(.installKey(SigningKey(id: "banyan-1", secret: "AAAA"), rotate: false, retainMilliseconds: 0), at: 1_000)?.outcome == .ok)
        #expect(log.apply(.installKey(SigningKey(id: "banyan-2", secret: "BBBB"), rotate: true, retainMilliseconds: 60_000), at: 2_000)?.outcome == .ok)
        let early = log.apply(.installKey(SigningKey(id: "banyan-3", secret: "CCCC"), rotate: true, retainMilliseconds: 60_000), at: 30_000)
        #expect(Self.refusal(early) == .rotationTooSoon)
        #expect(early?.signingKeysChanged == false)
        #expect(log.store().signingKeys.accepted(now: 30_000).map(\.id) == ["banyan-2", "banyan-1"], "the retained key is still accepted")
        let later = log.apply(.installKey(SigningKey(id: "banyan-3", secret: "CCCC"), rotate: true, retainMilliseconds: 60_000), at: 62_001)
        #expect(later?.outcome == .ok)
        #expect(log.store().signingKeys.accepted(now: 62_001).map(\.id) == ["banyan-3", "banyan-2"])
    }

    @Test("signing keys are read only for the projects asked for")
    func keysOfNamedProjects() {
        var log = Log()
        _ = log.apply(.installKey(SigningKey(id: "banyan-1", secret: "AAAA"), rotate: false, retainMilliseconds: 0), project: "served")
        _ = log.apply(.installKey(SigningKey(id: "banyan-2", secret: "BBBB"), rotate: false, retainMilliseconds: 0), project: "other")
        #expect(Array(log.machine.signingKeys(projects: ["served", "absent", "Bad.Project"]).keys) == ["served"])
    }
}
