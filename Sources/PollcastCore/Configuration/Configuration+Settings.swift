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
      "server.timeout_seconds", \.server.timeoutSeconds,
      "Read/write timeout of client connections; must exceed sse.heartbeat_seconds."),
    .int("server.backlog", \.server.backlog, "listen(2) backlog for bursts of new connections."),
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
    .int(
      "sse.replay_chunk_bytes", \.sse.replayChunkBytes,
      "Replay queued per step for a resuming client before waiting for its socket."),
    .int("ring.max_events", \.ring.maxEvents, "Events kept for resume."),
    .int("ring.max_bytes", \.ring.maxBytes, "Encoded bytes kept for resume."),
    .double(
      "ring.max_age_seconds", \.ring.maxAgeSeconds, "Oldest age of an event kept for resume; 0 disables the age bound."),
    .string("log.level", \.log.level, "trace, debug, info, notice, warning, error or critical."),
    .string("log.format", \.log.format, "logfmt or json."),
    .string("upstream.url", \.upstream.url, "Base URL of the legacy long-poll API."),
    .string("upstream.api_key", \.upstream.apiKey, "API key for the legacy API's session call (never logged)."),
  ]
}
