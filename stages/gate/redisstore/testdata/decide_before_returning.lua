-- decide.lua: the gate's decision for the rows of one claimed batch that go to one endpoint,
-- atomically and by Redis's own clock. The semantics are documented in stages/gate/doc.go;
-- stages/gate/memstore implements the same in Go, and both pass stages/gate/gatetest.
--
-- KEYS[1] breaker state: hash {state = closed|open|half_open, failures, open_until (µs),
--         and while open or half-open open_since (µs: when the spell opened, kept across
--         failed probes) and failed_probes}; absent = closed with no failures. This script
--         only moves open to half_open, which keeps the other fields (record.lua writes them)
-- KEYS[2] half-open probe: the owner's token, expiring after the probe timeout
-- KEYS[3] rate-limit window: sorted set of the attempts admitted (first attempts, retries,
--         probes), scored by time (µs); only its newest `limit` entries are kept
-- KEYS[4] the retries among them: a sorted set with the same scores and bounds, for the share
--         of the limit reserved for retries
-- KEYS[5] the latest slot handed to a deferred retry: a time (µs, a string), expiring a window
--         and a second after it
-- A key holding something no script wrote is read as absent and deleted (see state.lua, which
-- is prepended to this script); the two windows drop entries no script wrote (scored later
-- than a window from now) and, when not sorted sets, are deleted and start empty; a slot that
-- is not a natural number, has no expiry or lies beyond its key's expiry is no slot, and is
-- deleted.
-- ARGV[1] threshold (0 = no breaker)       ARGV[2] rate limit per window (0 = no limiter)
-- ARGV[3] window (µs)                      ARGV[4] probe timeout (ms)
-- ARGV[5] state TTL (ms)                   ARGV[6] retries' reserve per window (>= 1 when
--                                          there is a limit: gate.Params.RetryReserve)
-- ARGV[7] this check's token (probe owner; makes window entries unique)
-- ARGV[8] the rows, one character each: '1' a retry (may be refused), '0' a first attempt
-- ARGV[9] the breaker's reset (ms): an open circuit is believed open for at most this long from
--         now; a later open_until (which record.lua never writes: it opens for one reset) was
--         written by something else, and is cut back to it, so that whoever may write to
--         Redis can hold an endpoint's rows back for one reset at a time, never for longer
-- Returns {transition, verdict1, delay1, verdict2, delay2, ...}: transition is '' or
-- 'open>half_open'; verdict 0 allow, 1 probe, 2 defer (open), 3 defer (probe held, until it
-- expires), 4 defer (rate limit, until the slot handed to the row); delay in µs.
-- Redis < 5 replicates scripts verbatim and refuses writes after TIME unless told to
-- replicate effects; from Redis 5 this is the default and the call is a no-op.
if redis.replicate_commands then
  redis.replicate_commands()
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local threshold = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local probe_ms = tonumber(ARGV[4])
local state_ttl_ms = tonumber(ARGV[5])
local reserve = math.max(tonumber(ARGV[6]), 1) -- gate.Params.RetryReserve is at least 1 with a limit
local token = ARGV[7]
local rows = ARGV[8]
local reset_us = tonumber(ARGV[9]) * 1000
local n = #rows
local out = {''}

local function us(x)
  return string.format('%.0f', x)
end

-- counted returns how many entries the window `key` holds once those that left it are
-- dropped. Entries are scored at the time they were admitted; one later than a window from
-- now (the future, +inf) no script wrote, and would hold a place, and refuse retries, until
-- that time: it is dropped too. A key that is not a sorted set is deleted.
local function counted(key)
  if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', us(now - window))) == 'table' then
    redis.call('DEL', key) -- an error: not a sorted set, so no script wrote it
    return 0
  end
  redis.call('ZREMRANGEBYSCORE', key, '(' .. us(now + window), '+inf')
  return redis.call('ZCARD', key)
end

-- frees returns how long until the window `key`, holding `count` entries and `pending` more
-- admitted in this call (at now), holds fewer than `keep`: when the (count+pending-keep)-th
-- oldest leaves; when that is one admitted in this call, a whole window from now.
local function frees(key, count, pending, keep)
  local idx = count + pending - keep
  if idx < count then
    local e = redis.call('ZRANGE', key, idx, idx, 'WITHSCORES')
    return tonumber(e[2]) + window - now
  end
  return window
end

-- last_slot returns the latest slot handed to a deferred retry, or 0. The script always sets
-- it with an expiry a window and a second after the slot; anything else is deleted.
local function last_slot(key)
  local v = redis.pcall('GET', key)
  if not v then
    return 0 -- absent
  end
  if type(v) == 'string' then
    local slot = natural(v)
    local ttl = redis.call('PTTL', key)
    if slot and ttl >= 0 and slot <= now + ttl * 1000 then
      return slot
    end
  end
  redis.call('DEL', key)
  return 0
