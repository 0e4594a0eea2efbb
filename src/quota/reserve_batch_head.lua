-- tokengate reserve batch v3
-- Many reservations in one call: each all or nothing, exactly as the reservation script (its text is
-- wrapped below as a function of its own KEYS and ARGV). KEYS: the reservation script's 9 per entry;
-- ARGV: 'tg3b', n, then the reservation script's 13 per entry. Reply: 9 integers per entry, the
-- reservation script's reply; an entry the script refused (or that failed in Redis) is -1, a code,
-- then 0s: 1 already reserved or reconciled, 2 not a count, 3 bad argument, 4 protocol mismatch,
-- 5 another error of the script, 6 Redis failed while it ran (it may have written).
if ARGV[1] ~= 'tg3b' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local n = tonumber(ARGV[2])
if not n or n < 1 or n ~= math.floor(n) or #KEYS ~= 9 * n or #ARGV ~= 2 + 13 * n then
  return redis.error_reply('ERR tokengate: bad argument')
end
local function reserve(KEYS, ARGV)
