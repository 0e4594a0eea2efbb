-- tokengate reconcile v2
if ARGV[6] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local a, ttl, hasm = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
if not a or a < 0 or not ttl or ttl < 1 then return redis.error_reply('ERR tokengate: bad argument') end
local u, m = tonumber(redis.call('GET', KEYS[1]) or '0'), 0
if hasm then m = tonumber(redis.call('GET', KEYS[2]) or '0') end
if not u or not m then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[2]) end
if redis.call('EXISTS', KEYS[4]) == 1 then return {0, u, m} end
local rec = redis.call('GET', KEYS[3])
local r = 0
if rec and rec ~= 'C' then r = tonumber(rec) or 0 end
local d = a - r
local function apply(k, v)
  local n = v + d
  if n < 0 then n = 0 end
  if n ~= v then redis.call('SET', k, string.format('%d', n)) end
  redis.call('EXPIREAT', k, ARGV[2])
  return n
end
if ARGV[5] ~= '-' and redis.call('TYPE', KEYS[5]).ok == 'string' then
  local reps, rid = string.match(redis.call('GET', KEYS[5]), '^2 %w+ (%d+) (%S+) ')
  if rid == ARGV[5] then
    redis.call('DEL', KEYS[5])
    -- Free repeats of a request that charged nothing: each is charged this request's reservation.
    local n = tonumber(reps) or 0
    if n > 0 then d = d + n * r end
  end
end
if d ~= 0 then
  u = apply(KEYS[1], u)
  if hasm then m = apply(KEYS[2], m) end
end
redis.call('SET', KEYS[3], 'C', 'EX', ARGV[3])
redis.call('SET', KEYS[4], '1', 'EX', ARGV[3])
return {1, u, m}
