-- tokengate reserve v2
if ARGV[13] ~= 'tg1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local p, o = tonumber(ARGV[1]), tonumber(ARGV[2])
local dl, dml = tonumber(ARGV[3]), tonumber(ARGV[4])
local win, mino = tonumber(ARGV[6]), tonumber(ARGV[9])
local clamp, hasm = ARGV[8] == '1', ARGV[10] == '1'
local fp, maxrep = ARGV[11], tonumber(ARGV[12])
if not (p and o and dl and dml and win and mino and maxrep) or not string.match(fp, '^%w+$') then
  return redis.error_reply('ERR tokengate: bad argument')
end
if redis.call('GET', KEYS[6]) == 'C' then return redis.error_reply('ERR tokengate: request already reconciled') end
local function num(k, dflt)
  local v = redis.call('GET', k)
  if not v then return dflt end
  local n = tonumber(v)
  if not n or n < 0 or n ~= math.floor(n) then return nil end
  return n
end
local owned = false
if win > 0 then
  local prev = redis.call('GET', KEYS[5])
  if prev then
    owned = true
    local pf, pn, pr, pd = string.match(prev, '^2 (%w+) (%d+) (%S+) ([-,%d]+)$')
    if pf == fp and tonumber(pn) < maxrep then
      local r = {}
      for v in string.gmatch(pd, '%-?%d+') do r[#r + 1] = tonumber(v) end
      if #r == 8 then
        local ttl = redis.call('PTTL', KEYS[5])
        if ttl < 1 then ttl = win * 1000 end
        redis.call('SET', KEYS[5], string.format('2 %s %d %s %s', pf, tonumber(pn) + 1, pr, pd), 'PX', ttl)
        r[6] = 1
        -- The first decision, with today's usage (the headers must not show a stale remaining).
        r[2] = tonumber(redis.call('GET', KEYS[1]) or '0') or r[2]
        if hasm then r[4] = tonumber(redis.call('GET', KEYS[2]) or '0') or r[4] end
        return r
      end
    end
  end
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
local ma = 0
if hasm then
  ma = redis.call('INCRBY', KEYS[2], cost)
  redis.call('EXPIREAT', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[6], cost, 'EX', 172800)
local r = {1, ua, lim, ma, mlim, 0, grant, reason}
if win > 0 and not owned then
  local f = string.format('2 %s 0 %s %d,%d,%d,%d,%d,0,%d,%d', fp, ARGV[7], 1, ua, lim, ma, mlim, grant, reason)
  redis.call('SET', KEYS[5], f, 'EX', ARGV[6])
end
return r
