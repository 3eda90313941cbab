import BanyanQuery
import BanyanTree
import Testing

/// The client's query objects: what the SDK sends for each kind of query (as the JS SDK
/// encodes them) decodes back to the same parameters on the server side.
@Suite struct QueryWireEncodingTests {
    static func text(_ value: JSONValue?) -> String {
        guard let value else { return "nil" }
        var out: [UInt8] = []
        value.appendJSON(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    @Test("each SDK call's query object, and its round trip through the server's decoder")
    func encodesAndRoundTrips() throws {
        let cases: [(Query, String)] = [
            (Query(), "nil"),
            (try Query().orderByChild("a/b"), #"{"i":"a/b"}"#),
            (try Query().orderByKey().startAt(Tree(.string("k"))), #"{"i":".key","sp":"k"}"#),
            (try Query().orderByKey().startAfter(Tree(.string("k"))), #"{"i":".key","sp":"k","sin":false}"#),
            (try Query().orderByValue().endBefore(Tree(.int(5))), #"{"i":".value","ep":5,"en":"[MIN_NAME]","ein":false}"#),
            (try Query().orderByChild("n").startAfter(Tree(.double(1.5))), #"{"i":"n","sp":1.5,"sn":"[MAX_NAME]","sin":false}"#),
            (try Query().orderByChild("n").equalTo(Tree(.string("x")), key: "k1"), #"{"i":"n","sp":"x","sn":"k1","ep":"x","en":"k1"}"#),
            (try Query().orderByPriority().startAt(Tree.empty).limitToFirst(3), #"{"sp":null,"l":3,"vf":"l"}"#),
            (try Query().limitToLast(10), #"{"l":10,"vf":"r"}"#),
            (try Query().orderByChild("n").startAt(Tree(.bool(true))).endAt(Tree(.bool(true))).limitToLast(2), #"{"i":"n","sp":true,"ep":true,"l":2,"vf":"r"}"#),
        ]
        for (query, expected) in cases {
            let object = query.params.wireObject
            #expect(Self.text(object) == expected)
            if let object { #expect(try QueryParams(wire: object) == query.params, "\(expected)") }
        }
        // The identity sorts keys; equal queries share it, different ones do not.
        let a = try Query().orderByChild("n").limitToFirst(2).params
        let b = try Query().limitToFirst(2).orderByChild("n").params
        #expect(a.identifier == b.identifier && a.identifier == #"{"i":"n","l":2,"vf":"l"}"#)
        let byKey = try Query().orderByKey().params
        #expect(QueryParams.default.identifier == "default" && byKey.identifier != "default")
    }
}
