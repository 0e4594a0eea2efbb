-- tokengate fair global bucket v1 (the same decisions as src/limits/fair.rs, on Redis' clock, for every Envoy)
if ARGV[14] ~= 'tgf1' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local cost, rate, burst, rpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local id, weight, level = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local levels, K, window = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local dweight, dlevel, now, credit_arg = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[15])
local nreq = tonumber(ARGV[16])
if not (cost and rate and burst and rpm and weight and level and levels and K and window and dweight and dlevel
  and now and credit_arg and nreq) or rate <= 0 or burst <= 0 or weight <= 0 or dweight <= 0 or levels < 1
  or levels > 8 or K < 2 or window < 1000 or #id == 0 then
  return redis.error_reply('ERR tokengate: bad argument')
end
if now <= 0 then
  local tm = redis.call('TIME')
  now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
local key = KEYS[1]
-- Timing, from the window (src/limits/fair.rs, Tuning::of).
local w = window / 1e6
local tau, steer, reserve_s, bank_s = w / 2, w / 2, w / 10, w / 2
local idle, recompute_us = window, math.floor(window / 100)
local UNB = -1
local MFMT = '<dddddffB'
local function decay(since, dt_tau)
  local dt = math.max(0, now - since) / 1e6
  if dt <= 0 then return 1 end
  return math.exp(-dt / dt_tau)
end
local function f32(x) return (struct.unpack('<f', struct.pack('<f', x))) end

