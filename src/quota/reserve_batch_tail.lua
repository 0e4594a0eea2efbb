end
local codes = {
  ['ERR tokengate: request already reserved or reconciled'] = 1,
  ['ERR tokengate: bad argument'] = 3,
  ['ERR tokengate: protocol mismatch'] = 4,
}
local out = {}
for i = 0, n - 1 do
  local k, a = {}, {}
  for j = 1, 9 do k[j] = KEYS[9 * i + j] end
  for j = 1, 13 do a[j] = ARGV[2 + 13 * i + j] end
  local ok, r = pcall(reserve, k, a)
  local code = 0
  if not ok then
    code = 6
  elseif type(r) == 'table' and r.err then
    code = codes[r.err] or 5
    if code == 5 and string.sub(r.err, 1, 27) == 'ERR tokengate: not a count ' then code = 2 end
  end
  if code == 0 then
    for j = 1, 9 do out[#out + 1] = r[j] end
  else
    out[#out + 1] = -1
    out[#out + 1] = code
    for _ = 3, 9 do out[#out + 1] = 0 end
  end
end
return out
