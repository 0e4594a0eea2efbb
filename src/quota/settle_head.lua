-- tokengate settle v4
if ARGV[2] ~= 'tg4' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local tomb, n = tonumber(ARGV[1]), (#ARGV - 2) / 7
if not tomb or tomb < 1 or n < 1 or n ~= math.floor(n) or #KEYS ~= 5 + 3 * n then
  return redis.error_reply('ERR tokengate: bad argument')
end
local open, due, done, gone, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = tonumber(redis.call('TIME')[1])
