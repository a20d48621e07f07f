-- record.lua: what the attempts of one settled batch to one endpoint tell its circuit
-- breaker, atomically and by Redis's own clock (semantics in stages/gate/doc.go).
--
-- KEYS[1] breaker state (see decide.lua; open_since and failed_probes are written here only)
-- KEYS[2] half-open probe owner
-- A key holding something no script wrote is read as absent and deleted (see state.lua, which
-- is prepended to this script).
-- ARGV[1] threshold (> 0)   ARGV[2] reset (ms)   ARGV[3] state TTL (ms)
-- ARGV[4] the results, one character per row: 's' success, 'f' retryable failure,
--         'n' neutral (a permanent answer), 'r' not attempted
-- ARGV[4+i] row i's probe token, '' when it holds none
-- Returns the transitions made, as 'from>to' joined by ','.
-- Redis < 5 replicates scripts verbatim and refuses writes after TIME unless told to
-- replicate effects; from Redis 5 this is the default and the call is a no-op.
if redis.replicate_commands then
  redis.replicate_commands()
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local threshold = tonumber(ARGV[1])
local reset = tonumber(ARGV[2]) * 1000
local state_ttl_ms = tonumber(ARGV[3])
local results = ARGV[4]

local state, failures, open_until, open_since, failed_probes = read_breaker(KEYS[1], true)
-- The probe's owner token, or false. Only its type is checked here: a string no decide.lua
-- wrote matches no token, and decide.lua deletes it before it could hold back a probe.
local probe = redis.pcall('GET', KEYS[2])
if type(probe) ~= 'string' then
  if probe then
    redis.call('DEL', KEYS[2]) -- a key of another type
  end
  probe = false
end
local trans = {}
local changed = false

local function move(to)
  if state ~= to then
    trans[#trans + 1] = state .. '>' .. to
    state = to
  end
end

for i = 1, #results do
  local r = results:sub(i, i)
  local tok = ARGV[4 + i]
  local owner = tok ~= '' and probe and tok == probe
  if owner then
    -- Given back whatever the result; only its owner may delete it.
    redis.call('DEL', KEYS[2])
    probe = false
  end
  if owner and state ~= 'closed' then
    if r == 's' then
      move('closed')
      failures = 0
      changed = true
      -- The spell is over (the key is deleted below): the next opening starts a new one.
      open_since, failed_probes = false, 0
    elseif r == 'f' then
      -- Open again for another reset time, but in the same spell: open_since stays (false,
      -- unknown, for a spell that began before it was recorded), so that status shows how
      -- long the endpoint has been down rather than how long since its last probe.
      move('open')
      open_until = now + reset
      failures = 0
      failed_probes = failed_probes + 1
      changed = true
    end
  elseif state == 'closed' then
    if r == 's' then
      if failures > 0 then
        failures = 0
        changed = true
      end
    elseif r == 'f' then
      failures = failures + 1
      changed = true
      if failures >= threshold then
        move('open')
        open_until = now + reset
        failures = 0
        open_since, failed_probes = now, 0 -- a new spell
      end
    end
  end
  -- Otherwise a straggler (admitted before the circuit opened, or while Redis was
  -- unreachable) reports while open or half-open: it changes nothing; only the probe decides.
end

if changed then
  if state == 'closed' and failures == 0 then
    redis.call('DEL', KEYS[1])
  else
    local fields = {'state', state, 'failures', failures, 'open_until', string.format('%.0f', open_until)}
    if state == 'closed' then
      -- Closed with failures: no spell. Drops what read_breaker ignored on a closed key.
      redis.call('HDEL', KEYS[1], 'open_since', 'failed_probes')
    else
      fields[#fields + 1] = 'failed_probes'
      fields[#fields + 1] = failed_probes
      if open_since then
        fields[#fields + 1] = 'open_since'
        fields[#fields + 1] = string.format('%.0f', open_since)
      else
        redis.call('HDEL', KEYS[1], 'open_since') -- unknown, or a value no script wrote
      end
    end
    redis.call('HSET', KEYS[1], unpack(fields))
    local ttl = state_ttl_ms
    if state == 'open' then
      ttl = ttl + math.ceil((open_until - now) / 1000)
    end
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
return table.concat(trans, ',')
