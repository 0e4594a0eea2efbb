-- tokengate reserve v3
if ARGV[12] ~= 'tg3' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local p, o = tonumber(ARGV[1]), tonumber(ARGV[2])
local dl, dml = tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, ttl, mino, tomb = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[9]), tonumber(ARGV[11])
local clamp, hasm = ARGV[8] == '1', ARGV[10] == '1'
if not (p and o and dl and dml and ttl and ttl >= 1 and mino and tomb and tomb >= 1) or rid == '' then
  return redis.error_reply('ERR tokengate: bad argument')
end
local open, due, done, gone = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local now = tonumber(redis.call('TIME')[1])
-- Reservations past their deadline are resolved first: charged their minimum (the prompt), the rest
-- given back; a tombstone lets a settlement that still arrives apply the difference once.
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
for _, id in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', now, 'LIMIT', 0, 16)) do
  local rec = redis.call('HGET', open, id)
  if rec then
    local amt, mn, ku, km = string.match(rec, '^(%d+) (%d+) (%S+) (%S+)$')
    amt, mn = tonumber(amt), tonumber(mn)
    if amt and mn then
      adjust(ku, mn - amt)
      if km ~= '-' then adjust(km, mn - amt) end
      redis.call('HSET', done, id, 'S ' .. mn .. ' ' .. ku .. ' ' .. km)
      redis.call('ZADD', gone, now + tomb, id)
    end
    redis.call('HDEL', open, id)
  end
  redis.call('ZREM', due, id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', gone, '-inf', now, 'LIMIT', 0, 32)) do
  redis.call('HDEL', done, id)
  redis.call('ZREM', gone, id)
end
if redis.call('HEXISTS', done, rid) == 1 or redis.call('HEXISTS', open, rid) == 1 then
  return redis.error_reply('ERR tokengate: request already reserved or reconciled')
end
local function num(k, dflt)
  local v = redis.call('GET', k)
  if not v then return dflt end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then return nil end
  return n
end
local lim = num(KEYS[3], dl)
local used = num(KEYS[1], 0)
if not lim or not used then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[1] .. ' or ' .. KEYS[3]) end
local mlim, mused = -1, 0
if hasm then
  if dml > 0 then mlim = dml end
  mlim = num(KEYS[4], mlim)
  mused = num(KEYS[2], 0)
  if not mlim or not mused then return redis.error_reply('ERR tokengate: not a count at ' .. KEYS[2] .. ' or ' .. KEYS[4]) end
end
local avail, why = lim - used, 1
if mlim >= 0 and mlim - mused < avail then avail, why = mlim - mused, 2 end
local grant, reason = o, 0
if p + o > avail then
  if clamp and avail - p >= mino and avail - p > 0 then
    grant, reason = avail - p, 3
  else
    return {0, used, lim, mused, mlim, 0, 0, why}
  end
end
local cost = string.format('%d', p + grant)
local ua = redis.call('INCRBY', KEYS[1], cost)
redis.call('EXPIREAT', KEYS[1], ARGV[5])
local ma, km = 0, '-'
if hasm then
  ma = redis.call('INCRBY', KEYS[2], cost)
  redis.call('EXPIREAT', KEYS[2], ARGV[5])
  km = KEYS[2]
end
redis.call('HSET', open, rid, cost .. ' ' .. string.format('%d', p) .. ' ' .. KEYS[1] .. ' ' .. km)
redis.call('ZADD', due, now + ttl, rid)
for _, k in ipairs({open, due, done, gone}) do keep(k, ttl + tomb + 86400) end
return {1, ua, lim, ma, mlim, 0, grant, reason}
