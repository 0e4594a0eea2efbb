-- tokengate lease batch v1
-- Syncs of many lease accounts in one call: each runs exactly as the lease script (its text is wrapped
-- below as a function of its own KEYS and ARGV) under pcall, so an entry Redis refuses does not stop
-- the others. ARGV: 'tgLb', n, keys per entry, arguments per entry, integers per reply, then each
-- entry's arguments; KEYS: each entry's keys. Reply: per entry a status, then the lease script's reply
-- (0s unless the status is 0): 0 it ran, 1 bad argument, 2 protocol mismatch, 3 not a count, 4 another
-- refusal of the script, 5 Redis failed while it ran (it may have written).
if ARGV[1] ~= 'tgLb' then return redis.error_reply('ERR tokengate: protocol mismatch') end
local bn, bk, ba, br = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if not (bn and bk and ba and br) or bn < 1 or bk < 1 or ba < 1 or br < 1 or bn ~= math.floor(bn)
    or #KEYS ~= bk * bn or #ARGV ~= 5 + ba * bn then
  return redis.error_reply('ERR tokengate: bad argument')
end
local function lease(KEYS, ARGV)
