-- tokengate settle v2
if ARGV[6] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local d, ttl, hasm = tonumber(ARGV[1]), tonumber(ARGV[3]), ARGV[4] == '1'
if not d or not ttl or ttl < 1 then return redis.error_reply('ERR tokengate: bad argument') end
local u, m = tonumber(redis.call('GET', KEYS[1]) or '0'), 0
if hasm then m = tonumber(redis.call('GET', KEYS[2]) or '0') end
if not u or not m then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[2]) end
if redis.call('EXISTS', KEYS[3]) == 1 then return {0, u, m} end
local function apply(k, v)
  local n = v + d
  if n < 0 then n = 0 end
  if n ~= v then redis.call('SET', k, string.format('%d', n)) end
  redis.call('EXPIREAT', k, ARGV[2])
  return n
end
if ARGV[5] ~= '-' and redis.call('TYPE', KEYS[4]).ok == 'string' then
  local reps, rid = string.match(redis.call('GET', KEYS[4]), '^2 %w+ (%d+) (%S+) ')
  if rid == ARGV[5] then
    redis.call('DEL', KEYS[4])
    -- Repeats served free while this request ran are not duplicates of a charge any more: each is
    -- charged what this request had reserved (the refund, -d).
    local n = tonumber(reps) or 0
    if n > 0 and d < 0 then d = d - d * n end
  end
end
u = apply(KEYS[1], u)
if hasm then m = apply(KEYS[2], m) end
redis.call('SET', KEYS[3], '1', 'EX', ARGV[3])
return {1, u, m}
