/// What of an answer may be shown or kept: a body's snippet with secrets cut out, a session answer's shape without
/// its values, and the refusal of values that cannot be sent back.
extension RecipeAnswer {
  /// Throws when `text`, a value the API gave for the relay to send back, holds a control byte other than HTAB: a
  /// broken or hostile answer, refused before the value is kept, stored or placed in a request. Never shows the value.
  static func refuseControlBytes(_ text: String, _ what: String) throws(UpstreamError) {
    if let error = controlByteRefusal(text, what) { throw error }
  }

  /// `refuseControlBytes`'s error, for a caller that returns it rather than throws.
  static func controlByteRefusal(_ text: String, _ what: String) -> UpstreamError? {
    OutgoingRequest.problem(inHeaderValue: text, what).map { UpstreamError(.decoding, "answer refused: \($0)") }
  }

  /// A session answer's shape for an error's cause: its members' names, never their values (a session answer holds
  /// fresh tokens that no scope knows as secrets yet).
  static func shape(_ json: RawJSON?) -> String {
    guard let json else { return "the answer is not JSON" }
    guard case .object(let members) = json.value else { return "the answer is JSON but not an object" }
    let names = members.prefix(12).map { JSONText.quoted(String($0.key.prefix(40))) }
    return "the answer's members: " + (names.isEmpty ? "none" : names.joined(separator: ", "))
      + (members.count > 12 ? ", …" : "")
  }

  /// The first 200 characters of a body for an error's cause, with every secret cut out.
  static func snippet(_ text: RepairedText, _ scope: RecipeScope) -> String? {
    // Scrubbed before it is cut, so that a secret across the cut is not shown in part.
    let secrets = scope.redactions ?? scope.secrets
    let longest = secrets.map(\.count).max() ?? 0
    let shown = String(UpstreamResponse.scrub(String(text.text.prefix(200 + 6 * longest)), secrets).prefix(200))
    return shown.isEmpty ? nil : shown
  }
}
