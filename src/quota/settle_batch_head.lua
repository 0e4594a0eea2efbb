-- tokengate settle batch v4
-- Settlements of many tenants in one call: each tenant's group runs exactly as the settlement script
-- (its text is wrapped below as a function of its own KEYS and ARGV) under pcall, so a group Redis
-- refuses does not stop the others. KEYS: per group, the settlement script's 5 + 3 m keys. ARGV:
-- tombstone_s, 'tg4s:<m1>,<m2>,...' (each group's entry count, in order), then the settlement script's
-- 7 arguments per entry, every group's in order. Reply: one integer per entry, the settlement script's
-- (1 applied, 0 nothing to do, -1 a counter is not a number or the entry is malformed); every entry of
-- a group the script refused is -2, of a group Redis failed while it ran (it may have written part) -3.
local tag = ARGV[2]
if type(tag) ~= 'string' or string.sub(tag, 1, 5) ~= 'tg4s:' then
  return redis.error_reply('ERR tokengate: protocol mismatch')
end
local sizes, total, nkeys = {}, 0, 0
for m in string.gmatch(string.sub(tag, 6), '[^,]+') do
  local v = tonumber(m)
  if not v or v < 1 or v ~= math.floor(v) then return redis.error_reply('ERR tokengate: bad argument') end
  sizes[#sizes + 1] = v
  total = total + v
  nkeys = nkeys + 5 + 3 * v
end
if #sizes < 1 or #KEYS ~= nkeys or #ARGV ~= 2 + 7 * total then
  return redis.error_reply('ERR tokengate: bad argument')
end
local function settle(KEYS, ARGV)
