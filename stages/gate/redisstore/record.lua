-- record.lua: what the attempts of one settled batch to one endpoint tell its circuit
-- breaker, atomically and by Redis's own clock (semantics in stages/gate/doc.go).
--
-- KEYS[1] breaker state (see decide.lua)   KEYS[2] half-open probe owner
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

local state, failures, open_until = read_breaker(KEYS[1], true)
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
    elseif r == 'f' then
      move('open')
      open_until = now + reset
      failures = 0
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
    redis.call('HSET', KEYS[1], 'state', state, 'failures', failures, 'open_until', string.format('%.0f', open_until))
    local ttl = state_ttl_ms
    if state == 'open' then
      ttl = ttl + math.ceil((open_until - now) / 1000)
    end
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end
return table.concat(trans, ',')
