extension Configuration {
  /// Every configuration key. Keep in step with the README's reference table (`pollcast --help-config`).
  public static let settings: [Setting] = [
    .string(
      "server.listen", \.server.listen,
      "Address the SSE server listens on, HOST:PORT or [IPv6]:PORT; port 0 picks a free one."),
    .int("server.max_header_bytes", \.server.maxHeaderBytes, "Largest request line plus headers accepted."),
    .int("server.max_url_bytes", \.server.maxURLBytes, "Longest request target accepted (414 beyond)."),
    .int("server.max_body_bytes", \.server.maxBodyBytes, "Largest request body accepted."),
    .double(
      "server.header_timeout_seconds", \.server.headerTimeoutSeconds,
      "A connection must complete each request within this time of connecting or of its previous answer (slowloris guard; also ends idle keep-alive)."
    ),
    .int(
      "server.descriptor_reserve", \.server.descriptorReserve,
      "File descriptors kept for health checks and the upstream: new streams are refused (503) within it."),
    .double(
      "server.timeout_seconds", \.server.timeoutSeconds,
      "Read/write timeout of requests and keep-alive connections; for a stream, how long queued bytes may wait for"
        + " a peer that reads none (a stream is never cut for sending nothing). Must exceed sse.heartbeat_seconds."),
    .int("server.backlog", \.server.backlog, "listen(2) backlog for bursts of new connections."),
    .double(
      "server.shutdown_spread_seconds", \.server.shutdownSpreadSeconds,
      "On SIGTERM, end streams spread over this window so clients do not reconnect at once."),
    .double(
      "server.shutdown_deadline_seconds", \.server.shutdownDeadlineSeconds,
      "On SIGTERM, the longest wait for streams to flush before exiting."),
    .int(
      "server.max_connections", \.server.maxConnections,
      "Streams open at once overall (503 beyond); 0: 90 % of what the descriptor limit leaves after the reserve."),
    .int(
      "server.max_connections_per_address", \.server.maxConnectionsPerAddress,
      "Streams open at once from one client address (429 beyond); 0 no limit (behind a proxy, set trusted_proxies first)."
    ),
    .int(
      "server.max_connections_per_subject", \.server.maxConnectionsPerSubject,
      "Streams open at once per token subject (sub) or account (429 beyond); 0 no limit."),
    .list(
      "server.trusted_proxies", \.server.trustedProxies,
      "Proxy addresses or CIDR blocks whose X-Forwarded-For is believed; every other sender's is ignored."),
    .int(
      "server.loop_probe_ms", \.server.loopProbeMilliseconds,
      "How often a timer checks that the event loop runs on time (1-60000); any stall longer than this shows in"
        + " pollcast_event_loop_lateness_seconds. Each check wakes the loop once."),
    .string(
      "store.kind", \.store.kind,
      "Where the ring, ids and upstream cursors live: memory (lost on restart), sqlite (store.path, survives"
        + " restarts and kill -9) or redis (store.redis_url: several nodes share the feed, one polls)."),
    .string("store.path", \.store.path, "store.kind sqlite: the database file (created when missing; WAL beside it)."),
    .string(
      "store.synchronous", \.store.synchronous,
      "store.kind sqlite: normal (a commit survives a process crash; the last ones may be lost on power loss) or"
        + " full (fsync per batch: survives power loss too)."),
    .bool(
      "store.reset_if_corrupt", \.store.resetIfCorrupt,
      "store.kind sqlite: move a corrupt or foreign file aside (<path>.corrupt-<time>) and start empty, instead of"
        + " exiting 74."),
    .bool(
      "store.reset_on_source_change", \.store.resetOnSourceChange,
      "store.kind sqlite: a store filled from another upstream (adapter, URL) is moved aside"
        + " (<path>.source-<time>) and the relay starts empty, instead of exiting 78."),
    .string(
      "store.redis_url", \.store.redisURL,
      "store.kind redis: redis://[:password@]host[:port][/db] or unix:///path/redis.sock[?db=N]."),
    .string(
      "store.redis_prefix", \.store.redisPrefix,
      "store.kind redis: key prefix, so several clusters can share one Redis (<prefix>{<feed>}:events, …)."),
    .double(
      "store.lease_seconds", \.store.leaseSeconds,
      "store.kind redis: the poller lease; a dead leader's feed is taken over within about this time."),
    .string(
      "store.node_id", \.store.nodeID,
      "store.kind redis: this node's name in leases and logs; empty: <host>-<pid>-<random>."),
    .string(
      "auth.mode", \.auth.mode,
      "Who may read what: none (anyone, every stream), jwt (a signed token naming its streams) or upstream (each"
        + " subscriber's own legacy key: its own account's streams, one upstream loop per account)."),
    .string(
      "auth.cookie_name", \.auth.cookieName,
      "Cookie holding the credential (after Authorization: Bearer), for EventSource with withCredentials."),
    .bool(
      "auth.allow_query_token", \.auth.allowQueryToken,
      "Also accept the credential as ?access_token= (it can end up in proxy logs; off by default)."),
    .string(
      "auth.credential_charset", \.auth.credentialCharset,
      "What a subscriber's credential may hold: b64token (RFC 6750: letters, digits, -._~+/ and = padding) or"
        + " visible (any visible ASCII, for legacy keys that need it); anything else is 401 malformed_credential."),
    .int(
      "auth.max_failures_per_minute", \.auth.maxFailuresPerMinute,
      "Failed credential checks one address may make per minute before it gets 429; 0 no limit."),
    .double(
      "auth.credential_cache_seconds", \.auth.credentialCacheSeconds,
      "auth.mode upstream: a refused key is answered from memory this long; an accepted one is re-checked after it."),
    .string("auth.jwt.algorithm", \.auth.jwt.algorithm, "HS256, RS256 or ES256; tokens signed otherwise are refused."),
    .string(
      "auth.jwt.key_file", \.auth.jwt.keyFile,
      "HS256: file holding the secret (32+ bytes); RS256/ES256: PEM public key file."),
    .string(
      "auth.jwt.keys_directory", \.auth.jwt.keysDirectory,
      "Directory of <kid>.pem / <kid>.key files, selected by the token's kid (key rotation)."),
    .string("auth.jwt.audience", \.auth.jwt.audience, "Required aud claim; empty: aud is not checked."),
    .double(
      "auth.jwt.leeway_seconds", \.auth.jwt.leewaySeconds, "Clock skew allowed when checking exp and nbf."),
    .list(
      "cors.allowed_origins", \.cors.allowedOrigins,
      "Origins allowed to read the streams cross-origin (exact https://host[:port], or *)."),
    .bool("cors.allow_credentials", \.cors.allowCredentials, "Send Access-Control-Allow-Credentials (never with *)."),
    .int("cors.max_age_seconds", \.cors.maxAgeSeconds, "How long browsers may cache a preflight answer."),
    .double("sse.heartbeat_seconds", \.sse.heartbeatSeconds, "Interval of heartbeat comment lines on idle streams."),
    .int("sse.retry_ms", \.sse.retryMilliseconds, "The retry: reconnection delay sent to clients, in milliseconds."),
    .int(
      "sse.max_pending_bytes", \.sse.maxPendingBytes,
      "Unsent bytes a client may fall behind by before it is disconnected."),
    .double(
      "sse.max_connection_age_seconds", \.sse.maxConnectionAgeSeconds,
      "End streams after this long so clients reconnect and resume; 0 never."),
    .double(
      "sse.max_connection_age_jitter_seconds", \.sse.maxConnectionAgeJitterSeconds,
      "Random extra age, 0 to this, so streams do not end together."),
    .int(
      "sse.replay_chunk_bytes", \.sse.replayChunkBytes,
      "Replay queued per step for a resuming client before waiting for its socket."),
    .int("ring.max_events", \.ring.maxEvents, "Events kept for resume."),
    .int("ring.max_bytes", \.ring.maxBytes, "Encoded bytes kept for resume."),
    .double(
      "ring.max_age_seconds", \.ring.maxAgeSeconds, "Oldest age of an event kept for resume; 0 disables the age bound."),
    .string("log.level", \.log.level, "trace, debug, info, notice, warning, error or critical."),
    .string("log.format", \.log.format, "logfmt or json."),
    .string(
      "upstream.adapter", \.upstream.adapter,
      "chat (the session/last/poll API), generic (any single-stream long-poll API) or recipe (upstream.recipe)."),
    .recipe(
      "upstream.recipe", \.upstream.recipe,
      "The recipe of upstream.adapter recipe: a file path, or the recipe object itself (README: Write a recipe)."),
    .string("upstream.url", \.upstream.url, "Base URL of the legacy chat API, e.g. https://legacy.example.com."),
    .string("upstream.api_key", \.upstream.apiKey, "API key for the chat API's session call (never logged)."),
    .double(
      "upstream.poll_timeout_seconds", \.upstream.pollTimeoutSeconds, "How long the chat API holds a poll (timeout=)."),
    .double(
      "upstream.request_margin_seconds", \.upstream.requestMarginSeconds,
      "Added to the hold for a poll's client-side deadline."),
    .double(
      "upstream.request_timeout_seconds", \.upstream.requestTimeoutSeconds,
      "Deadline of the session and last-ids calls."),
    .double(
      "upstream.connect_timeout_seconds", \.upstream.connectTimeoutSeconds, "Deadline for connecting to the upstream."),
    .double(
      "upstream.backoff_base_seconds", \.upstream.backoffBaseSeconds,
      "Full-jitter backoff: first ceiling (doubles per failure)."),
    .double("upstream.backoff_cap_seconds", \.upstream.backoffCapSeconds, "Full-jitter backoff: largest ceiling."),
    .string(
      "upstream.start_from", \.upstream.startFrom,
      "First start: latest (only new messages) or earliest (everything, as backlog)."),
    .double(
      "upstream.idle_after_seconds", \.upstream.idleAfterSeconds,
      "Stop polling after this long without subscribers; 0 never idles (auth.mode upstream: an account's grace"
        + " period, 0 means 30 s)."),
    .int(
      "upstream.max_accounts", \.upstream.maxAccounts,
      "auth.mode upstream: accounts polling at once; a new one beyond gets 503."),
    .int(
      "upstream.max_retained_accounts", \.upstream.maxRetainedAccounts,
      "auth.mode upstream: accounts kept with their ring for resumes; the least recently used idle one is evicted."),
    .int(
      "upstream.max_total_ring_bytes", \.upstream.maxTotalRingBytes,
      "auth.mode upstream: ring bytes over all accounts; idle accounts are evicted, least recently used first."),
    .double(
      "upstream.ready_window_seconds", \.upstream.readyWindowSeconds,
      "/readyz wants a poll completed within this window."),
    .double(
      "upstream.resync_interval_seconds", \.upstream.resyncIntervalSeconds,
      "Re-read the upstream's newest ids (a sync step) once this long has passed, at the first answer that"
        + " leaves a stream's cursor where it was, so ids that went backwards are noticed."),
    .double(
      "upstream.min_poll_interval_seconds", \.upstream.minPollIntervalSeconds,
      "Polls that come back sooner than this with nothing new are spaced: at least this long from one poll's start"
        + " to the next, growing with full jitter (up to backoff_cap_seconds) while it goes on; a held answer or"
        + " events reset it. 0 never spaces."),
    .int(
      "upstream.max_body_bytes", \.upstream.maxBodyBytes,
      "Largest upstream response accepted (decoded off the loop, relayed in slices)."),
    .list(
      "upstream.allowed_hosts", \.upstream.allowedHosts,
      "Hosts (host or host:port) a recipe's URL taken from an answer may name, beside those the recipe writes."),
    .string(
      "generic.url_template", \.generic.urlTemplate, "Poll URL with {cursor} (last id seen) and {next} (last id + 1)."),
    .string(
      "generic.events_pointer", \.generic.eventsPointer,
      "RFC 6901 pointer to the events array; empty with a non-array body: the body is one event."),
    .string(
      "generic.id_pointer", \.generic.idPointer,
      "RFC 6901 pointer to an event's id (an unsigned integer) inside the event."),
    .list("generic.headers", \.generic.headers, "Static request headers, \"Name: value\" (values never logged)."),
    .string("generic.stream", \.generic.stream, "Stream name the generic adapter's events carry."),
    .string(
      "generic.initial_cursor", \.generic.initialCursor,
      "Cursor of the first poll (events after it are relayed); empty starts from 0."),
    .double("generic.timeout_seconds", \.generic.timeoutSeconds, "Client-side deadline of one generic poll."),
  ]
}
