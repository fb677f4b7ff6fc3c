import Foundation

extension Recipe {
  /// The reference chat API as a recipe (`upstream.adapter = chat`): `POST /api/session` (the API key as a bearer
  /// token) → `GET /api/messages/last` (the cursor sync) → `GET /api/messages/poll?cursor=A:1,B:2`, the primary
  /// account and its linked one (when the session names one) each a stream with its own cursor. The same text is
  /// `Config/recipes/chat.json`, the example a user copies (a test holds them equal).
  public static let chatText = """
    {
      "recipe": 1,
      "name": "chat",
      "vars": { "base": "{env:CHAT_URL:-http://127.0.0.1:9090}", "hold": 25 },
      "session": [
        {
          "method": "POST",
          "url": "{base}/api/session",
          "headers": { "Authorization": "Bearer {credential}" },
          "extract": {
            "token": { "body": "/token" },
            "user_id": { "body": "/user_id" },
            "linked_user_id": { "body": "/linked_user_id", "optional": true }
          }
        }
      ],
      "streams": ["{user_id}", "{linked_user_id}"],
      "sync": {
        "url": "{base}/api/messages/last",
        "query": { "token": "{token}" },
        "ids": "/last_ids"
      },
      "poll": {
        "url": "{base}/api/messages/poll",
        "query": { "token": "{token}", "cursor": "{cursors}", "timeout": "{hold}" },
        "timeout": 35,
        "events": { "pointer": "", "stream": "key", "id": { "event": "/id" } }
      },
      "cursor": { "scope": "stream", "list": { "each": "{stream}:{cursor}", "join": "," } },
      "user": "{user_id}"
    }
    """

  /// The chat recipe, parsed once.
  private static let chatTemplate: Recipe = {
    switch Recipe.parse(chatText, context: Context(environment: [:], hasCredential: true)) {
    case .success(let recipe): return recipe
    case .failure(let error): preconditionFailure("the built-in chat recipe does not parse: \(error)")
    }
  }()

  /// The chat recipe for an API at `baseURL` that holds a poll `holdSeconds` (the poll's deadline `marginSeconds`
  /// later).
  public static func chat(baseURL: String, holdSeconds: Double, marginSeconds: Double) -> Recipe {
    var base = baseURL
    while base.hasSuffix("/") { base.removeLast() }
    var recipe = chatTemplate
    let hold = Int(holdSeconds.rounded())
    recipe.vars = ["base": RecipeValue(text: base), "hold": RecipeValue(text: String(hold), json: String(hold))]
    recipe.poll.timeout = holdSeconds + marginSeconds
    recipe.environmentNames = []
    recipe.environmentVars = []
    return recipe
  }
}
