extension Recipe {
  /// Why `user` cannot name per-user accounts, or nil. With `auth.mode upstream` the account a key joins is the
  /// `user` the session's answer names, so that answer must come from a request that carried the key: otherwise
  /// every made-up key "passes" and joins the first account. A session step is bound to the key when one of its
  /// templates holds `{credential}`, or a value extracted by a bound step before it; `user` must use at least one
  /// value a bound step extracted, and nothing else of the session's. `user` must not be the credential itself,
  /// which would name the account (in logs and the store) by the key.
  public var userBindingProblem: String? {
    guard let user else { return nil }
    if user.placeholders.contains(.credential) {
      return "recipe.user: must not hold {credential}: the key would name its account in logs and in the store;"
        + " take the user id from a session step's answer"
    }
    var bound: Set<String> = []
    var extracted: Set<String> = []
    for step in session {
      let sendsKey = step.templates("").contains { _, template in
        template.placeholders.contains { placeholder in
          switch placeholder {
          case .credential: true
          case .name(let name): bound.contains(name)
          default: false
          }
        }
      }
      for (name, _) in step.extract {
        extracted.insert(name)
        if sendsKey { bound.insert(name) } else { bound.remove(name) }
      }
    }
    let names = user.placeholders.compactMap { placeholder -> String? in
      if case .name(let name) = placeholder { name } else { nil }
    }
    let unbound = names.filter { extracted.contains($0) && !bound.contains($0) }
    if !unbound.isEmpty || !names.contains(where: bound.contains) {
      let what = unbound.isEmpty ? "" : " (\(unbound.map { "{\($0)}" }.joined(separator: ", ")) is not)"
      return "recipe.user: must be taken from the answer of a session step that sends {credential}\(what):"
        + " otherwise any key would be admitted into an existing account"
    }
    return nil
  }
}
