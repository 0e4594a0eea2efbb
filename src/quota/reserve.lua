sweep(now, open, leases, due, done, gone, tomb, tomb * 24)
if redis.call('HEXISTS', done, rid) == 1 or redis.call('HEXISTS', open, rid) == 1 then
  return redis.error_reply('ERR tokengate: request already reserved or reconciled')
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
    -- Refused: also what the leases of the refused account hold (this Envoy's and others', their
    -- unspent part comes back when idle), so that the Envoy can tell a spent month from one that
    -- leases hold. Not counted beyond 512 leases of the tenant (0 is then answered).
    local held = 0
    if redis.call('HLEN', leases) <= 512 then
      local acct = why == 2 and KEYS[2] or KEYS[1]
      for _, rec in ipairs(redis.call('HVALS', leases)) do
        local lo, lu, lm = string.match(rec, '^(%d+) %d+ %d+ (%S+) (%S+)$')
        if lo and (why == 2 and lm or lu) == acct then held = held + tonumber(lo) end
      end
    end
    return {0, used, lim, mused, mlim, held, 0, why}
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
for _, k in ipairs({open, due, done, gone}) do keep(k, ttl + tomb * 24 + 86400) end
return {1, ua, lim, ma, mlim, 0, grant, reason}