end

-- The rate limiter: admit(i) counts row i's attempt and returns -1, or refuses a retry (the
-- window holds `limit` attempts and `reserve` retries) and returns the delay until the slot
-- it hands it: the next one after the endpoint's last slot, one spacing later, and no earlier
-- than the window frees a place (when the attempt, or the retry, whose departure takes the
-- window below the limit, or the retries below the reserve, leaves). The spacing is the
-- window over the retries admitted in it (at least the reserve): the rate at which the
-- limiter admits retries now, so that a retry that comes back at its slot is admitted.
-- Attempts admitted here are all at `now`, so they are added together at the end, and each
-- window keeps only its newest `limit` entries: whether it is full, and when the entry that
-- must leave leaves, depend on nothing else. This bounds the keys' size and makes a batch cost
-- one ZADD per window, whatever the traffic.
local pruned, count, count_r, pending, pending_r = false, 0, 0, 0, 0
local refused, from, spacing, slot = false, 0, 0, 0
local function admit(i)
  if limit <= 0 then
    return -1
  end
  if not pruned then
    count = counted(KEYS[3])
    count_r = counted(KEYS[4])
    pruned = true
  end
  local retry = rows:byte(i) == 49
  if retry and count + pending >= limit and count_r + pending_r >= reserve then
    if not refused then
      -- Once a retry is refused, every later one in this call is: the window only fills.
      from = now + math.min(frees(KEYS[3], count, pending, limit), frees(KEYS[4], count_r, pending_r, reserve))
      spacing = window / math.min(limit, math.max(reserve, count_r + pending_r))
      slot = last_slot(KEYS[5])
      refused = true
    end
    slot = math.ceil(math.max(slot + spacing, from))
    return slot - now
  end
  pending = pending + 1
  if retry then
    pending_r = pending_r + 1
  end
  return -1
end

-- add puts n entries at now into the window `key` (which held count; at most `limit` of them
-- matter) and trims it to its newest `limit` entries.
local function add(key, count, n)
  local ts = us(now)
  local k = math.min(n, limit)
  local args = {}
  for j = 1, k do
    args[#args + 1] = ts
    args[#args + 1] = ts .. ':' .. token .. ':' .. j
    if #args >= 1000 or j == k then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if count + k > limit then
    redis.call('ZREMRANGEBYRANK', key, 0, -(limit + 1))
  end
  redis.call('PEXPIRE', key, math.ceil(window / 1000) + 1000)
end

-- flush adds the attempts and retries admitted in this call and keeps the last slot handed out.
local function flush()
  if pending > 0 then
    add(KEYS[3], count, pending)
  end
  if pending_r > 0 then
    add(KEYS[4], count_r, pending_r)
  end
  if refused then
    redis.call('SET', KEYS[5], us(slot), 'PX', math.ceil((slot - now + window) / 1000) + 1000)
  end
end

local state, open_until = 'closed', 0
if threshold > 0 then
  local _
  state, _, open_until = read_breaker(KEYS[1], true)
  if state == 'open' and open_until > now + reset_us then
    open_until = now + reset_us
    redis.call('HSET', KEYS[1], 'open_until', us(open_until))
  end
end

if state == 'open' and now < open_until then
  for _ = 1, n do
    out[#out + 1] = 2
    out[#out + 1] = open_until - now
  end
elseif state == 'open' or state == 'half_open' then
  local held = read_probe(KEYS[2], math.max(probe_ms, state_ttl_ms), true) -- ms; -2 = no probe in flight
  for i = 1, n do
    if held ~= -2 then
      -- Until the probe expires: its success closes the circuit sooner, and the gate that
      -- records it tells its caller (gate.Hooks.OnClosed), which brings these rows forward.
      local wait = held * 1000
      if wait < 1000 then
        wait = 1000
      end
      out[#out + 1] = 3
      out[#out + 1] = wait
    else
      local d = admit(i)
      if d >= 0 then
        -- The rate limiter refuses the would-be probe: it is never taken, so nothing is
        -- left to wedge the breaker, and a later row may probe.
        out[#out + 1] = 4
        out[#out + 1] = d
      else
        redis.call('SET', KEYS[2], token, 'PX', probe_ms)
        held = probe_ms
        if state == 'open' then
          state = 'half_open'
          redis.call('HSET', KEYS[1], 'state', 'half_open')
          redis.call('PEXPIRE', KEYS[1], state_ttl_ms)
          out[1] = 'open>half_open'
        end
        out[#out + 1] = 1
        out[#out + 1] = 0
      end
    end
  end
else
  for i = 1, n do
    local d = admit(i)
    if d >= 0 then
      out[#out + 1] = 4
      out[#out + 1] = d
    else
      out[#out + 1] = 0
      out[#out + 1] = 0
    end
  end
end

flush()
return out
