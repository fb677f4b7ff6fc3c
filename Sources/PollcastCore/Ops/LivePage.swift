/// The small live view served at `/`: one self-contained page (no external assets) that opens an
/// `EventSource` on `/events` (passing its own query string, e.g. `?stream=101`) and shows messages per stream,
/// the connection state, the last id, resets, backlog messages apart, and the upstream status.
///
/// `window.pollcast` exposes what the page received, for tests and for curious operators.
public enum LivePage {
  /// The page for `auth.mode = none`.
  public static var html: String { render(access: AccessSettings()) }

  /// The page; with `auth.mode = jwt` it also explains how a backend mints a token and lets you paste one (it
  /// goes into the credential cookie, which `EventSource` sends on every reconnect).
  public static func render(access: AccessSettings) -> String {
    let cookie = access.cookieName
    let script = """
      <script>
      document.getElementById("token-form").addEventListener("submit", (event) => {
        event.preventDefault();
        const token = document.getElementById("token").value.trim();
        document.cookie = "\(cookie)=" + encodeURIComponent(token) + "; path=/; SameSite=Strict";
        window.location.reload();
      });
      </script>
      """
    if access.perUser {
      let section = """
        <details id="auth" open>
          <summary>This relay shows each user their own account (<code>auth.mode = upstream</code>)</summary>
          <p>Enter the API key your legacy application uses: the relay opens that account's session with the
          legacy API and streams only its messages (its own and its linked account's). The key goes into the cookie
          <code>\(cookie)</code>, which <code>EventSource</code> sends on every reconnect\(
            access.allowQueryToken ? " (or pass it as <code>?access_token=</code>)" : ""); curl sends it as
          <code>Authorization: Bearer</code>. The relay keeps it in memory only while the account is active and
          never logs it.</p>
          <form id="token-form"><input id="token" size="40" placeholder="your API key" autocomplete="off"
          type="password"> <button>use it</button></form>
        </details>
        """
      return template.replacingOccurrences(of: "<!--auth-->", with: section + script)
    }
    guard let jwt = access.jwt else { return template.replacingOccurrences(of: "<!--auth-->", with: "") }
    let section = """
      <details id="auth" open>
        <summary>This relay wants a signed token (<code>auth.mode = jwt</code>, \(jwt.algorithm.rawValue))</summary>
        <p>Your backend signs a short-lived JWT naming the streams a user may read; the browser presents it as the
        cookie <code>\(cookie)</code> (sent by <code>EventSource</code> on every reconnect)\(
          access.allowQueryToken ? ", or as <code>?access_token=</code>" : ""), and curl as
        <code>Authorization: Bearer</code>. Claims: <code>exp</code> (required), <code>streams</code>
        (<code>["101"]</code>, or <code>["*"]</code> for all), optional <code>sub</code>, <code>nbf</code>\(
          jwt.audience.map { ", and <code>aud</code> = <code>\($0)</code>" } ?? "").</p>
        <p>HS256 with nothing but <code>openssl</code> (the secret is the relay's <code>auth.jwt.key_file</code>):</p>
        <pre>b64() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
      h=$(printf '{"alg":"HS256","typ":"JWT"}' | b64)
      p=$(printf '{"sub":"alice","streams":["101"],"exp":%d}' $(( $(date +%s) + 3600 )) | b64)
      s=$(printf '%s.%s' "$h" "$p" | openssl dgst -sha256 -hmac "$(cat secret)" -binary | b64)
      echo "$h.$p.$s"</pre>
        <form id="token-form"><input id="token" size="60" placeholder="paste a token" autocomplete="off">
        <button>use it</button></form>
      </details>
      """
    return template.replacingOccurrences(of: "<!--auth-->", with: section + script)
  }

