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

-- read_breaker returns key's breaker state, consecutive failures, open_until (µs), open_since
-- (µs, or false) and failed_probes. The scripts write the first three fields, always with an
-- expiry; a key that is not such a hash (another type, a state other than closed/open/half_open,
-- one of those fields missing or not a natural number, no expiry) is read as closed with no
-- failures, and deleted when repair is true.
--
-- open_since (when the current spell opened) and failed_probes (probes failed since) are
-- written by record.lua only while open or half-open. A key without them is one written
-- before they existed (a spell that began before an upgrade) and stays valid: its spell's
-- start is unknown (false) and its failed probes count from 0. A value no script could have
-- written (not a natural number; an open_since after open_until, which a spell's opening never
-- is; either field on a closed circuit) is read the same way, as absent, without touching the
-- rest of the key: record.lua drops it at its next write.
local function read_breaker(key, repair)
  local h = redis.pcall('HMGET', key, 'state', 'failures', 'open_until', 'open_since', 'failed_probes')
  if not h.err then
    if not (h[1] or h[2] or h[3]) then
      return 'closed', 0, 0, false, 0 -- no state: closed with no failures
    end
    local state, failures, open_until = h[1], natural(h[2]), natural(h[3])
    if (state == 'closed' or state == 'open' or state == 'half_open') and failures and open_until
        and redis.call('PTTL', key) >= 0 then
      local open_since, failed_probes = false, 0
      if state ~= 'closed' then
        open_since = natural(h[4])
        if not open_since or open_since == 0 or open_since > open_until then
          open_since = false
        end
        failed_probes = natural(h[5]) or 0
      end
      return state, failures, open_until, open_since, failed_probes
    end
  end
  if repair then
    redis.call('DEL', key)
  end
  return 'closed', 0, 0, false, 0
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

