-- tokengate global bucket v2
if ARGV[8] ~= 'tg2' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local cost, rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rpm, maxw, credit, now = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local n, bt, br, cr = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
if not (cost and rate and burst and rpm and maxw and credit and now and n and bt and br and cr)
  or rate <= 0 or burst <= 0 or n < 0 or bt < 0 or br < 0 then
  return redis.error_reply('ERR tokengate: bad argument')
end
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local v = redis.call('HMGET', KEYS[1], 't', 'r', 'u')
local t, r, u = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
if not (t and r and u) then t, r, u = burst, rpm, now end
local dt = math.max(0, now - u) / 1e6
t = math.min(burst, t + dt * rate)
if rpm > 0 then r = math.min(rpm, r + dt * rpm / 60) else r = 0 end
-- A stamp ahead of this clock (garbage, or a failover to a server whose clock is behind) refills
-- nothing and is pulled back to now, so the bucket is never stuck waiting for the clock.
u = now
local function store()
  redis.call('HSET', KEYS[1], 't', string.format('%.17g', t), 'r', string.format('%.17g', r), 'u', string.format('%d', u))
  local ttl = math.ceil((burst - t) / rate * 1000) + 60000
  if rpm > 0 then ttl = math.max(ttl, math.ceil((rpm - r) * 60000 / rpm) + 60000) end
  redis.call('PEXPIRE', KEYS[1], ttl)
end
local function out(verdict, us, gt, gr)
  return {verdict, math.floor(t * 1000), math.floor(r * 1000), us, gt, gr}
end
if credit ~= 0 or cr ~= 0 then
  t = math.max(-burst, math.min(burst, t + credit))
  if rpm > 0 then r = math.max(0, math.min(rpm, r + cr)) end
  store()
  return out(0, 0, 0, 0)
end
-- Refusals store too: the refill is kept and the key always has its expiry.
if cost > burst then store() return out(4, 0, 0, 0) end
local tw = math.max(0, (cost - t) / rate)
local rw = 0
if rpm > 0 and n > 0 then rw = math.max(0, (n - r) * 60 / rpm) end
local w = math.max(tw, rw)
if w > 0 and w > maxw / 1000 then
  store()
  if rw > tw then return out(3, math.ceil(rw * 1e6), 0, 0) end
  return out(2, math.ceil(tw * 1e6), 0, 0)
end
t = t - cost
if rpm > 0 then r = r - n end
-- A lease block: whole tokens (and requests) the bucket still holds after the charge, at most what was
-- asked; none while the bucket is in debt (shaped). Tokens without the requests asked with them (or
-- the reverse) would serve no request: then nothing.
local gt, gr = 0, 0
if w <= 0 then
  if bt > 0 then gt = math.max(0, math.min(bt, math.floor(t))) end
  if rpm > 0 and br > 0 then gr = math.max(0, math.min(br, math.floor(r))) end
  if rpm > 0 and bt > 0 and br > 0 and (gt < 1 or gr < 1) then gt, gr = 0, 0 end
  t = t - gt
  r = r - gr
end
store()
if w > 0 then return out(1, math.ceil(w * 1e6), 0, 0) end
return out(0, 0, gt, gr)