  static let template = #"""
    <!doctype html>
    <html lang="en">
    <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>Pollcast live view</title>
    <style>
      :root { font-family: system-ui, sans-serif; color: #1d2330; background: #f5f6f8; }
      body { margin: 0; }
      header { display: flex; flex-wrap: wrap; gap: 1.5rem; align-items: center; padding: .8rem 1.2rem;
               background: #1d2330; color: #fff; }
      header h1 { font-size: 1.1rem; margin: 0; }
      .pill { padding: .15rem .6rem; border-radius: 1rem; font-size: .85rem; background: #555; }
      .pill.open, .pill.live { background: #1f8a4c; } .pill.connecting, .pill.backlog { background: #b7791f; }
      .pill.closed, .pill.backoff, .pill.stopped { background: #b83232; } .pill.idle { background: #4a5a7a; }
      main { display: flex; flex-wrap: wrap; gap: 1rem; padding: 1rem 1.2rem; }
      section.stream { flex: 1 1 22rem; background: #fff; border-radius: .5rem; box-shadow: 0 1px 3px #0002; }
      section.stream h2 { font-size: 1rem; margin: 0; padding: .6rem .8rem; border-bottom: 1px solid #e3e5ea; }
      ol { list-style: none; margin: 0; padding: 0; max-height: 70vh; overflow-y: auto; }
      li.msg { padding: .45rem .8rem; border-bottom: 1px solid #f0f1f4; }
      li.msg.backlog { background: #f3f4f7; color: #6b7280; font-style: italic; }
      li.msg .meta { font-size: .75rem; color: #6b7280; }
      #notices { padding: 0 1.2rem; }
      #auth { margin: .6rem 1.2rem 0; font-size: .9rem; }
      #auth pre { background: #f4f4f4; padding: .5rem; overflow-x: auto; }
      .notice { margin: .6rem 0 0; padding: .5rem .8rem; border-radius: .4rem; background: #fff4e5;
                border: 1px solid #f0c987; font-size: .9rem; }
      code { font-size: .85rem; }
    </style>
    </head>
    <body>
    <header>
      <h1>Pollcast live view</h1>
      <span>connection <span id="connection" class="pill connecting">connecting</span></span>
      <span>upstream <span id="upstream" class="pill">unknown</span></span>
      <span>last id <code id="last-id">–</code></span>
      <span>messages <code id="count">0</code></span>
    </header>
    <!--auth-->
    <div id="notices"></div>
    <main id="streams"></main>
    <script>
    "use strict";
    (function () {
      const state = window.pollcast = {
        connection: "connecting", opens: 0, errors: 0, lastId: null, upstream: null,
        messages: [], resets: [], streamChanges: []
      };
      const $ = (id) => document.getElementById(id);
      const streams = new Map();
      function setPill(element, text) { element.textContent = text; element.className = "pill " + text; }
      function streamList(name) {
        if (!streams.has(name)) {
          const section = document.createElement("section");
          section.className = "stream";
          section.dataset.stream = name;
          const title = document.createElement("h2");
          title.textContent = "stream " + name;
          const list = document.createElement("ol");
          section.append(title, list);
          $("streams").append(section);
          streams.set(name, list);
        }
        return streams.get(name);
      }
      function notice(text) {
        const element = document.createElement("div");
        element.className = "notice";
        element.textContent = text;
        $("notices").prepend(element);
      }
      function remember(event) {
        if (event.lastEventId) { state.lastId = event.lastEventId; $("last-id").textContent = event.lastEventId; }
      }
      let source = new EventSource("/events" + window.location.search);
      source.onopen = () => { state.opens += 1; state.connection = "open"; setPill($("connection"), "open"); };
      source.onerror = () => {
        state.errors += 1;
        state.connection = source.readyState === EventSource.CLOSED ? "closed" : "connecting";
        setPill($("connection"), state.connection);
      };
      source.onmessage = (event) => {
        remember(event);
        let data;
        try { data = JSON.parse(event.data); } catch (error) { notice("unreadable event " + event.lastEventId); return; }
        const message = data.message || {};
        state.messages.push({ id: event.lastEventId, stream: data.stream, upstreamId: data.upstream_id,
                              backlog: data.backlog === true, text: message.text });
        const item = document.createElement("li");
        item.className = "msg" + (data.backlog ? " backlog" : "");
        item.dataset.id = event.lastEventId;
        const text = document.createElement("div");
        text.textContent = (message.from ? message.from + ": " : "") + (message.text ?? JSON.stringify(message));
        const meta = document.createElement("div");
        meta.className = "meta";
        meta.textContent = "#" + data.upstream_id + " · id " + event.lastEventId + (data.backlog ? " · backlog" : "");
        item.append(text, meta);
        const list = streamList(String(data.stream));
        list.append(item);
        list.scrollTop = list.scrollHeight;
        $("count").textContent = String(state.messages.length);
      };
      source.addEventListener("reset", (event) => {
        remember(event);
        let data = {};
        try { data = JSON.parse(event.data); } catch (error) {}
        state.resets.push(data);
        notice("Reset (" + data.reason + "): events between " + data.requested + " and " + data.latest +
               " cannot be replayed; showing live events from here.");
      });
      for (const type of ["stream-attached", "stream-detached"]) {
        source.addEventListener(type, (event) => {
          remember(event);
          let data = {};
          try { data = JSON.parse(event.data); } catch (error) {}
          state.streamChanges.push({ type, stream: data.stream });
          notice("Stream " + data.stream + " " + (type === "stream-attached" ? "attached" : "detached") + ".");
          if (type === "stream-attached") streamList(String(data.stream));
        });
      }
      source.addEventListener("token-expired", (event) => {
        let data = {};
        try { data = JSON.parse(event.data); } catch (error) {}
        state.tokenExpired = data;
        notice("Your token expired (exp " + data.expired_at + "). Get a fresh one: with the cookie, the browser's " +
               "reconnect then resumes from id " + (state.lastId ?? "–") + " with nothing lost.");
      });
      source.addEventListener("credential-revoked", (event) => {
        let data = {};
        try { data = JSON.parse(event.data); } catch (error) {}
        state.credentialRevoked = data;
        notice("The legacy API no longer accepts this key (" + data.reason + "): enter a valid one to go on.");
      });
      source.addEventListener("upstream", (event) => {
        let data = {};
        try { data = JSON.parse(event.data); } catch (error) {}
        state.upstream = data.state;
        setPill($("upstream"), data.state || "unknown");
      });
    })();
    </script>
    </body>
    </html>
    """#
}
