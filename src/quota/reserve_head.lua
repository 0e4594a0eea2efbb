-- tokengate reserve v3
if ARGV[12] ~= 'tg3' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local p, o = tonumber(ARGV[1]), tonumber(ARGV[2])
local dl, dml = tonumber(ARGV[3]), tonumber(ARGV[4])
local rid, ttl, mino, tomb = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[9]), tonumber(ARGV[11])
local clamp, hasm = ARGV[8] == '1', ARGV[10] == '1'
if not (p and o and dl and dml and ttl and ttl >= 1 and mino and tomb and tomb >= 1) or rid == '' then
  return redis.error_reply('ERR tokengate: bad argument')
end
local open, due, done, gone, leases = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local now = tonumber(redis.call('TIME')[1])
