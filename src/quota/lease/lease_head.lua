-- tokengate lease v2
if ARGV[13] ~= 'tg3' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local id, total, want, target = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local dl, dml, ttl, tomb, cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8]), tonumber(ARGV[10]), tonumber(ARGV[11])
local hasm, ltomb, share = ARGV[9] == '1', tonumber(ARGV[12]), tonumber(ARGV[14])
local tin, tout = tonumber(ARGV[15]), tonumber(ARGV[16])
if not (total and want and target and dl and dml and ttl and ttl >= 1 and tomb and tomb >= 1 and cap and ltomb and ltomb >= 1
    and share and share >= 1 and share <= 100 and tin and tin >= 0 and tout and tout >= 0)
  or string.sub(id, 1, 2) ~= 'L|' then
  return redis.error_reply('ERR tokengate: bad argument')
end
local ku, km, leases, due, done, gone, open, kio = KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local now = tonumber(redis.call('TIME')[1])
