-- tokengate settle batch v2
local n = (#ARGV - 1) / 5
if ARGV[#ARGV] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
if n < 1 or n ~= math.floor(n) or #KEYS ~= 4 * n then return redis.error_reply('ERR tokengate: bad argument') end
local out = {}
for i = 0, n - 1 do
  local ku, km, ks, ki = KEYS[4 * i + 1], KEYS[4 * i + 2], KEYS[4 * i + 3], KEYS[4 * i + 4]
  local d, exp, ttl, hasm, rel = tonumber(ARGV[5 * i + 1]), ARGV[5 * i + 2], tonumber(ARGV[5 * i + 3]), ARGV[5 * i + 4] == '1', ARGV[5 * i + 5]
  local u, m = tonumber(redis.call('GET', ku) or '0'), 0
  if hasm then m = tonumber(redis.call('GET', km) or '0') end
  if not d or not ttl or ttl < 1 or not u or not m then
    out[#out + 1] = -1
  elseif redis.call('EXISTS', ks) == 1 then
    out[#out + 1] = 0
  else
    local function apply(k, v)
      local x = v + d
      if x < 0 then x = 0 end
      if x ~= v then redis.call('SET', k, string.format('%d', x)) end
      redis.call('EXPIREAT', k, exp)
    end
    if rel ~= '-' and redis.call('TYPE', ki).ok == 'string' then
      local reps, rid = string.match(redis.call('GET', ki), '^2 %w+ (%d+) (%S+) ')
      if rid == rel then
        redis.call('DEL', ki)
        local nr = tonumber(reps) or 0
        if nr > 0 and d < 0 then d = d - d * nr end
      end
    end
    apply(ku, u)
    if hasm then apply(km, m) end
    redis.call('SET', ks, '1', 'EX', ttl)
    out[#out + 1] = 1
  end
end
return out
