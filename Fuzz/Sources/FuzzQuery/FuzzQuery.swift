/// Query parameters, both spellings: the REST query string (`orderBy`, `startAt`, `limitToFirst`,
/// … with percent-encoding) and the realtime protocol's `q` object. A query that parses is run
/// over a small tree (a window, an evaluation and a view).
///
/// Input: a selector byte; then the query string (selector even) or the JSON `q` object (odd).
import BanyanQuery
import BanyanREST
import BanyanTree
import FuzzSupport

let sample: Tree = {
    let json = #"{"a":{"h":3,"n":"x"},"b":{"h":1.5,"n":"y",".priority":2},"c":{"h":"s"},"d":true,"e":{"h":{"deep":1}},"f":null,"0":{"h":3}}"#
    return (try? TreeReader.read(Array(json.utf8))) ?? .empty
}()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzQuery(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { selector, rest in
        if selector & 1 == 0 {
            let head = HTTPHead(method: "GET", uri: "/.json?" + String(decoding: rest, as: UTF8.self), headers: [])
            switch RESTRequest.parse(head, body: [], defaultNamespace: "fuzz") {
            case .failure(let e): require(e.status == 400 && !e.message.isEmpty, "bad refusal \(e)")
            case .success(let request): if let query = request.query { run(query) }
            }
        } else {
            guard let object = try? JSONValue(parsing: rest) else { return }
            do throws(QueryError) {
                run(try QueryParams(wire: object))
            } catch {
                require(!error.message.isEmpty, "empty query error")
            }
        }
    }
}

func run(_ query: QueryParams) {
    let index = TreeIndex(kind: query.index, tree: sample)
    let window = query.window(in: index)
    require(window.lowerBound >= 0 && window.upperBound <= index.count, "window \(window) outside 0..<\(index.count)")
    if let limit = query.limit { require(window.count <= limit, "window of \(window.count) over the limit \(limit)") }
    let result = query.evaluate(sample, index: index)
    require(result.childCount <= sample.childCount, "evaluation grew the tree")
    _ = QueryView(params: query, tree: sample)
}
