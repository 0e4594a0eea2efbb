end
local out, kb, ab = {}, 0, 2
for _, m in ipairs(sizes) do
  local k, a = {}, {ARGV[1], 'tg4'}
  for j = 1, 5 + 3 * m do k[j] = KEYS[kb + j] end
  for j = 1, 7 * m do a[2 + j] = ARGV[ab + j] end
  kb = kb + 5 + 3 * m
  ab = ab + 7 * m
  local ok, r = pcall(settle, k, a)
  if ok and type(r) == 'table' and not r.err and #r == m then
    for j = 1, m do out[#out + 1] = r[j] end
  else
    local code = -3
    if ok then code = -2 end
    for _ = 1, m do out[#out + 1] = code end
  end
end
return out
