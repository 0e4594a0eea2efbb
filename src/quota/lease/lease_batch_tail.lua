end
local codes = {
  ['ERR tokengate: bad argument'] = 1,
  ['ERR tokengate: protocol mismatch'] = 2,
}
local out = {}
for i = 0, bn - 1 do
  local k, a = {}, {}
  for j = 1, bk do k[j] = KEYS[bk * i + j] end
  for j = 1, ba do a[j] = ARGV[5 + ba * i + j] end
  local ok, r = pcall(lease, k, a)
  local code = 0
  if not ok then
    code = 5
  elseif type(r) ~= 'table' then
    code = 4
  elseif r.err then
    code = codes[r.err] or 4
    if code == 4 and string.sub(r.err, 1, 27) == 'ERR tokengate: not a count ' then code = 3 end
  elseif #r ~= br then
    code = 4
  end
  out[#out + 1] = code
  for j = 1, br do
    if code == 0 then out[#out + 1] = r[j] else out[#out + 1] = 0 end
  end
end
return out
