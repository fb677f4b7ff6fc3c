/// The Lua scripts the store runs (`EVAL`): Redis runs each atomically.
extension RedisEventStore {
  /// KEYS: lease, epoch, meta. ARGV: node/instance, milliseconds, the token this node holds ("" for none), this
  /// node's source ("": unchecked), a new random generation.
  /// Returns {1, token} renewed, {2, token} newly taken, {0, holder} held by another node, {3, source} the feed
  /// belongs to another source, {4, holder} held by another node but without an expiry (one is set now: a lease
  /// written by hand or by a broken tool would otherwise stop all polling for good while every node looks ready).
  /// Taking a lease records the source and, when the feed has none, a generation.
  static let leaseScript = """
    local source = redis.call('HGET', KEYS[3], 'source')
    if ARGV[4] ~= '' and source and source ~= ARGV[4] then return {3, source} end
    local holder = redis.call('GET', KEYS[1])
    if holder and holder == ARGV[3] then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return {1, holder}
    end
    if holder then
      if redis.call('PTTL', KEYS[1]) == -1 then
        redis.call('PEXPIRE', KEYS[1], ARGV[2])
        return {4, holder}
      end
      return {0, holder}
    end
    if ARGV[4] ~= '' and not source then redis.call('HSET', KEYS[3], 'source', ARGV[4]) end
    if not redis.call('HGET', KEYS[3], 'generation') then redis.call('HSET', KEYS[3], 'generation', ARGV[5]) end
    local token = ARGV[1] .. '/' .. redis.call('INCR', KEYS[2])
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
    return {2, token}
    """

  /// KEYS: lease. ARGV: token. Deletes the lease only if this token holds it.
  static let releaseScript = """
    if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
    return 0
    """

  /// KEYS: lease, events, meta. ARGV: token, head, floor, position ("": unchanged), n forgotten streams, this
  /// node's source ("": unchecked), unissued ranges ("": unchanged, "-": none), the forgotten streams, then six per
  /// event: id, stream, upstream id, Unix time, type, bytes.
  /// Every check comes before the first write: the script lands whole or not at all.
  static let commitScript = """
    local function above(a, b)
      if #a ~= #b then return #a > #b end
      return a > b
    end
    if redis.call('GET', KEYS[1]) ~= ARGV[1] then
      return redis.error_reply('FENCED this node no longer holds the lease')
    end
    local source = redis.call('HGET', KEYS[3], 'source')
    if ARGV[6] ~= '' and source and source ~= ARGV[6] then
      return redis.error_reply('FENCED the feed was filled from another source: ' .. source)
    end
    local head = redis.call('HGET', KEYS[3], 'head') or '0'
    local forget = tonumber(ARGV[5])
    local first = 8 + forget
    if #ARGV >= first and not above(ARGV[first], head) then
      return redis.error_reply('STALE id ' .. ARGV[first] .. ' is not above the stored head ' .. head)
    end
    if #ARGV >= first then
      -- An entry above the head that no relay committed (by hand, another tool) would make XADD fail for good:
      -- fenced, so this node steps down and the next leader reads past it and issues ids above it.
      local top = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
      local topID = top and (string.match(top[1], '^(%d+)-') or '0')
      if top and not above(ARGV[first], topID) then
        return redis.error_reply('FENCED an entry no relay committed lies above the stored head: ' .. top[1])
      end
    end
    if ARGV[7] == '-' then redis.call('HDEL', KEYS[3], 'unissued')
    elseif ARGV[7] ~= '' then redis.call('HSET', KEYS[3], 'unissued', ARGV[7]) end
    for i = 8, 7 + forget do
      local entries = redis.call('XRANGE', KEYS[2], '-', '+')
      for _, entry in ipairs(entries) do
        local fields = entry[2]
        for j = 1, #fields, 2 do
          if fields[j] == 's' and fields[j + 1] == ARGV[i] then redis.call('XDEL', KEYS[2], entry[1]) end
        end
      end
    end
    local added = 0
    for i = first, #ARGV, 6 do
      local fields = {'d', ARGV[i + 5], 't', ARGV[i + 3]}
      if ARGV[i + 1] ~= '' then fields[#fields + 1] = 's'; fields[#fields + 1] = ARGV[i + 1] end
      if ARGV[i + 2] ~= '' then fields[#fields + 1] = 'u'; fields[#fields + 1] = ARGV[i + 2] end
      if ARGV[i + 4] ~= '' then fields[#fields + 1] = 'k'; fields[#fields + 1] = ARGV[i + 4] end
      redis.call('XADD', KEYS[2], ARGV[i] .. '-0', unpack(fields))
      added = added + 1
    end
    if above(ARGV[2], head) then redis.call('HSET', KEYS[3], 'head', ARGV[2]) end
    local floor = redis.call('HGET', KEYS[3], 'floor') or '0'
    if above(ARGV[3], floor) then
      redis.call('HSET', KEYS[3], 'floor', ARGV[3])
      redis.call('XTRIM', KEYS[2], 'MINID', ARGV[3] .. '-1')
    end
    if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], 'position', ARGV[4]) end
    return added
    """
}
