"""The session store's Lua scripts (server/store.py): each runs inside Redis as one step.

A write checks the session's fencing epoch and writes in the same step, so a stale owner's late write is
rejected atomically; a read that would return more than its bound is refused there, before it crosses the
network. Each script's comment says its KEYS and ARGV, in the order `SessionStore` passes them.
"""

# KEYS[1] = session hash; ARGV[1] = the largest snapshot read. {epoch, snap}, or {epoch, -1} when too large.
LOAD = """
if redis.call('HSTRLEN', KEYS[1], 'snap') > tonumber(ARGV[1]) then
  return {redis.call('HGET', KEYS[1], 'epoch'), -1}
end
return redis.call('HMGET', KEYS[1], 'epoch', 'snap')
"""

# KEYS[1] = log key; ARGV[1], ARGV[2] = first and last index, ARGV[3] = the most bytes returned. The
# records, or -1 as soon as they hold more bytes than that (read one by one: never a whole page first).
LOAD_LOG_PAGE = """
local page, total, most = {}, 0, tonumber(ARGV[3])
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  local v = redis.call('LINDEX', KEYS[1], i)
  if not v then
    break
  end
  total = total + string.len(v)
  if total > most then
    return -1
  end
  page[#page + 1] = v
end
return page
"""

# KEYS[1] = lease key, KEYS[2] = session hash; ARGV[1] = replica id, ARGV[2] = lease ms, ARGV[3] = ttl s.
# Returns the new epoch, or 0 when another replica holds the lease.
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and string.sub(holder, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. ':' then
  return 0
end
local epoch = redis.call('HINCRBY', KEYS[2], 'epoch', 1)
redis.call('HSET', KEYS[2], 'owner', ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. epoch, 'PX', ARGV[2])
return epoch
"""

# KEYS[1] = session hash; ARGV[1] = epoch, ARGV[2] = snapshot JSON, ARGV[3] = ttl s.
# Returns 1 when written, 0 when the epoch is stale (another replica claimed the session since).
SAVE = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'snap', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS[1] = lease key, KEYS[2] = session hash, KEYS[3] = log key; ARGV[1] = '{replica}:{epoch}', ARGV[2] =
# lease ms, ARGV[3] = ttl s, ARGV[4] = epoch, ARGV[5] = replica id. Returns 1 when renewed, 0 when another
# replica took the session (the lease is someone else's, or the epoch moved on), 2 when the store had lost
# both (it restarted empty): the lease and epoch are written again and the caller writes its snapshot and
# token again.
RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
  return 1
end
if holder or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], 'epoch', ARGV[4], 'owner', ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""

# KEYS[1] = lease key, KEYS[2] = session hash, KEYS[3] = log key; ARGV[1] = '{replica}:{epoch}'.
# Deletes all three when ours.
RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""

# KEYS[1] = session hash, KEYS[2] = log key; ARGV[1] = epoch, ARGV[2] = ttl s, ARGV[3] = '1' to start the
# log again, ARGV[4] = the length the writer expects the log to have (its records are MACed with the
# indexes that follow it), ARGV[5..] = records. Returns the log's length, -1 when the epoch is stale, -2
# when the log is not as long as expected (someone else wrote to it).
APPEND_LOG = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  return -1
end
if ARGV[3] == '1' then
  redis.call('DEL', KEYS[2])
elseif redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[4]) then
  return -2
end
local n = 0
for i = 5, #ARGV do
  n = redis.call('RPUSH', KEYS[2], ARGV[i])
end
if n == 0 then
  n = redis.call('LLEN', KEYS[2])
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return n
"""

# KEYS[1] = session hash, KEYS[2] = token key, KEYS[3] = the previous token's key; ARGV[1] = epoch, ARGV[2] =
# the session id (sealed), ARGV[3] = ttl s, ARGV[4] = '1' to delete the previous. 1 bound, 0 stale epoch.
BIND_TOKEN = """
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if ARGV[4] == '1' then
  redis.call('DEL', KEYS[3])
end
return 1
"""

# KEYS[1] = lease key; ARGV[1] = '{replica}:{epoch}'. Deletes the lease (not the snapshot) when ours.
HAND_OFF = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""