-- The record: bucket and header fields, then members `m:<id>` (packed: last, credited, demand, credit,
-- norm [µs, µs, tokens/s, tokens, 0-1], weight, largest request [f32], level).
local h = redis.call('HMGET', key, 't', 'r', 'u', 'K', 'l', 'c', 'e', 'a', 's', 'p', 'n', 'k')
local t, r, u = tonumber(h[1]), tonumber(h[2]), tonumber(h[3])
if not (t and r and u) then t, r, u = burst, rpm, now end
local reshaped = tonumber(h[4]) ~= K or tonumber(h[5]) ~= levels
local computed, avg, count = tonumber(h[6]) or 0, tonumber(h[8]) or 0, tonumber(h[12]) or 0
local lam, cap = {}, {}
do
  local f = {}
  for l = 0, levels - 1 do f[#f + 1] = 'L' .. l; f[#f + 1] = 'C' .. l end
  local v = redis.call('HMGET', key, unpack(f))
  for l = 0, levels - 1 do
    lam[l] = tonumber(v[2 * l + 1]) or 0
    cap[l] = tonumber(v[2 * l + 2]) or 0
  end
end
-- The water level of the first level that binds (the fair share per unit of weight), × 1000; 0: none.
local function binding()
  for l = 0, levels - 1 do
    if lam[l] ~= UNB then return math.floor(math.max(lam[l], 0) * 1000) end
  end
  return 0
end
local function share(lv, wt, d)
  local l = math.min(lv, levels - 1)
  if lam[l] ~= UNB then return math.max(math.min(lam[l] * wt, cap[l]), 0) end
  return math.max(d + cap[l] * wt, 0)
end
local function unpackm(s)
  local a, b, c, d, e, f, g, i = struct.unpack(MFMT, s)
  return {last = a, credited = b, demand = c, credit = d, norm = e, weight = f, largest = g, level = i}
end
local function packm(m)
  return struct.pack(MFMT, m.last, m.credited, m.demand, m.credit, m.norm, m.weight, m.largest, m.level)
end
local function demand_with(m, k)
  local norm = m.norm * k + (1 - k)
  return m.demand * k / math.max(norm, 0.1)
end
local function accrue(m, rt)
  local dt = math.max(0, now - m.credited) / 1e6
  m.credit = math.min(m.credit + rt * dt, math.max(rt * bank_s, m.credit))
  m.credited = math.max(m.credited, now)
  return m.credit
end

-- The bucket, refilled.
local dtb = math.max(0, now - u) / 1e6
local bt = math.min(burst, t + dtb * rate)
local br = 0
if rpm > 0 then br = math.min(rpm, r + dtb * rpm / 60) end
local bu = math.max(u, now)

local function ttl_ms(tokens)
  return math.ceil((burst - math.min(tokens, burst)) / rate * 1000) + 10 * math.ceil(window / 1000) + 60000
end

if credit_arg ~= 0 then
  -- A credit (or, negative, a debit): bucket and member, never beyond ±burst.
  bt = math.max(-burst, math.min(burst, bt + credit_arg))
  redis.call('HSET', key, 't', string.format('%.17g', bt), 'r', string.format('%.17g', br),
    'u', string.format('%d', bu))
  local ms = redis.call('HGET', key, 'm:' .. id)
  if ms then
    local m = unpackm(ms)
    m.credit = math.max(-burst, math.min(burst, m.credit + credit_arg))
    redis.call('HSET', key, 'm:' .. id, packm(m))
  end
  redis.call('PEXPIRE', key, ttl_ms(bt))
  return {0, math.floor(bt * 1000), math.floor(br * 1000), 0, 0, 0, 0, 0, binding()}
end
if cost > burst then
  return {4, math.floor(bt * 1000), math.floor(br * 1000), 0, 0, 0, 0, 0, binding()}
end
if reshaped then
  -- Another member count or level count (or a new record): the table starts afresh, the bucket stays.
  redis.call('DEL', key)
  for i = 6, 12 do h[i] = nil end
  computed, avg, count = 0, 0, 0
  for l = 0, levels - 1 do lam[l], cap[l] = 0, 0 end
end

-- The average request, and the shares when stale.
if avg > 0 then avg = avg + (cost - avg) / 16 else avg = cost end
local fields = {}
local active = tonumber(h[11]) or 0
if computed == 0 or now - computed >= recompute_us then
  local fade = decay(computed, 20 * tau)
  local all = redis.call('HGETALL', key)
  local list, protected = {}, 0
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 'm:' then
      local m = unpackm(all[i + 1])
      local d = demand_with(m, decay(m.last, tau))
      local lv = math.min(m.level, levels - 1)
      local lg = m.largest * fade
      m.largest = f32(lg)
      if lam[lv] == UNB or d <= lam[lv] * m.weight then protected = protected + lg end
      if now - m.last <= idle then
        accrue(m, share(lv, m.weight, d))
        list[#list + 1] = {lv, d / m.weight, d, m.weight}
      end
      fields[f] = m
    end
  end
  local reserve = math.min(math.max(rate * reserve_s, 4 * avg, protected + 2 * avg), burst * 0.75)
  local reff = math.max(0, math.min(rate + (bt - reserve) / steer, rate + burst / steer))
  table.sort(list, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  local avail, j = reff, 1
  for lv = 0, levels - 1 do
    local first = j
    while j <= #list and list[j][1] == lv do j = j + 1 end
    local wsum = 0
    for x = first, j - 1 do wsum = wsum + list[x][4] end
    local left, l = avail, UNB
    for x = first, j - 1 do
      local e = list[x]
      if wsum > 0 and e[2] * wsum <= left then
        left = left - e[3]
        wsum = wsum - e[4]
      else
        if wsum > 0 then l = left / wsum else l = 0 end
        break
      end
    end
    lam[lv] = l
    if l ~= UNB then
      cap[lv] = avail
      avail = 0
    else
      local ws = 0
      for x = first, j - 1 do ws = ws + list[x][4] end
      local over = math.max(left, 0)
      if ws > 0 then cap[lv] = over / ws else cap[lv] = over end
      avail = over
    end
  end
  computed, active = now, #list
  local hs = {'c', computed, 'e', string.format('%.17g', reff), 's', string.format('%.17g', reserve),
    'p', string.format('%.17g', protected), 'n', active}
  for lv = 0, levels - 1 do
    hs[#hs + 1] = 'L' .. lv; hs[#hs + 1] = string.format('%.17g', lam[lv])
    hs[#hs + 1] = 'C' .. lv; hs[#hs + 1] = string.format('%.17g', cap[lv])
  end
  redis.call('HSET', key, unpack(hs))
end

-- The member: its own entry, a new one (the longest idle one makes room at K), or the overflow one.
local mkey, overflow = 'm:' .. id, 0
local m = fields[mkey]
if not m then
  local ms = redis.call('HGET', key, mkey)
  if ms then m = unpackm(ms) end
end
local wt, lv = weight, level
local k, rt, cr
if not m then
  local room = count < K
  if not room then
    local all = redis.call('HGETALL', key)
    local oldest, oldlast
    for i = 1, #all, 2 do
      local f = all[i]
      if string.sub(f, 1, 2) == 'm:' and f ~= 'm:~overflow' then
        local o = fields[f] or unpackm(all[i + 1])
        if now - o.last > idle and (not oldlast or o.last < oldlast) then oldest, oldlast = f, o.last end
      end
    end
    if oldest then
      redis.call('HDEL', key, oldest)
      fields[oldest] = nil
      count = count - 1
      room = true
    end
  end
  if not room then
    mkey, overflow, wt, lv = 'm:~overflow', 1, dweight, dlevel
    m = fields[mkey]
    if not m then
      local ms = redis.call('HGET', key, mkey)
      if ms then m = unpackm(ms) end
    end
  else
    count = count + 1
  end
end
if m then
  m.weight, m.level = f32(wt), lv
  k = decay(m.last, tau)
  rt = share(lv, wt, demand_with(m, k))
  cr = accrue(m, rt)
else
  rt = share(lv, wt, 0)
  cr = math.min(rt, cost)
  m = {last = now, credited = now, demand = 0, credit = cr, norm = 0, weight = f32(wt), largest = 0, level = lv}
  k = 1
end

-- The decision: the bucket must hold the cost (and a request), the member must have credit.
local verdict, wait_us = 0, 0
local tw = math.max(0, (cost - bt) / rate)
local rw = 0
if rpm > 0 and nreq > 0 then rw = math.max(0, (nreq - br) * 60 / rpm) end
local wmax = math.max(tw, rw)
if wmax > 0 then
  if rw > tw then verdict = 3 else verdict = 2 end
  wait_us = math.ceil(wmax * 1e6)
elseif cr > 0 then
  bt = bt - cost
  if rpm > 0 then br = br - nreq end
  cr = cr - cost
else
  verdict = 5
  if rt > 0 then wait_us = math.ceil(math.max(-cr / rt, 0.001) * 1e6) else wait_us = window end
end

-- The ask counts, admitted or not.
local last = m.last
m.demand = m.demand * k + cost / tau
m.norm = m.norm * k + (1 - k)
m.largest = f32(math.max(m.largest, cost))
m.last = math.max(last, now)
m.credit = cr
fields[mkey] = m
local out = {'a', string.format('%.17g', avg), 'k', count, 'K', K, 'l', levels}
if verdict == 0 then
  out[#out + 1] = 't'; out[#out + 1] = string.format('%.17g', bt)
  out[#out + 1] = 'r'; out[#out + 1] = string.format('%.17g', br)
  out[#out + 1] = 'u'; out[#out + 1] = string.format('%d', bu)
elseif reshaped or not (tonumber(h[1]) and tonumber(h[2]) and tonumber(h[3])) then
  out[#out + 1] = 't'; out[#out + 1] = string.format('%.17g', t)
  out[#out + 1] = 'r'; out[#out + 1] = string.format('%.17g', r)
  out[#out + 1] = 'u'; out[#out + 1] = string.format('%d', u)
end
for f, v in pairs(fields) do
  out[#out + 1] = f; out[#out + 1] = packm(v)
end
redis.call('HSET', key, unpack(out))
redis.call('PEXPIRE', key, ttl_ms(bt))
return {verdict, math.floor(bt * 1000), math.floor(br * 1000), wait_us, math.floor(rt * 1000), math.floor(cr * 1000),
  active, overflow, binding()}
