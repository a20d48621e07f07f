-- inspect.lua: one endpoint's breaker state by Redis's clock, changing nothing.
-- KEYS[1] breaker state, KEYS[2] half-open probe.
-- Returns {state, consecutive failures, µs left open, 1 when a probe is held}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local h = redis.call('HMGET', KEYS[1], 'state', 'failures', 'open_until')
local state = h[1] or 'closed'
local open_for = 0
if state == 'open' then
  local u = tonumber(h[3]) or 0
  if u > now then
    open_for = u - now
  end
end
return {state, tonumber(h[2]) or 0, open_for, redis.call('EXISTS', KEYS[2])}
