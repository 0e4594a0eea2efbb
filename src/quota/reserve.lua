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
    -- Refused: also how far what is left (the tenant's and the model's, whichever is less) would grow
    -- once other Envoys' leases go back (their unspent part comes back when they are idle), so that
    -- the Envoy can tell a spent month from one that leases hold. This Envoy's own leases (fields
    -- starting with ARGV[13]) are not counted. Not beyond 512 leases of the tenant (0 is then answered).
    -- others: other Envoys hold leases of the tenant (of any model): no exhausted marker then.
    local grow, others, own = 0, 0, ARGV[13] or '-'
    if redis.call('HLEN', leases) <= 512 then
      local lt, lm = 0, 0
      local all = redis.call('HGETALL', leases)
      for i = 1, #all - 1, 2 do
        if string.sub(all[i], 1, #own) ~= own then
          local lo, lu, lmk = string.match(all[i + 1], '^(%d+) %d+ %d+ (%S+) (%S+)$')
          lo = tonumber(lo)
          if lo then
            if lu == KEYS[1] then lt = lt + lo end
            if hasm and lmk == KEYS[2] then lm = lm + lo end
          end
        end
      end
      local after = lim - used + lt
      if mlim >= 0 and mlim - mused + lm < after then after = mlim - mused + lm end
      -- From what is left, not from a deficit (an account over its limit).
      grow = math.min(math.max(math.max(after, 0) - math.max(avail, 0), 0), 1e15)
      if lt > 0 then others = 1 end
    else
      others = 1
    end
    return {0, used, lim, mused, mlim, grow, 0, why, others}
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
return {1, ua, lim, ma, mlim, 0, grant, reason, 0}
