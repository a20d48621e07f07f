-- state.lua: how the scripts read an endpoint's breaker and probe keys. redisstore.go prepends
-- it to decide.lua, record.lua and inspect.lua, so these are local functions of each script.
--
-- A key may hold something no script wrote: a key of another type (WRONGTYPE would fail every
-- call on it), fields the scripts never write, a key without the expiry the scripts always
-- set. None of these ever makes a script fail, and none outlives the next decide or record on
-- its endpoint: the scripts read it as absent (a closed circuit with no failures, no probe in
-- flight) and, when they may write, delete it, so the next write starts from clean state. Keys
-- the scripts wrote are read exactly as they always were.

-- natural returns v (a field's string) as a non-negative integer exact in a Lua number, or nil
-- (absent, not a number, negative, fractional, infinite, NaN, too large).
local function natural(v)
  local n = tonumber(v)
  if n and n >= 0 and n <= 9007199254740992 and n == math.floor(n) then
    return n
  end
  return nil
end

-- read_breaker returns key's breaker state, consecutive failures and open_until (µs). The
-- scripts write all three fields, always with an expiry; a key that is not such a hash (another
-- type, a state other than closed/open/half_open, a field missing or not a natural number, no
-- expiry) is read as closed with no failures, and deleted when repair is true.
local function read_breaker(key, repair)
  local h = redis.pcall('HMGET', key, 'state', 'failures', 'open_until')
  if not h.err then
    if not (h[1] or h[2] or h[3]) then
      return 'closed', 0, 0 -- no state: closed with no failures
    end
    local state, failures, open_until = h[1], natural(h[2]), natural(h[3])
    if (state == 'closed' or state == 'open' or state == 'half_open') and failures and open_until
        and redis.call('PTTL', key) >= 0 then
      return state, failures, open_until
    end
  end
  if repair then
    redis.call('DEL', key)
  end
  return 'closed', 0, 0
end

-- read_probe returns how long (ms) the half-open probe in key is held for, or -2 when no probe
-- is held. A probe is a string expiring within the probe timeout; a key of another type, one
-- without expiry, or one expiring later than longest_ms (no probe is given that long) holds no
-- probe, and is deleted when repair is true.
local function read_probe(key, longest_ms, repair)
  local ttl = redis.call('PTTL', key) -- -2: absent, -1: no expiry
  if ttl == -2 then
    return -2
  end
  if ttl >= 0 and ttl <= longest_ms and type(redis.pcall('GET', key)) == 'string' then
    return ttl
  end
  if repair then
    redis.call('DEL', key)
  end
  return -2
end

