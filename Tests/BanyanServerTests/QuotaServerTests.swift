import BanyanNode
@testable import BanyanServer
import BanyanTree
import Foundation
import Testing

/// Namespace quotas over the wire (docs/operations.md, "Namespace quotas"): set and read by
/// administrators at `/.settings/quota.json`, refused writes answered in each protocol's shape.
extension RealtimeServerTests {
    @Test("quotas: administrators set, read and remove them at /.settings/quota.json; a write over the quota gets REST 507 and a realtime failure naming QUOTA; deletes go on; other namespaces are not limited")
    func namespaceQuotaOverTheWire() throws {
        try withNode("quota") { port in
            var ready = false
            for _ in 0..<300 where !ready {
                ready = ((try? httpExchange(port: port, "PUT", "/a.json?ns=rt", body: #""0123456789""#))?.status ?? 0) == 200
                if !ready { Thread.sleep(forTimeInterval: 0.1) }
            }
            #expect(ready)
            // Administrators only; the value is checked before anything is proposed.
            #expect(try httpExchange(port: port, "GET", "/.settings/quota.json?ns=rt").status == 401)
            #expect(try httpExchange(port: port, "PUT", "/.settings/quota.json?ns=rt", body: "40").status == 401)
            for bad in ["0", "-3", "1.5", #""40""#, "{}", "", "1125899906842625"] {
                let refused = try httpExchange(port: port, "PUT", "/.settings/quota.json?ns=rt&auth=owner", body: bad)
                #expect(refused.status == 400 && refused.body.contains("whole number of data bytes"), "\(bad): \(refused)")
            }
            #expect(try httpExchange(port: port, "PUT", "/.settings/quota.json?ns=$quotas&auth=owner", body: "40").status == 400)
            #expect(try httpExchange(port: port, "DELETE", "/.settings/quota.json?ns=rt&auth=owner").status == 405)
            let none = try httpExchange(port: port, "GET", "/.settings/quota.json?ns=rt&auth=owner")
            #expect(none.status == 200 && none.body == #"{"namespace":"rt","quota_bytes":null,"used_bytes":11}"#, "\(none)")

            #expect(try httpExchange(port: port, "PUT", "/.settings/quota.json?ns=rt&auth=owner", body: "40").status == 200)
            let set = try httpExchange(port: port, "GET", "/.settings/quota.json?ns=rt&auth=owner")
            #expect(set.body == #"{"namespace":"rt","quota_bytes":40,"used_bytes":11}"#, "\(set)")
            #expect(try httpExchange(port: port, "PUT", "/b.json?ns=rt", body: #""01234567890123456789""#).status == 200)  // 32
            let over = try httpExchange(port: port, "PUT", "/c.json?ns=rt", body: #""0123456789""#)
            #expect(over.status == 507 && over.body.contains("QUOTA: namespace rt holds 32 bytes of data and this write would make it 43, over its quota of 40"), "\(over)")
            #expect(try httpExchange(port: port, "PATCH", "/.json?ns=rt", body: #"{"c":"0123456789","a":null}"#).status == 200, "32 - 11 + 11 adds nothing")
            #expect(try httpExchange(port: port, "POST", "/.json?ns=rt", body: #""0123456789""#).status == 507)
            #expect(try httpExchange(port: port, "GET", "/.json?ns=rt").body == #"{"b":"01234567890123456789","c":"0123456789"}"#)
            // Another namespace is not limited.
            #expect(try httpExchange(port: port, "PUT", "/big.json?ns=other", body: "\"" + String(repeating: "x", count: 200) + "\"").status == 200)

            // A realtime client gets the SDKs' failure status, with the reason.
            let (c, _) = try open(port)
            c.text(#"{"t":"d","d":{"r":1,"a":"p","b":{"p":"/d","d":"0123456789"}}}"#)
            let answer = c.messages(until: #""r":1"#).last ?? ""
            #expect(answer.contains(#""s":"failure""#) && answer.contains("QUOTA: namespace rt holds 32 bytes"), "\(answer)")
            c.text(#"{"t":"d","d":{"r":2,"a":"p","b":{"p":"/b","d":null}}}"#)
            let deleted = c.messages(until: #""r":2"#).last ?? ""
            #expect(deleted.contains(#""s":"ok""#), "\(deleted)")
            c.text(#"{"t":"d","d":{"r":3,"a":"p","b":{"p":"/d","d":"0123456789"}}}"#)
            #expect((c.messages(until: #""r":3"#).last ?? "").contains(#""s":"ok""#))
            let used = try httpExchange(port: port, "GET", "/.settings/quota.json?ns=rt&auth=owner")
            #expect(used.body == #"{"namespace":"rt","quota_bytes":40,"used_bytes":22}"#, "\(used)")

            // Removed: writes of any size again.
            #expect(try httpExchange(port: port, "PUT", "/.settings/quota.json?ns=rt&auth=owner", body: "null").status == 200)
            #expect(try httpExchange(port: port, "GET", "/.settings/quota.json?ns=rt&auth=owner").body == #"{"namespace":"rt","quota_bytes":null,"used_bytes":22}"#)
            #expect(try httpExchange(port: port, "PUT", "/e.json?ns=rt", body: "\"" + String(repeating: "y", count: 200) + "\"").status == 200)
        }
    }
}
