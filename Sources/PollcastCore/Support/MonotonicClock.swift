import Foundation

/// Monotonic time in seconds.
public enum MonotonicClock {
  public static func seconds() -> Double {
    var spec = timespec()
    clock_gettime(CLOCK_MONOTONIC, &spec)
    return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
  }
}

public enum PollcastVersion {
  public static let current = "0.1.0"
}
