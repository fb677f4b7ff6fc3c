import Foundation

/// Raises the soft limit on open files to the hard limit (each SSE client is a descriptor) and returns it.
@discardableResult
public func raiseDescriptorLimit() -> Int {
  var limit = rlimit()
  guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return -1 }
  if limit.rlim_cur < limit.rlim_max {
    limit.rlim_cur = limit.rlim_max
    setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
  }
  return Int(clamping: limit.rlim_cur)
}

/// The current soft limit on open files (-1 when it cannot be read).
public func descriptorSoftLimit() -> Int {
  var limit = rlimit()
  guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return -1 }
  return Int(clamping: limit.rlim_cur)
}
