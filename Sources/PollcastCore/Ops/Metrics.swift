/// Prometheus text exposition of the relay's counters.
public enum Metrics {
  public static func render(
    _ stats: FeedStatistics, upstream: UpstreamStatistics? = nil,
    loopLag: (last: Double, max: Double, lateness: Histogram)? = nil,
    protection: SSEServer.ProtectionCounters? = nil, accounts: AccountHub.Statistics? = nil,
    store: StoreStatistics? = nil, jobPasses: (longest: Double, slow: Int, cut: Int)? = nil
  ) -> String {
    var stats = stats
    if let accounts { stats.absorb(accounts.feeds) }
    var out = ""
    func metric(_ name: String, _ type: String, _ help: String, _ samples: [(labels: String, value: String)]) {
      out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
      for sample in samples { out += "\(name)\(sample.labels) \(sample.value)\n" }
    }
    func one(_ name: String, _ type: String, _ help: String, _ value: some BinaryInteger) {
      metric(name, type, help, [("", String(value))])
    }
    func histogram(_ name: String, _ help: String, _ histogram: Histogram) {
      out += "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
      for (index, bound) in histogram.bounds.enumerated() {
        out += "\(name)_bucket{le=\"\(bound)\"} \(histogram.counts[index])\n"
      }
      out += "\(name)_bucket{le=\"+Inf\"} \(histogram.count)\n"
      out += "\(name)_sum \(histogram.sum)\n"
      out += "\(name)_count \(histogram.count)\n"
    }
    one("pollcast_subscribers_connected", "gauge", "SSE subscribers connected now.", stats.subscribersConnected)
    one("pollcast_subscribers_total", "counter", "SSE subscribers accepted since start.", stats.subscribersTotal)
    metric(
      "pollcast_events_relayed_total", "counter", "Events relayed, per upstream stream.",
      stats.eventsPublishedByStream.keys.sorted().map {
        ("{stream=\(JSONText.quoted($0))}", String(stats.eventsPublishedByStream[$0]!))
      })
    one("pollcast_events_published_total", "counter", "Events given an id and relayed.", stats.eventsPublished)
    one("pollcast_resumes_total", "counter", "Subscribers that resumed from the replay ring.", stats.resumes)
    one("pollcast_replayed_events_total", "counter", "Events sent from the replay ring.", stats.replayedEvents)
    metric(
      "pollcast_resets_total", "counter", "Resets sent instead of a replay, by reason.",
      ResetReason.allCases.map { ("{reason=\"\($0.rawValue)\"}", String(stats.resetsByReason[$0.rawValue] ?? 0)) })
    one(
      "pollcast_slow_consumer_disconnects_total", "counter", "Subscribers dropped for falling too far behind.",
      stats.slowConsumerDisconnects)
    one("pollcast_sent_bytes_total", "counter", "SSE bytes queued to subscribers' connections.", stats.bytesQueued)
    one("pollcast_ring_events", "gauge", "Events held in the replay ring.", stats.ringEvents)
    one("pollcast_ring_bytes", "gauge", "Encoded bytes held in the replay ring.", stats.ringBytes)
    one("pollcast_ring_evicted_total", "counter", "Events evicted from the replay ring.", stats.ringEvicted)
    metric("pollcast_head_id", "gauge", "Id of the newest event.", [("", String(stats.headID))])
    one(
      "pollcast_connections_aged_out_total", "counter", "Streams ended by the maximum connection age.", stats.agedOut)
    one(
      "pollcast_heartbeats_sent_total", "counter",
      "Heartbeat comments written to idle streams (spread over the interval).",
      stats.heartbeatsSent)
    if let protection {
      one(
        "pollcast_accept_pauses_total", "counter", "Times accepting paused because the process ran out of descriptors.",
        protection.accept.pauses)
      one(
        "pollcast_accept_shed_total", "counter",
        "Waiting clients closed through the reserve descriptor while accepting was paused.", protection.accept.shed)
      one(
        "pollcast_header_timeouts_total", "counter",
        "Connections closed for not completing a request within server.header_timeout_seconds.",
        protection.accept.headerTimeouts)
      one(
        "pollcast_descriptor_reserve_refusals_total", "counter",
        "Streams refused (503) because the descriptor limit was near.", protection.reserveRefusals)
      metric(
        "pollcast_admission_refusals_total", "counter",
        "Streams refused by admission control: max_connections (503), per_address, per_subject, auth_throttled (429).",
        Admission.Refusal.allCases.map {
          ("{reason=\"\($0.rawValue)\"}", String(protection.admissionRefusals[$0] ?? 0))
        })
      one(
        "pollcast_max_connections", "gauge", "The overall stream cap in force (server.max_connections or automatic).",
        protection.maxConnections)
      metric(
        "pollcast_auth_failures_total", "counter", "Credentials refused (401), by reason.",
        protection.authFailures.keys.sorted().map { ("{reason=\"\($0)\"}", String(protection.authFailures[$0]!)) })
      one(
        "pollcast_auth_token_verifications_total", "counter", "Token signature checks done (cache misses).",
        protection.tokenVerifications)
      one(
        "pollcast_auth_token_cache_hits_total", "counter", "Token checks answered from the verification cache.",
        protection.tokenCacheHits)
    }
    one(
      "pollcast_token_expiries_total", "counter", "Streams ended with token-expired because their token expired.",
      stats.grantsEnded)
    if let loopLag {
      metric(
        "pollcast_event_loop_lag_seconds", "gauge", "How late the event loop ran its last probe timer.",
        [("", String(loopLag.last))])
      metric(
        "pollcast_event_loop_lag_max_seconds", "gauge", "The largest event loop lag seen.", [("", String(loopLag.max))])
      histogram(
        "pollcast_event_loop_lateness_seconds",
        "How late each probe timer ran (server.loop_probe_ms apart): a loop stall longer than that interval is always"
          + " counted.", loopLag.lateness)
    }
    if let jobPasses {
      metric(
        "pollcast_event_loop_job_pass_max_seconds", "gauge",
        "The longest loop pass running Swift jobs (resumed tasks); a lag well above it was spent in C callbacks.",
        [("", String(jobPasses.longest))])
      metric(
        "pollcast_event_loop_slow_job_passes_total", "counter", "Loop passes running Swift jobs that took over 10 ms.",
        [("", String(jobPasses.slow))])
      metric(
        "pollcast_event_loop_cut_job_passes_total", "counter",
        "Loop passes running Swift jobs cut after 5 ms, their other jobs left to the next turn.",
        [("", String(jobPasses.cut))])
    }
    if let protection {
      metric(
        "pollcast_auth_mode", "gauge", "Who may read what (auth.mode): 1 for the mode in force.",
        AuthMode.allCases.map { ("{mode=\"\($0.rawValue)\"}", $0.rawValue == protection.authMode ? "1" : "0") })
    }
    if let accounts {
      one(
        "pollcast_accounts_active", "gauge", "Accounts whose upstream loop runs (auth.mode upstream).",
        accounts.activeAccounts)
      one(
        "pollcast_accounts_retained", "gauge", "Accounts kept with their ring for resumes, active or idle.",
        accounts.retainedAccounts)
      one("pollcast_account_starts_total", "counter", "Account upstream loops started.", accounts.accountStarts)
      one(
        "pollcast_account_stops_total", "counter", "Account upstream loops stopped (idle, evicted, revoked).",
        accounts.accountStops)
      metric(
        "pollcast_account_evictions_total", "counter", "Idle accounts dropped with their ring, by bound.",
        ["max_retained_accounts", "max_total_ring_bytes"].map {
          ("{reason=\"\($0)\"}", String(accounts.evictions[$0] ?? 0))
        })
      one(
        "pollcast_account_ring_trims_total", "counter",
        "Passes that dropped the oldest events of accounts in use to keep all rings within their bound.",
        accounts.ringTrims)
      one(
        "pollcast_account_restarts_before_attach_total", "counter",
        "Account loops restarted because a grace period ended between a key check and the stream's attach.",
        accounts.restartsBeforeAttach)
      one(
        "pollcast_account_revocations_total", "counter", "Accounts whose key the upstream refused while polling.",
        accounts.revocations)
      metric(
        "pollcast_credential_checks_total", "counter", "Subscriber keys checked, by outcome.",
        ["accepted", "accepted_cached", "refused", "refused_cached", "unavailable", "full", "busy"].map {
          ("{outcome=\"\($0)\"}", String(accounts.credentialChecks[$0] ?? 0))
        })
      one(
        "pollcast_credential_checks_pending", "gauge", "Key checks waiting for the upstream now.",
        accounts.pendingChecks)
      one(
        "pollcast_account_ring_bytes", "gauge", "Ring bytes over all accounts (checked every 2 s).",
        accounts.ringBytes)
      one(
        "pollcast_account_polls_in_flight", "gauge", "Upstream polls in flight over all accounts.",
        accounts.pollsInFlight)
      one(
        "pollcast_account_max_polls_in_flight", "gauge", "Most polls one account had in flight at once (1).",
        accounts.maxPollsInFlightPerAccount)
      metric(
        "pollcast_account_upstream_requests_total", "counter",
        "The accounts' upstream requests, by HTTP client: a kept-alive connection, or libcurl.",
        [
          ("{client=\"kept_alive\"}", String(accounts.requestsKeptAlive)),
          ("{client=\"libcurl\"}", String(accounts.requestsThroughLibcurl)),
        ])
      if let held = accounts.leasesHeld {
        one(
          "pollcast_account_leases_held", "gauge",
          "Accounts this node polls because it holds their lease (a store shared across nodes).", held)
      }
    }
    if let store {
      metric(
        "pollcast_store_kind", "gauge", "1 for the store the ring, ids and cursors live in (store.kind).",
        [("{kind=\(JSONText.quoted(store.kind))}", "1")])
      one("pollcast_store_commits_total", "counter", "Batches committed (events with their cursors).", store.commits)
      one(
        "pollcast_store_commit_failures_total", "counter",
        "Commits the store refused: nothing of them was shown; the upstream loop retries after a backoff.",
        store.commitFailures)
      one("pollcast_store_events_written_total", "counter", "Events written to the store.", store.eventsWritten)
      one(
        "pollcast_store_bytes_written_total", "counter", "Encoded event bytes written to the store.", store.bytesWritten
      )
      one(
        "pollcast_store_events_trimmed_total", "counter",
        "Stored events deleted because the ring evicted them (count, bytes, age, detached stream).", store.eventsTrimmed
      )
      one("pollcast_store_file_bytes", "gauge", "Size of the store's database file.", store.fileBytes)
      one("pollcast_store_wal_bytes", "gauge", "Size of the store's write-ahead log.", store.walBytes)
      histogram(
        "pollcast_store_commit_seconds", "From handing a batch to the store's writer until it is durable.",
        store.commitSeconds)
      if let connected = store.connected {
        one("pollcast_redis_connected", "gauge", "1 while the Redis command connection is up.", connected ? 1 : 0)
      }
      if let foreignEntries = store.foreignEntries {
        one(
          "pollcast_redis_foreign_entries_total", "counter",
          "Stream entries no relay wrote (by hand, another tool, cut short): skipped while reading, never relayed.",
          foreignEntries)
      }
      if let role = store.role {
        metric(
          "pollcast_redis_role", "gauge", "1 for this node's role for the shared feed (leader polls, follower reads).",
          [("{role=\(JSONText.quoted(role))}", "1")])
      }
      if let replication = store.replication {
        one(
          "pollcast_redis_lease_acquisitions_total", "counter", "Times this node took the feed's lease and polled.",
          replication.leaseAcquisitions)
        one(
          "pollcast_redis_lease_losses_total", "counter",
          "Times this node stopped leading (lease lost or not renewed).",
          replication.leaseLosses)
        one(
          "pollcast_redis_followed_events_total", "counter", "Events read from the shared stream and fanned out here.",
          replication.followedEvents)
        one(
          "pollcast_redis_gaps_total", "counter",
          "Times the stream was trimmed past this node's head before it could read (its streams were ended).",
          replication.gaps)
        one(
          "pollcast_redis_store_losses_total", "counter",
          "Times Redis no longer held the feed's data this node knew (restarted empty): streams ended, resumes reset.",
          replication.storeLosses)
        one(
          "pollcast_redis_lease_repairs_total", "counter",
          "Leases found without an expiry (written by hand or another tool) and given one.", replication.leaseRepairs)
      }
    }
    guard let upstream else { return out }
    metric(
      "pollcast_upstream_polls_total", "counter", "Upstream polls by outcome.",
      upstream.pollsByOutcome.keys.sorted().map { ("{outcome=\"\($0)\"}", String(upstream.pollsByOutcome[$0]!)) })
    one(
      "pollcast_upstream_polls_in_flight", "gauge", "Upstream polls in flight (never above 1).", upstream.pollsInFlight)
    one(
      "pollcast_upstream_polls_in_flight_max", "gauge", "Most upstream polls ever in flight at once.",
      upstream.maxPollsInFlight)
    one(
      "pollcast_upstream_spaced_polls_total", "counter",
      "Pauses before a poll because the upstream answered at once with nothing new (it does not hold polls).",
      upstream.spacedPolls)
    metric(
      "pollcast_upstream_poll_spacing_seconds", "gauge",
      "The current pause before the next poll for that reason (0: none).",
      [("", String(upstream.pollSpacing))])
    one(
      "pollcast_upstream_requests_in_flight", "gauge", "Upstream HTTP requests in flight.", upstream.transportInFlight)
    metric(
      "pollcast_upstream_requests_total", "counter",
      "Upstream requests, by HTTP client: the kept-alive connection, or libcurl (see the README).",
      [
        ("{client=\"kept_alive\"}", String(upstream.requestsKeptAlive)),
        ("{client=\"libcurl\"}", String(upstream.requestsThroughLibcurl)),
      ])
    one(
      "pollcast_upstream_sessions_started_total", "counter",
      "Upstream sessions established: the session steps and the cursor sync answered.", upstream.sessionsStarted)
    one(
      "pollcast_upstream_session_established", "gauge", "1 while an upstream session exists.",
      upstream.hasSession ? 1 : 0)
    one("pollcast_upstream_messages_relayed_total", "counter", "Upstream messages relayed.", upstream.messagesRelayed)
    one(
      "pollcast_upstream_backlog_messages_total", "counter", "Messages relayed with backlog: true.",
      upstream.backlogMessages)
    one(
      "pollcast_upstream_duplicates_dropped_total", "counter", "Messages at or below the cursor, dropped.",
      upstream.duplicatesDropped)
    one(
      "pollcast_upstream_unknown_streams_total", "counter", "Answer keys that are not a known stream.",
      upstream.unknownStreams)
    one(
      "pollcast_upstream_rejected_messages_total", "counter", "Messages without a usable id, logged and skipped.",
      upstream.rejectedMessages)
    one(
      "pollcast_upstream_repaired_messages_total", "counter",
      "Messages whose invalid UTF-8 was replaced by U+FFFD, relayed and logged.", upstream.repairedMessages)
    one(
      "pollcast_upstream_store_failures_total", "counter",
      "Batches or positions the store refused (relayed once it accepts them).", upstream.storeFailures)
    one(
      "pollcast_upstream_cursor_rewinds_total", "counter",
      "Times the upstream's ids went backwards (or its latest fell below the cursor) and the relay followed it.",
      upstream.cursorRewinds)
    one(
      "pollcast_upstream_backoff_attempt", "gauge", "Consecutive upstream failures (0 when healthy).",
      upstream.backoffAttempt)
    metric(
      "pollcast_upstream_backoff_next_delay_seconds", "gauge", "The delay drawn before the next retry.",
      [("", String(upstream.nextRetryDelay))])
    metric(
      "pollcast_upstream_cursor", "gauge", "The relay's cursor per upstream stream.",
      upstream.cursors.keys.sorted().map { ("{stream=\(JSONText.quoted($0))}", String(upstream.cursors[$0]!)) })
    if !upstream.apiCursors.isEmpty {
      // An opaque cursor is text, not a number: an info metric carries it as a label (`pollcast_upstream_cursor`
      // is then the relay's own count of what it relayed).
      metric(
        "pollcast_upstream_api_cursor_info", "gauge",
        "The legacy API's own (opaque) cursor per stream, as the relay will send it next (secrets redacted).",
        upstream.apiCursors.keys.sorted().map {
          ("{stream=\(JSONText.quoted($0)),cursor=\(JSONText.quoted(upstream.apiCursors[$0]!))}", "1")
        })
    }
    metric(
      "pollcast_upstream_state", "gauge", "1 for the worker's current state.",
      UpstreamWorker.State.allCases.map { ("{state=\"\($0.rawValue)\"}", upstream.state == $0.rawValue ? "1" : "0") })
    histogram(
      "pollcast_upstream_poll_duration_seconds", "Duration of completed upstream polls.", upstream.pollDurations)
    return out
  }
}
