import BanyanSession
import Testing

@Suite struct SessionIdentityTests {
    @Test("a session id round-trips through its text form; anything else is refused")
    func roundTrip() {
        for identity in [
            SessionIdentity(node: 1, connection: 0xC0FFEE, secret: 0), SessionIdentity(node: .max, connection: .max, secret: .max),
            SessionIdentity(node: 0, connection: 1, secret: 0x1234_5678_9ABC_DEF0),
        ] {
            #expect(SessionIdentity(parsing: Substring(identity.description)) == identity)
        }
        #expect(SessionIdentity(parsing: "3-c0ffee-5ec2e7")?.connection == 0xC0FFEE)
        for bad in [
            "", "1-2", "1-2-3-4", "1--3", "-2-3", "1-2-", "1-0-3", "1-C0FFEE-3", "1-2-x", "1-2-+3", " 1-2-3",
            "1-2-" + String(repeating: "f", count: 17), String(repeating: "1", count: 100), "s-usc1a-nss-1",
        ] {
            #expect(SessionIdentity(parsing: Substring(bad)) == nil, "\(bad)")
        }
    }
}
