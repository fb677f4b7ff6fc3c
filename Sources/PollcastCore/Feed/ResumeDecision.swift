/// What a new subscriber gets before live events, decided from the id it asked to resume after.
public enum ResumeDecision: Equatable, Sendable {
  /// No id asked: live events only.
  case live
  /// Replay every retained event after this id, then live.
  case replay(after: UInt64)
  /// The id cannot be resumed without a gap: send `event: reset` with the head id, then live.
  case reset(ResetReason, requested: String)

  /// Decides from the raw requested value (header or query parameter), the ring's floor and the head id.
  ///
  /// A valid id is 1 to 20 ASCII digits that fit in u64, nothing else (no sign, no spaces). An empty value
  /// means no id, as browsers send none when the last id is empty.
  ///
  /// `unissued` are id ranges this feed's store never issued (a store restored from a backup, or another
  /// generation's): an id in one was given by another store, so replaying after it would repeat or skip events.
  public static func decide(
    requested: String?, floorID: UInt64, headID: UInt64, unissued: [ClosedRange<UInt64>] = []
  ) -> ResumeDecision {
    guard let requested, !requested.isEmpty else { return .live }
    guard let id = parseEventID(requested) else { return .reset(.invalid, requested: requested) }
    if id > headID { return .reset(.future, requested: requested) }
    if id < floorID { return .reset(.tooOld, requested: requested) }
    if unissued.contains(where: { $0.contains(id) }) { return .reset(.invalid, requested: requested) }
    return .replay(after: id)
  }

  /// Parses a strict decimal u64 (digits only, at most 20 of them, no overflow).
  public static func parseEventID(_ text: String) -> UInt64? {
    let utf8 = text.utf8
    guard !utf8.isEmpty, utf8.count <= 20 else { return nil }
    var value: UInt64 = 0
    for byte in utf8 {
      guard byte >= 0x30 && byte <= 0x39 else { return nil }
      let (times10, overflow1) = value.multipliedReportingOverflow(by: 10)
      let (sum, overflow2) = times10.addingReportingOverflow(UInt64(byte - 0x30))
      if overflow1 || overflow2 { return nil }
      value = sum
    }
    return value
  }
}

/// Why a resume could not be honoured.
public enum ResetReason: String, Sendable, CaseIterable {
  case tooOld = "too_old"
  case future
  case invalid
}
