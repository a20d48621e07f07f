-- decide.lua: the gate's decision for the rows of one claimed batch that go to one endpoint,
-- atomically and by Redis's own clock. The semantics are documented in stages/gate/doc.go;
-- stages/gate/memstore implements the same in Go, and both pass stages/gate/gatetest.
--
-- KEYS[1] breaker state: hash {state = closed|open|half_open, failures, open_until (µs)};
--         absent = closed with no failures
-- KEYS[2] half-open probe: the owner's token, expiring after the probe timeout
-- KEYS[3] rate-limit window: sorted set of attempts scored by time (µs)
-- A key holding something no script wrote is read as absent and deleted (see state.lua, which
-- is prepended to this script); the window drops entries no script wrote (scored later than a
-- window from now) and, when it is not a sorted set, is deleted and starts empty.
-- ARGV[1] threshold (0 = no breaker)       ARGV[2] rate limit per window (0 = no limiter)
-- ARGV[3] window (µs)                      ARGV[4] probe timeout (ms)
-- ARGV[5] state TTL (ms)                   ARGV[6] longest wait behind a held probe (ms)
-- ARGV[7] this check's token (probe owner; makes window entries unique)
-- ARGV[8] the rows, one character each: '1' a retry (may be refused), '0' a first attempt
-- Returns {transition, verdict1, delay1, verdict2, delay2, ...}: transition is '' or
-- 'open>half_open'; verdict 0 allow, 1 probe, 2 defer (open), 3 defer (probe held),
-- 4 defer (rate limit); delay in µs.
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
local max_wait = tonumber(ARGV[6]) * 1000
local token = ARGV[7]
local rows = ARGV[8]
local n = #rows
local out = {''}

local function us(x)
  return string.format('%.0f', x)
end

-- The rate limiter: admit(i) counts row i's attempt and returns -1, or refuses a retry over
-- the limit and returns the delay until the window frees a place for it; the k-th refused
-- retry of this check is spaced k*window/limit later, so they do not all return at once.
-- Attempts admitted here are all at `now`, so they are added together at the end, and the
-- window keeps only its newest `limit` entries: whether it is full, and when its oldest
-- entry that must leave leaves, depend on nothing else. This bounds the key's size and makes a
-- batch cost one ZADD, whatever the traffic.
local pruned, count, pending, base, refused = false, 0, 0, 0, 0
local function admit(i)
  if limit <= 0 then
    return -1
  end
  if not pruned then
    if type(redis.pcall('ZREMRANGEBYSCORE', KEYS[3], '-inf', us(now - window))) == 'table' then
      redis.call('DEL', KEYS[3]) -- an error: not a sorted set, so no script wrote it
    else
      -- Entries are scored at the time they were admitted; one later than a window from now
      -- (the future, +inf) would hold a place, and refuse retries, until that time.
      redis.call('ZREMRANGEBYSCORE', KEYS[3], '(' .. us(now + window), '+inf')
    end
    count = redis.call('ZCARD', KEYS[3])
    pruned = true
  end
  if rows:byte(i) == 49 and count + pending >= limit then
    if refused == 0 then
      -- The entry whose departure frees a place: the (count+pending-limit)-th oldest; when it
      -- is one admitted in this call, it leaves a whole window from now.
      local idx = count + pending - limit
      base = window
      if idx < count then
        local oldest = redis.call('ZRANGE', KEYS[3], idx, idx, 'WITHSCORES')
        base = tonumber(oldest[2]) + window - now
      end
    end
    local d = math.ceil(base + refused * window / limit)
    refused = refused + 1
    return d
  end
  pending = pending + 1
  return -1
end

-- flush adds the attempts admitted in this call (at most `limit` of them matter) and trims
-- the window to its newest `limit` entries.
local function flush()
  if pending == 0 then
    return
  end
  local ts = us(now)
  local add = math.min(pending, limit)
  local args = {}
  for j = 1, add do
    args[#args + 1] = ts
    args[#args + 1] = ts .. ':' .. token .. ':' .. j
    if #args >= 1000 or j == add then
      redis.call('ZADD', KEYS[3], unpack(args))
      args = {}
    end
  end
  if count + add > limit then
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(limit + 1))
  end
  redis.call('PEXPIRE', KEYS[3], math.ceil(window / 1000) + 1000)
end

local state, open_until = 'closed', 0
if threshold > 0 then
  local _
  state, _, open_until = read_breaker(KEYS[1], true)
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
      local wait = held * 1000
      if held < 0 or wait > max_wait then
        wait = max_wait
      end
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
