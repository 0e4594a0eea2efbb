-- tokengate settle v3
if ARGV[2] ~= 'tg3' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local tomb, n = tonumber(ARGV[1]), (#ARGV - 2) / 5
if not tomb or tomb < 1 or n < 1 or n ~= math.floor(n) or #KEYS ~= 4 + 2 * n then
  return redis.error_reply('ERR tokengate: bad argument')
end
local open, due, done, gone = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(redis.call('TIME')[1])
local function adjust(k, d, exp)
  local v = tonumber(redis.call('GET', k) or '0')
  if not v then return false end
  local x = v + d
  if x < 0 then x = 0 end
  if x ~= v then redis.call('SET', k, string.format('%d', x), 'KEEPTTL') end
  if exp then redis.call('EXPIREAT', k, exp) end
  return true
end
local function keep(k, s)
  if redis.call('TTL', k) < s then redis.call('EXPIRE', k, s) end
end
-- Reservations past their deadline (as in reserve v3).
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
local out = {}
for i = 0, n - 1 do
  local mode, rid, a, exp, hasm = ARGV[3 + 5 * i], ARGV[4 + 5 * i], tonumber(ARGV[5 + 5 * i]), ARGV[6 + 5 * i], ARGV[7 + 5 * i] == '1'
  local ku, km = KEYS[5 + 2 * i], KEYS[6 + 2 * i]
  local r = 0
  local rec = redis.call('HGET', open, rid)
  local tb = redis.call('HGET', done, rid)
  if not a or a < 0 or (mode ~= 's' and mode ~= 'c') then
    r = -1
  elseif rec then
    -- Reserved: charge the actual cost instead of the reservation.
    local amt = tonumber(string.match(rec, '^(%d+) '))
    if not amt then
      r = -1
    elseif adjust(ku, a - amt, exp) and (not hasm or adjust(km, a - amt, exp)) then
      r = 1
    else
      r = -1
    end
    redis.call('HDEL', open, rid)
    redis.call('ZREM', due, rid)
    if mode == 'c' then
      -- A charge may be sent again: remember it was applied.
      redis.call('HSET', done, rid, 'C')
      redis.call('ZADD', gone, now + tomb, rid)
    end
  elseif tb and string.sub(tb, 1, 1) == 'S' then
    -- Resolved at its deadline (charged its minimum): apply the difference once.
    local mn = tonumber(string.match(tb, '^S (%d+) '))
    if mn and adjust(ku, a - mn, exp) and (not hasm or adjust(km, a - mn, exp)) then r = 1 else r = -1 end
    redis.call('HSET', done, rid, 'C')
  elseif tb then
    r = 0
  elseif mode == 'c' then
    -- A charge without a reservation (admitted while the shim was down, or a reservation whose
    -- outcome is unknown): apply it, and leave a tombstone so a resend or a late reservation does
    -- nothing.
    if adjust(ku, a, exp) and (not hasm or adjust(km, a, exp)) then r = 1 else r = -1 end
    redis.call('HSET', done, rid, 'C')
    redis.call('ZADD', gone, now + tomb, rid)
  end
  out[#out + 1] = r
end
for _, k in ipairs({open, due, done, gone}) do keep(k, tomb + 86400) end
return out
