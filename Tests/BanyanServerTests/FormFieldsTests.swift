@testable import BanyanServer
import Testing

/// The two token endpoints (refresh tokens, service accounts) read their bodies with one helper.
@Suite struct FormFieldsTests {
    func names(_ r: Result<[(String, String)], AccountService.FormProblem>) -> [String]? {
        guard case .success(let fields) = r else { return nil }
        return fields.map { "\($0.0)=\($0.1)" }
    }

    @Test("a form body, percent-decoded, in order and with repeats kept; a JSON object's string members; other shapes refused by kind")
    func bodies() {
        let form = AccountService.formFields(body: Array("grant_type=refresh_token&refresh_token=a%2Bb&x=1&x=2".utf8), contentType: "application/x-www-form-urlencoded")
        #expect(names(form) == ["grant_type=refresh_token", "refresh_token=a+b", "x=1", "x=2"])
        // No content type: a form, as Google's libraries send it.
        #expect(names(AccountService.formFields(body: Array("a=1".utf8), contentType: nil)) == ["a=1"])
        let json = AccountService.formFields(body: Array(#"{"grant_type":"refresh_token","n":5,"refresh_token":"t"}"#.utf8), contentType: "Application/JSON; charset=utf-8")
        #expect(names(json) == ["grant_type=refresh_token", "refresh_token=t"])
        for body in ["[1]", "\"s\"", "{", ""] {
            guard case .failure(.notAnObject) = AccountService.formFields(body: Array(body.utf8), contentType: "application/json") else {
                Issue.record("JSON body \(body) was not refused as not an object")
                continue
            }
        }
        guard case .failure(.badForm) = AccountService.formFields(body: Array("a=%zz".utf8), contentType: nil) else {
            Issue.record("a bad percent escape was not refused")
            return
        }
    }
}
