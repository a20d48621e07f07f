-- inspect.lua: one endpoint's breaker state by Redis's clock, changing nothing.
-- KEYS[1] breaker state, KEYS[2] half-open probe; ARGV[1] the longest a probe is held (ms).
-- Returns {state, consecutive failures, µs left open, 1 when a probe is held, open_since (µs,
-- 0 while closed or unknown), failed probes since, now (µs)}: now, so that the caller ages
-- open_since by Redis's clock, not its own.
-- A key holding something no script wrote reads as decide.lua reads it (state.lua, prepended
-- to this script): absent. It is left as it is; the next decide or record deletes it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state, failures, open_until, open_since, failed_probes = read_breaker(KEYS[1], false)
local open_for = 0
if state == 'open' and open_until > now then
  open_for = open_until - now
end
local held = 0
if read_probe(KEYS[2], tonumber(ARGV[1]), false) ~= -2 then
  held = 1
end
return {state, failures, open_for, held, open_since or 0, failed_probes, now}
