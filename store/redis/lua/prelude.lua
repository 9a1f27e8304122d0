-- Prepended to every single-step script. TIME_US is Redis' own clock (us):
-- every reply ends with it, so callers learn how Redis' clock relates to
-- theirs. ARGV[6], when above 0, is the Redis time after which the caller
-- has given up on this call (its timeout, on Redis' clock as the caller
-- estimates it): a call that Redis reaches later (queued behind a stall, a
-- CLIENT PAUSE or a DEBUG SLEEP) changes nothing and answers status -2.
local TIME_US
do
  local t = redis.call('TIME')
  TIME_US = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
do
  local expiry = tonumber(ARGV[6]) or 0
  if expiry > 0 and TIME_US > expiry then return {-2, 0, 0, 0, 0, TIME_US} end
end
