-- Shared by the quota scripts (prepended to each): counters, expiries, and resolving what passed its
-- deadline. KEYS and ARGV are the calling script's.
local function adjust(k, d)
  if d == 0 then return end
  local v = tonumber(redis.call('GET', k) or '0')
  if not v then return end
  local x = v + d
  if x < 0 then x = 0 end
  if x ~= v then redis.call('SET', k, string.format('%d', x), 'KEEPTTL') end
end
local function keep(k, s)
  if redis.call('TTL', k) < s then redis.call('EXPIRE', k, s) end
end
-- Past their deadline: a reservation is charged its minimum (the prompt), the rest given back, and a
-- tombstone "S <min> <keys>" lets a settlement that still arrives apply the difference once; a lease
-- gives back what it still holds (what its Envoy used and never reported is forgiven: at most one
-- lease) and leaves "R <reported total> <version>", so a late report of that Envoy adds only what was not
-- counted, and its next lease goes on from that version.
local function sweep(now, open, leases, due, done, gone, tomb, ltomb)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 16)) do
    if string.sub(m, 1, 2) == 'L|' then
      local rec = redis.call('HGET', leases, m)
      if rec then
        local o, r, v, lu, lm = string.match(rec, '^(%d+) (%d+) (%d+) (%S+) (%S+)$')
        o = tonumber(o)
        if o then
          adjust(lu, -o)
          if lm ~= '-' then adjust(lm, -o) end
          redis.call('HSET', done, m, 'R ' .. r .. ' ' .. v)
          redis.call('ZADD', gone, now + ltomb, m)
        end
        redis.call('HDEL', leases, m)
      end
    else
      local rec = redis.call('HGET', open, m)
      if rec then
        local amt, mn, ru, rm = string.match(rec, '^(%d+) (%d+) (%S+) (%S+)$')
        amt, mn = tonumber(amt), tonumber(mn)
        if amt and mn then
          adjust(ru, mn - amt)
          if rm ~= '-' then adjust(rm, mn - amt) end
          redis.call('HSET', done, m, 'S ' .. mn .. ' ' .. ru .. ' ' .. rm)
          redis.call('ZADD', gone, now + tomb, m)
        end
        redis.call('HDEL', open, m)
      end
    end
    redis.call('ZREM', due, m)
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', gone, '-inf', now, 'LIMIT', 0, 32)) do
    redis.call('HDEL', done, m)
    redis.call('ZREM', gone, m)
  end
end
local function num(k, dflt)
  local v = redis.call('GET', k)
  if not v then return dflt end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then return nil end
  return n
end
