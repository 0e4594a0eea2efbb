sweep(now, open, leases, due, done, gone, tomb, ltomb)
local lim, used = num(KEYS[3], dl), num(ku, 0)
if not lim or not used then return redis.error_reply('ERR tokengate: not a count at ' .. ku .. ' or ' .. KEYS[3]) end
local mlim, mused = -1, 0
if hasm then
  if dml > 0 then mlim = dml end
  mlim = num(KEYS[4], mlim)
  mused = num(km, 0)
  if not mlim or not mused then return redis.error_reply('ERR tokengate: not a count at ' .. km .. ' or ' .. KEYS[4]) end
end
-- This Envoy's lease: what it holds (o), the total usage it reported (r), a version.
local o, r, ver = 0, 0, 0
local rec = redis.call('HGET', leases, id)
if rec then
  local a, b, c = string.match(rec, '^(%d+) (%d+) (%d+) ')
  o, r, ver = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
else
  -- A lease given back or resolved: its reported total and version go on. The version never goes
  -- back (the Envoy takes a reply with a lower one for a stale one): a lease with no tombstone left
  -- starts from the time in ms, above any version an earlier lease reached at a sync a second.
  ver = now * 1000
  local tb = redis.call('HGET', done, id)
  if tb then
    local a, b = string.match(tb, '^R (%d+) ?(%d*)$')
    if a then r = tonumber(a) or 0 end
    local v = tonumber(b)
    if v and v > ver then ver = v end
  end
end
local function move(d)
  if d == 0 then return end
  used = used + d
  if used < 0 then used = 0 end
  redis.call('SET', ku, string.format('%d', used))
  redis.call('EXPIREAT', ku, ARGV[7])
  if hasm then
    mused = mused + d
    if mused < 0 then mused = 0 end
    redis.call('SET', km, string.format('%d', mused))
    redis.call('EXPIREAT', km, ARGV[7])
  end
end
-- The usage reported since the last call is taken from the lease; beyond it, it is added.
if total > r then
  local c = total - r
  if c <= o then o = o - c else move(c - o); o = 0 end
  r = total
end
if target >= 0 and target < o then
  move(target - o)
  o = target
elseif want > o then
  local avail = lim - used
  if mlim >= 0 and mlim - mused < avail then avail = mlim - mused end
  local g = want - o
  if g > avail then g = avail end
  if g > cap then g = cap end
  -- The lease holds at most share % of what is left, itself included.
  local most = math.floor((avail + o) * share / 100) - o
  if g > most then g = most end
  if g > 0 then
    move(g)
    o = o + g
  end
end
ver = ver + 1
if o > 0 or target ~= 0 then
  redis.call('HSET', leases, id, string.format('%d %d %d %s %s', o, r, ver, ku, hasm and km or '-'))
  redis.call('ZADD', due, now + ttl, id)
  redis.call('HDEL', done, id)
else
  redis.call('HDEL', leases, id)
  redis.call('ZREM', due, id)
  redis.call('HSET', done, id, string.format('R %d %d', r, ver))
  redis.call('ZADD', gone, now + ltomb, id)
end
for _, k in ipairs({leases, due, done, gone}) do keep(k, ttl + ltomb + 86400) end
-- The provider's input and output tokens of the lease's requests: the call reports this Envoy's totals
-- of the month (tin, tout); the lease's field of the month's io hash holds the totals taken so far
-- ("<in> <out>", kept when the lease goes, until the hash expires with the counters), and only what
-- exceeds them is added to `in`, `out` (and `in:<model>`, `out:<model>`, the model as in the per-model
-- counter's key), as a settlement adds them: a resent call adds nothing. A hash that is not one, or a
-- field that is not two counts, is left alone (the call itself goes on).
local fi, fo = 0, 0
local t = redis.call('TYPE', kio)
if type(t) == 'table' then t = t.ok end
if t == 'hash' or t == 'none' then
  local ok = true
  local f = redis.call('HGET', kio, id)
  if f then
    local a, b = string.match(f, '^(%d+) (%d+)$')
    fi, fo = tonumber(a), tonumber(b)
    ok = fi ~= nil and fo ~= nil
    if not ok then fi, fo = 0, 0 end
  end
  if ok and (tin > fi or tout > fo) then
    local di, dout = 0, 0
    if tin > fi then di = tin - fi; fi = tin end
    if tout > fo then dout = tout - fo; fo = tout end
    local function hadd(k, d)
      if d == 0 then return end
      local v = tonumber(redis.call('HGET', kio, k) or '0')
      if v then redis.call('HSET', kio, k, string.format('%d', v + d)) end
    end
    hadd('in', di)
    hadd('out', dout)
    if hasm and string.sub(km, 1, #ku + 3) == ku .. ':m:' then
      local m = string.sub(km, #ku + 4)
      hadd('in:' .. m, di)
      hadd('out:' .. m, dout)
    end
    redis.call('HSET', kio, id, string.format('%d %d', fi, fo))
    redis.call('EXPIREAT', kio, ARGV[7])
  end
end
return {o, used, lim, mused, mlim, ver, r, fi, fo}
