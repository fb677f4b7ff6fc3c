import Foundation

/// The feed's timers (heartbeats, connection ages, grant ends) and the ways its streams end.
extension Feed {
  /// Heartbeat rounds are spread over the interval: each tick (interval / slices) visits the next slice of the
  /// subscribers, so 10,000 idle clients cost 250 writes per tick instead of one 10,000-write stall every
  /// interval that live events would wait behind. A subscriber written to since the previous tick needs no
  /// heartbeat and gets none (a busy stream costs nothing); any stream thus hears something at least every
  /// interval plus one tick.
  static let heartbeatSlices = 40
  /// Readers per slice at least: a feed of a few readers (an account's, in per-user relaying: two) ticks once per
  /// interval and writes all its heartbeats in that one wake-up. Slicing them one reader a tick (as before) woke the
  /// loop once per reader for nothing: at 2,000 accounts × 2 readers, 267 timer wake-ups a second instead of 133.
  static let heartbeatsPerSlice = 8

  var heartbeatSlicesWanted: Int {
    max(1, min(Feed.heartbeatSlices, subscribers.count / Feed.heartbeatsPerSlice))
  }

  /// Re-arms the heartbeat rounds (`armHeartbeat`) when the slice count should change: at once when it should grow
  /// (new readers must not wait a long tick), at the next tick when it should shrink.
  func adjustHeartbeat(growOnly: Bool) {
    guard heartbeatRunning else { return }
    let wanted = heartbeatSlicesWanted
    guard wanted > heartbeatSlicesNow || (!growOnly && wanted != heartbeatSlicesNow) else { return }
    armHeartbeat()
  }

  var heartbeatRunning: Bool { heartbeatTimer != nil || heartbeatWheelToken != nil }

  /// Runs the heartbeat rounds at the slice count wanted now: a feed of one slice in its settings' wheel when they
  /// have one (`HeartbeatWheel`: one wake-up for many small feeds), any other on a timer of its own.
  func armHeartbeat() {
    heartbeatSlicesNow = heartbeatSlicesWanted
    if heartbeatSlicesNow == 1, let wheel = common.wheel {
      heartbeatTimer?.cancel()
      heartbeatTimer = nil
      if heartbeatWheelToken == nil { heartbeatWheelToken = wheel.join(self) }
      return
    }
    heartbeatWheelToken = nil
    let timer =
      heartbeatTimer
      ?? LoopTimer(loop: loop, repeating: true) { [weak self] in
        self?.assumeIsolated { $0.tick() }
      }
    timer.schedule(after: settings.heartbeatInterval / Double(heartbeatSlicesNow), common: true)
    heartbeatTimer = timer
  }

  func stopHeartbeat() {
    heartbeatTimer?.cancel()
    heartbeatTimer = nil
    heartbeatWheelToken = nil
  }

  func tick() {
    let now = MonotonicClock.seconds()
    ring.evictExpired(now: now)
    guard !subscribers.isEmpty else { return }
    // Each tick visits count / slices subscribers, so each one is visited once per interval.
    let slices = heartbeatSlicesNow
    defer { adjustHeartbeat(growOnly: false) }
    heartbeatCredit += Double(subscribers.count) / Double(slices)
    let share = Int(heartbeatCredit)
    heartbeatCredit -= Double(share)
    // Written to within the finest slice: no heartbeat needed. (Not the current slice: with one reader visited
    // once per interval, that would let a stream written just before its visit stay silent for two intervals.)
    let quiet = settings.heartbeatInterval / Double(Feed.heartbeatSlices)
    var visited = 0
    if heartbeatCursor >= subscribers.count { heartbeatCursor = 0 }
    while visited < share && !subscribers.isEmpty {
      if heartbeatCursor >= subscribers.count { heartbeatCursor = 0 }
      let subscriber = subscribers[heartbeatCursor]
      heartbeatCursor += 1
      visited += 1
      guard subscriber.mode == .live, !subscriber.isClosed, now - subscriber.lastWrite >= quiet else { continue }
      count { $0.heartbeatsSent += 1 }
      writeTime = now
      broadcast(heartbeatBytes, to: subscriber)
    }
  }

  /// Ends the streams that reached their maximum age, so their clients reconnect (and resume) elsewhere or
  /// later: a comment says why, then the stream ends cleanly.
  ///
  /// A stream whose grant ended (a token's expiry) ends the same way, with the grant's last id-less event (so the
  /// client's Last-Event-ID stays that of the last event it got): `GrantEnd`.
  func endDueConnections() {
    let now = MonotonicClock.seconds()
    guard now >= nextEnd else { return }
    var due: [Subscriber] = []
    var next = Double.infinity
    for subscriber in subscribers {
      let end = min(subscriber.endsAt ?? .infinity, subscriber.grantEndsAt ?? .infinity)
      if end <= now { due.append(subscriber) } else { next = min(next, end) }
    }
    nextEnd = next
    guard !due.isEmpty else { return }
    let notice = ByteSlice(SSEEncoder.comment("maximum connection age reached: reconnect with Last-Event-ID"))
    for subscriber in due {
      if let endsAt = subscriber.grantEndsAt, endsAt <= now, let last = subscriber.grantEndEvent {
        count { $0.grantsEnded += 1 }
        end(subscriber, with: last)
      } else {
        count { $0.agedOut += 1 }
        end(subscriber, with: notice)
      }
    }
  }

  func end(_ subscriber: Subscriber, with notice: ByteSlice) {
    remove(subscriber)
    subscriber.sink.write([notice])
    subscriber.sink.finish()
  }

  /// Ends every stream with a last id-less event of `type` (per-user relaying: `credential-revoked`). Returns how
  /// many were ended.
  @discardableResult
  public func endAll(type: String, data: String, grant: String? = nil) -> Int {
    let last = ByteSlice(SSEEncoder.event(id: nil, type: type, data: data))
    let ending = subscribers.filter { grant == nil || $0.grant == grant }
    for subscriber in ending where !subscriber.isClosed { end(subscriber, with: last) }
    return ending.count
  }

  /// The grants of the open streams (per-user relaying re-checks their keys).
  public var openGrants: Set<String> { Set(subscribers.compactMap { $0.isClosed ? nil : $0.grant }) }

  /// Sends `comment` to every subscriber and ends every stream cleanly. With a `spread` window the streams are
  /// ended in slices across it (in random order), so thousands of browsers do not reconnect in the same
  /// millisecond. Returns how many were ended.
  @discardableResult
  public func finishAll(comment: String, spread: Double = 0) async -> Int {
    stopHeartbeat()
    ageTimer = nil
    started = false
    let last = ByteSlice(SSEEncoder.comment(comment))
    var pending = subscribers.shuffled(using: &ageRandom)
    let total = pending.count
    let step = 0.05
    let steps = max(1, Int((spread / step).rounded(.down)))
    let perStep = spread > 0 ? max(1, Int((Double(total) / Double(steps)).rounded(.up))) : total
    while !pending.isEmpty {
      for subscriber in pending.prefix(perStep) where !subscriber.isClosed {
        end(subscriber, with: last)
      }
      pending.removeFirst(min(perStep, pending.count))
      if !pending.isEmpty { try? await Task.sleep(for: .milliseconds(Int(step * 1000))) }
    }
    return total
  }
}
