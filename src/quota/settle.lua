-- A counter moved by d, its expiry set to exp; false when it is not a number.
local function apply(k, d, exp)
  local v = tonumber(redis.call('GET', k) or '0')
  if not v then return false end
  local x = v + d
  if x < 0 then x = 0 end
  if x ~= v then redis.call('SET', k, string.format('%d', x), 'KEEPTTL') end
  redis.call('EXPIREAT', k, exp)
  return true
end
-- The provider's input and output tokens of an applied settlement, added to the account's month hash
-- (`in`, `out`, and `in:<model>`, `out:<model>` when a model is tracked: the model key is the month
-- counter's key then `:m:<model>`); a hash that is not one, or a field that is not a number, is left
-- alone (the settlement itself is never undone by it).
local function hadd(k, f, d)
  if d == 0 then return end
  local v = tonumber(redis.call('HGET', k, f) or '0')
  if not v then return end
  redis.call('HSET', k, f, string.format('%d', v + d))
end
local function addio(kio, ku, km, hasm, ti, to, exp)
  if ti == 0 and to == 0 then return end
  local t = redis.call('TYPE', kio)
  if type(t) == 'table' then t = t.ok end
  if t ~= 'hash' and t ~= 'none' then return end
  hadd(kio, 'in', ti)
  hadd(kio, 'out', to)
  if hasm and string.sub(km, 1, #ku + 3) == ku .. ':m:' then
    local m = string.sub(km, #ku + 4)
    hadd(kio, 'in:' .. m, ti)
    hadd(kio, 'out:' .. m, to)
  end
  redis.call('EXPIREAT', kio, exp)
end
sweep(now, open, leases, due, done, gone, tomb, tomb * 24)
local out = {}
for i = 0, n - 1 do
  local mode, rid, a, exp, hasm = ARGV[3 + 7 * i], ARGV[4 + 7 * i], tonumber(ARGV[5 + 7 * i]), ARGV[6 + 7 * i], ARGV[7 + 7 * i] == '1'
  local ti, to = tonumber(ARGV[8 + 7 * i]), tonumber(ARGV[9 + 7 * i])
  local ku, km, kio = KEYS[6 + 3 * i], KEYS[7 + 3 * i], KEYS[8 + 3 * i]
  local r = 0
  local rec = redis.call('HGET', open, rid)
  local tb = redis.call('HGET', done, rid)
  if not a or a < 0 or (mode ~= 's' and mode ~= 'c') or not ti or ti < 0 or not to or to < 0 then
    r = -1
  elseif rec then
    -- Reserved: charge the actual cost instead of the reservation.
    local amt = tonumber(string.match(rec, '^(%d+) '))
    if not amt then
      r = -1
    elseif apply(ku, a - amt, exp) and (not hasm or apply(km, a - amt, exp)) then
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
    if mn and apply(ku, a - mn, exp) and (not hasm or apply(km, a - mn, exp)) then r = 1 else r = -1 end
    redis.call('HSET', done, rid, 'C')
  elseif tb then
    r = 0
  elseif mode == 'c' then
    -- A charge without a reservation (admitted while the shim was down, or a reservation whose
    -- outcome is unknown): apply it, and leave a tombstone so a resend or a late reservation does
    -- nothing.
    if apply(ku, a, exp) and (not hasm or apply(km, a, exp)) then r = 1 else r = -1 end
    redis.call('HSET', done, rid, 'C')
    redis.call('ZADD', gone, now + tomb, rid)
  end
  -- Applied (once: a resend finds no reservation and a 'C' tombstone): its input and output tokens.
  if r == 1 then addio(kio, ku, km, hasm, ti, to, exp) end
  out[#out + 1] = r
end
for _, k in ipairs({open, due, done, gone}) do keep(k, tomb * 24 + 86400) end
return out
