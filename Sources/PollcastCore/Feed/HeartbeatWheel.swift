import Foundation

/// One timer that runs the heartbeat rounds of many small feeds (an account's, in per-user relaying: two readers):
/// each feed sits in one of `slots` buckets, and each turn (interval / slots) runs the rounds of one bucket's feeds,
/// so every feed still gets a round once an interval.
///
/// Each small feed on a timer of its own woke the loop once an interval for its two heartbeats: at 2,000 accounts,
/// 133 wake-ups a second, each an `epoll_wait` return and a turn of the loop for two writes. The wheel wakes it
/// `slots / interval` times a second (8 at the default 15 s) and writes a bucket's heartbeats in one turn. A turn is
/// at most interval / 40 late against a feed's own timer (10 ms for an interval under 0.4 s), so a stream still hears
/// something within the interval plus 1/40 of it.
///
/// Leaving is lazy: a feed that leaves (or rejoins) only drops its token; its stale entry is dropped when its bucket
/// next turns, and the timer stops once the buckets are empty. Entries hold feeds weakly: a dropped account's feed
/// leaves nothing behind but an entry swept within an interval. Loop thread only.
final class HeartbeatWheel: @unchecked Sendable {
  let interval: Double
  let slots: Int
  private let loop: EventLoop
  private var buckets: [[Entry]]
  /// The bucket the next turn runs.
  private var next = 0
  private var lastToken: UInt64 = 0
  private var timer: LoopTimer?

  private struct Entry {
    weak var feed: Feed?
    let token: UInt64
  }

  init(loop: EventLoop, interval: Double) {
    self.loop = loop
    self.interval = interval
    slots = HeartbeatWheel.slots(for: interval)
    buckets = Array(repeating: [], count: slots)
  }

  /// A turn every 0.1 s or so, between 40 turns an interval (the heartbeat guarantee) and 120 (more buys nothing);
  /// but never more often than every 10 ms: a configured interval of a millisecond would otherwise turn the wheel
  /// 40,000 times a second (there a turn is at most 10 ms late, more than 1/40 of such an interval).
  static func slots(for interval: Double) -> Int {
    let wanted = interval / 0.1
    let slots = !(wanted > 40) ? 40 : wanted >= 120 ? 120 : Int(wanted)
    let finest = interval / 0.01
    return finest >= Double(slots) ? slots : max(1, Int(finest))
  }

  /// Adds `feed`'s rounds, the first one interval from now (as its own timer's would be). Returns its token: the
  /// feed is in the wheel while its `heartbeatWheelToken` is this token.
  func join(_ feed: Feed) -> UInt64 {
    loop.assertOnLoop()
    // The turn runs the feed's round as its own executor: they must be one loop.
    precondition(feed.loop === loop, "a feed joins the wheel of its own loop")
    lastToken &+= 1
    buckets[(next + slots - 1) % slots].append(Entry(feed: feed, token: lastToken))
    if timer == nil {
      let timer = LoopTimer(loop: loop, repeating: true) { [weak self] in self?.turn() }
      timer.schedule(after: interval / Double(slots))
      self.timer = timer
    }
    return lastToken
  }

  /// Feeds in the wheel now, stale entries included (tests).
  var entryCount: Int { buckets.reduce(0) { $0 + $1.count } }

  private func turn() {
    let slot = next
    next = (next + 1) % slots
    let due = buckets[slot]
    buckets[slot] = []
    var kept: [Entry] = []
    kept.reserveCapacity(due.count)
    for entry in due {
      guard let feed = entry.feed else { continue }
      let stays = feed.assumeIsolated { feed -> Bool in
        guard feed.heartbeatWheelToken == entry.token else { return false }
        feed.tick()
        // The round may have moved the feed to a timer of its own (it grew past one slice).
        return feed.heartbeatWheelToken == entry.token
      }
      if stays { kept.append(entry) }
    }
    // Feeds that joined during the rounds went into this same bucket (the one turned last).
    buckets[slot].append(contentsOf: kept)
    // The timer runs while any entry is left, stale ones included.
    if buckets.allSatisfy(\.isEmpty) {
      timer?.cancel()
      timer = nil
    }
  }
}
