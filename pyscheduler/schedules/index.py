"""The Redis hot index of recurring schedules: ``Index`` (one index: the keys under a prefix,
default ``pyscheduler:schedules``, and the Lua scripts that claim, settle, mirror, recover and
resync them) and ``Shards`` (the index split into N shards, ``{<prefix>:k}``, schedule id ->
shard ``id mod N``; one shard with the plain prefix on a single node by default, 16 on a Redis
Cluster). Every script reads the time from Redis (TIME): one clock for every executor. Redis
>= 6.2. The keys, what each holds and why: docs/operations.md, "Recurring schedules" and
"Schedules on a Redis Cluster". Clients come from ``pyscheduler.redisconn``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple
from datetime import datetime, timedelta, timezone

import redis
import redis.cluster

from ..redisconn import CLUSTER_CLIENTS, UNREACHABLE, LazyCluster, connect, is_cluster_url

DEFAULT_PREFIX = "pyscheduler:schedules"
MAX_CLAIM = 2000  # Lua unpack() takes at most ~8000 values: 2 per member

DEFAULT_CLUSTER_SHARDS = 16

_NOW = """
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: index, claims, last, ver, marker; ARGV: limit
# -> {now, next due score or -1, marker value or '', 'id score version id score version ...'}
# (one string: parsing thousands of RESP items in Python cost more than the claim itself)
CLAIM = _NOW + """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], 0, now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, -1, redis.call('GET', KEYS[5]) or ''}
if #due > 0 then
  local neg, clm, lst, ids = {}, {}, {}, {}
  for i = 1, #due, 2 do
    local id, s = due[i], due[i + 1]
    neg[#neg + 1] = '-' .. s; neg[#neg + 1] = id
    clm[#clm + 1] = now; clm[#clm + 1] = id
    lst[#lst + 1] = id; lst[#lst + 1] = s
    ids[#ids + 1] = id
  end
  redis.call('ZADD', KEYS[1], unpack(neg))
  redis.call('ZADD', KEYS[2], unpack(clm))
  redis.call('HSET', KEYS[3], unpack(lst))
  local vers = redis.call('HMGET', KEYS[4], unpack(ids))
  local parts = {}
  for i = 1, #ids do
    parts[#parts + 1] = ids[i]; parts[#parts + 1] = due[2 * i]; parts[#parts + 1] = vers[i] or '-'
  end
  out[4] = table.concat(parts, ' ')
end
if #due < 2 * tonumber(ARGV[1]) then
  local nxt = redis.call('ZRANGEBYSCORE', KEYS[1], 0, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #nxt > 0 then out[2] = nxt[2] end
end
return out
"""

# KEYS: index, claims, last, changed; ARGV[1]: 'id expected next id expected next ...' (one
# string: redis-py packing three arguments per member cost more than the script; next '-' =
# remove).
# Only the claim of this occurrence is settled: a member another executor claimed
# since (after a stuck-claim reset) or a fresher score the relay wrote stays. A member
# in `changed` is not given this next run (it may be the old cadence's): it stays
# claimed (its claim dated now) and comes back as 'id expected ...' for the caller to
# settle again with the due time it re-reads. No id twice in one call (Index.settle
# splits the batch): the reads come first (ZMSCORE, HMGET, SMISMEMBER: Redis >= 6.2),
# then one write per structure. -> the ids to re-read with their expected times
SETTLE = """
local a, ids = {}, {}
for w in string.gmatch(ARGV[1], '%S+') do a[#a + 1] = w end
for i = 1, #a, 3 do ids[#ids + 1] = a[i] end
if #ids == 0 then return '' end
local cur = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local last = redis.call('HMGET', KEYS[3], unpack(ids))
local chg = {}
if redis.call('SCARD', KEYS[4]) > 0 then chg = redis.call('SMISMEMBER', KEYS[4], unpack(ids)) end
local add, rem, unclaim, setlast, reread, held = {}, {}, {}, {}, {}, {}
for k = 1, #ids do
  local id, e, nxt = ids[k], a[3 * k - 1], a[3 * k]
  local exp, c = tonumber(e), cur[k] and tonumber(cur[k])
  local mine = (not c) or c == -exp or c == exp
  if mine and chg[k] == 1 then
    reread[#reread + 1] = id; reread[#reread + 1] = e
    if c == -exp then held[#held + 1] = id end
  else
    if mine then
      if nxt == '-' then
        if c then rem[#rem + 1] = id end
      else
        add[#add + 1] = nxt; add[#add + 1] = id
      end
    end
    if (not c) or c == -exp then unclaim[#unclaim + 1] = id end
  end
  if (not last[k]) or tonumber(last[k]) < exp then setlast[#setlast + 1] = id; setlast[#setlast + 1] = e end
end
if #add > 0 then redis.call('ZADD', KEYS[1], unpack(add)) end
if #rem > 0 then redis.call('ZREM', KEYS[1], unpack(rem)) end
if #unclaim > 0 then redis.call('ZREM', KEYS[2], unpack(unclaim)) end
if #setlast > 0 then redis.call('HSET', KEYS[3], unpack(setlast)) end
if #reread > 0 then
  local forget = {}
  for i = 1, #reread, 2 do forget[#forget + 1] = reread[i] end
  redis.call('SREM', KEYS[4], unpack(forget))
end
if #held > 0 then
  redis.replicate_commands()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local dated = {}
  for _, id in ipairs(held) do dated[#dated + 1] = now; dated[#dated + 1] = id end
  redis.call('ZADD', KEYS[2], unpack(dated))
end
return table.concat(reread, ' ')
"""

# KEYS: index, claims, last, ver, changed; ARGV: (id, score ms or '' = remove, version or
# '') triples. The relay's and the resync's write: never touches a claimed (negative)
# member but marks it `changed` (its settle re-reads the due time), never writes a score
# at or before the last claimed occurrence. -> members written.
MIRROR = """
local n = 0
for i = 1, #ARGV, 3 do
  local id, s, ver = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local cur = redis.call('ZSCORE', KEYS[1], id)
  if cur and tonumber(cur) < 0 then
    redis.call('SADD', KEYS[5], id)  -- claimed: its executor settles it, with the due time read again
  elseif s == '' then
    if cur then redis.call('ZREM', KEYS[1], id); n = n + 1 end
  else
    local l = redis.call('HGET', KEYS[3], id)
    if ((not l) or tonumber(s) > tonumber(l)) and ((not cur) or tonumber(cur) ~= tonumber(s)) then
      redis.call('ZADD', KEYS[1], s, id); n = n + 1
    end
  end
  if ver ~= '' then redis.call('HSET', KEYS[4], id, ver) end
end
return n
"""

# KEYS: index, claims, last, ver, changed; ARGV: older than (ms, Redis clock), then ids.
# Forget the last-claimed occurrence and the version of schedules PostgreSQL no
# longer has active (ended, paused or deleted): only of ids that are not members
# (nor claimed) and whose last claim is older than the cutoff, so a relay write
# read before the schedule ended still meets its `last` guard. -> entries pruned
PRUNE = _NOW + """
local cutoff = now - tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local id = ARGV[i]
  if not redis.call('ZSCORE', KEYS[1], id) and not redis.call('ZSCORE', KEYS[2], id) then
    local l = redis.call('HGET', KEYS[3], id)
    if (not l) or tonumber(l) < cutoff then
      n = n + redis.call('HDEL', KEYS[3], id) + redis.call('HDEL', KEYS[4], id)
      redis.call('SREM', KEYS[5], id)
    end
  end
end
return n
"""

# KEYS: index, claims, next-check; ARGV: check every ms, stuck after ms, limit
# -> ids whose claims were reset (empty when the next check is not due yet)
RECOVER = _NOW + """
local nc = redis.call('GET', KEYS[3])
if nc and tonumber(nc) > now then return {} end
redis.call('SET', KEYS[3], now + tonumber(ARGV[1]))
local stuck = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]), 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(stuck) do
  local s = redis.call('ZSCORE', KEYS[1], id)
  if s and tonumber(s) < 0 then redis.call('ZADD', KEYS[1], -tonumber(s), id) end
  redis.call('ZREM', KEYS[2], id)
end
return stuck
"""

# KEYS: index, claims; ARGV: (id, expected ms) pairs: claims still held are dated now.
REFRESH = _NOW + """
local n = 0
for i = 1, #ARGV, 2 do
  if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[i]) or 0) == -tonumber(ARGV[i + 1]) then
    redis.call('ZADD', KEYS[2], now, ARGV[i]); n = n + 1
  end
end
return n
"""

# KEYS: marker, resync; ARGV: a new sync id -> {'ok', marker} or {'resync', sync id}
BEGIN_RESYNC = """
local m = redis.call('GET', KEYS[1])
if m then return {'ok', m} end
local r = redis.call('GET', KEYS[2])
if not r then redis.call('SET', KEYS[2], ARGV[1]); r = ARGV[1] end
return {'resync', r}
"""

# KEYS: marker, resync; ARGV: sync id -> 1 when this resync completed the index
FINISH_RESYNC = """
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1]); redis.call('DEL', KEYS[2]); return 1
end
return 0
"""

# KEYS: marker, resync; ARGV: new sync id, marker seen ('' = force) -> 1 when started
FORCE_RESYNC = """
local m = redis.call('GET', KEYS[1])
if ARGV[2] ~= '' and m ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1]); redis.call('SET', KEYS[2], ARGV[1]); return 1
"""


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS, _HALF_MS = timedelta(milliseconds=1), timedelta(microseconds=500)


def to_ms(ts: datetime) -> int:
    """Epoch milliseconds of a timestamptz (PostgreSQL stores next runs in whole ms), rounded.
    Timedelta arithmetic: half the cost of ts.timestamp() on the zoneinfo datetimes psycopg
    returns (one call per recorded occurrence)."""
    return (ts - _EPOCH + _HALF_MS) // _MS


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, timezone.utc)


def idempotency_key(schedule_id: int, expected_ms: int) -> str:
    """'<schedule id>:<expected epoch ms>': the same for every try of one occurrence."""
    return f"{schedule_id}:{expected_ms}"


class Claimed(NamedTuple):
    id: int
    expected_ms: int
    version: str


@dataclass
class ClaimResult:
    now_ms: int
    next_due_ms: int | None  # earliest unclaimed score, when the batch was not full
    marker: str | None  # None: the index is incomplete (data loss or resync in progress)
    claimed: list[Claimed]


class Index:
    """The Redis side of schedules: one object per process, thread-safe (redis-py pool)."""

    def __init__(self, client: "redis.Redis | redis.cluster.RedisCluster | LazyCluster",
                 prefix: str = DEFAULT_PREFIX):
        self.r = client
        self.prefix = prefix
        # a cluster client runs batched scripts one call at a time: a cluster pipeline does
        # not reload a script the node lacks (a promoted replica, a node that received the
        # slot in a resharding has an empty script cache); a direct call does (NOSCRIPT)
        self.cluster = isinstance(client, CLUSTER_CLIENTS)
        k = f"{prefix}:"
        self.k_index, self.k_claims, self.k_last, self.k_ver = k + "index", k + "claims", k + "last", k + "ver"
        self.k_next_check, self.k_marker, self.k_resync = k + "next-check", k + "marker", k + "resync"
        self.k_changed = k + "changed"
        self._claim = client.register_script(CLAIM)
        self._settle = client.register_script(SETTLE)
        self._mirror = client.register_script(MIRROR)
        self._recover = client.register_script(RECOVER)
        self._refresh = client.register_script(REFRESH)
        self._begin = client.register_script(BEGIN_RESYNC)
        self._finish = client.register_script(FINISH_RESYNC)
        self._force = client.register_script(FORCE_RESYNC)
        self._prune = client.register_script(PRUNE)

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX, timeout: float = 5.0) -> "Index":
        return cls(connect(url, timeout), prefix)

    def close(self) -> None:
        self.r.close()

    def _batch(self, script, calls: list[tuple[list, list]]) -> list:
        """Run ``script`` once per (keys, args): one pipeline on a single node, one call
        after the other on a cluster (see __init__)."""
        if self.cluster:
            return [script(keys=keys, args=args) for keys, args in calls]
        pipe = self.r.pipeline(transaction=False)
        for keys, args in calls:
            script(keys=keys, args=args, client=pipe)
        return pipe.execute()

    def probe(self) -> None:
        """Raise (UNREACHABLE) unless the node that serves this index answers."""
        if self.cluster:
            self.r.exists(self.k_marker)  # routed to the master of this shard's slot
        else:
            self.r.ping()

    # -- executors ----------------------------------------------------------------

    def claim(self, limit: int) -> ClaimResult:
        """Claim up to ``limit`` due members atomically (negative-score lock + claim time)."""
        out = self._claim(keys=[self.k_index, self.k_claims, self.k_last, self.k_ver, self.k_marker],
                          args=[min(max(1, limit), MAX_CLAIM)])
        nxt = int(float(out[1]))
        parts = out[3].decode().split(" ") if len(out) > 3 else []
        claimed = [Claimed(int(i), int(float(s)), "" if v == "-" else v)
                   for i, s, v in zip(parts[0::3], parts[1::3], parts[2::3])]
        return ClaimResult(int(out[0]), None if nxt < 0 else nxt, out[2].decode() or None, claimed)

    def settle(self, entries: Sequence[tuple[int, int, int | None]]) -> list[tuple[int, int]]:
        """(id, expected ms, next ms or None = ended): release these claims with their next run.
        -> (id, expected ms) of the members the relay or the resync met while claimed (their
        schedule may have changed since the next run was computed): still claimed, to be
        settled again with the due time read again (index_entries)."""
        if not entries:
            return []
        keys = [self.k_index, self.k_claims, self.k_last, self.k_changed]
        calls: list[tuple[list, list]] = []
        parts: list[str] = []
        seen: set[int] = set()
        for ident, expected, nxt in entries:
            if ident in seen or len(seen) >= MAX_CLAIM:  # an id once per call (the script reads first)
                calls.append((keys, [" ".join(parts)]))
                parts, seen = [], set()
            seen.add(ident)
            parts.append(f"{ident} {expected} {'-' if nxt is None else nxt}")
        calls.append((keys, [" ".join(parts)]))
        reread = []
        for out in self._batch(self._settle, calls):
            parts = out.decode().split()
            reread += [(int(i), int(e)) for i, e in zip(parts[0::2], parts[1::2])]
        return reread

    def refresh(self, held: Iterable[tuple[int, int]]) -> int:
        """Date the claims this executor still holds now (long retries are not stuck)."""
        args: list = []
        for ident, expected in held:
            args += [ident, expected]
        if not args:
            return 0
        return int(self._refresh(keys=[self.k_index, self.k_claims], args=args))

    def recover(self, check_every_ms: int, stuck_after_ms: int, limit: int = 10000) -> list[int]:
        """The seed's global next-check: when it expired, reset claims older than stuck_after_ms."""
        out = self._recover(keys=[self.k_index, self.k_claims, self.k_next_check],
                            args=[check_every_ms, stuck_after_ms, limit])
        return [int(x) for x in out]

    # -- relay and resync ---------------------------------------------------------

    def mirror(self, entries: Sequence[tuple[int, int | None, int | None]]) -> int:
        """(id, next run ms or None = not indexed, version ms or None) from PostgreSQL."""
        if not entries:
            return 0
        keys = [self.k_index, self.k_claims, self.k_last, self.k_ver, self.k_changed]
        calls = []
        for chunk in _chunks(entries, 2000):
            args: list = []
            for ident, score, ver in chunk:
                args += [ident, "" if score is None else score, "" if ver is None else ver]
            calls.append((keys, args))
        return sum(int(n) for n in self._batch(self._mirror, calls))

    def hashed_ids(self) -> set[int]:
        """Ids with an entry in the last-claimed or the version hash."""
        ids: set[int] = set()
        for key in (self.k_last, self.k_ver):
            ids.update(int(k) for k, _ in self.r.hscan_iter(key, count=5000))  # (NOVALUES needs Redis 7.4)
        return ids

    def prune(self, ids: Sequence[int], older_than_ms: int) -> int:
        """Drop the last/ver entries (and `changed` marks) of these ids (schedules not active in
        PostgreSQL) that are not indexed and were last claimed more than ``older_than_ms`` ago.
        -> entries removed"""
        if not ids:
            return 0
        keys = [self.k_index, self.k_claims, self.k_last, self.k_ver, self.k_changed]
        calls = [(keys, [older_than_ms, *chunk]) for chunk in _chunks(list(ids), 2000)]
        return sum(int(n) for n in self._batch(self._prune, calls))

    def begin_resync(self, proposal: str | None = None) -> str | None:
        """None when the index is complete; else the sync id of the resync to take part in
        (``proposal`` when none is in progress: one id for the shards an executor finds lost
        together, so one pass over PostgreSQL refills them all)."""
        state, value = self._begin(keys=[self.k_marker, self.k_resync], args=[proposal or uuid.uuid4().hex])
        return None if state == b"ok" else value.decode()

    def finish_resync(self, sync_id: str) -> bool:
        return bool(self._finish(keys=[self.k_marker, self.k_resync], args=[sync_id]))

    def force_resync(self, seen_marker: str | None = None, sync_id: str | None = None) -> str | None:
        """Start a new resync (by hand, or after an outage: only if the marker is still
        ``seen_marker``, so several executors coming back start one resync)."""
        sync_id = sync_id or uuid.uuid4().hex
        ok = self._force(keys=[self.k_marker, self.k_resync], args=[sync_id, seen_marker or ""])
        return sync_id if ok else None

    def resync_id(self) -> str | None:
        """The sync id of the resync in progress, if any."""
        value = self.r.get(self.k_resync)
        return value.decode() if value else None

    def marker(self) -> str | None:
        value = self.r.get(self.k_marker)
        return value.decode() if value else None

    def members(self) -> dict[int, float]:
        """Every member and score (tests, status)."""
        return {int(m): s for m, s in self.r.zscan_iter(self.k_index, count=5000)}

    def stats(self) -> dict[str, int | bool]:
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(self.k_index).zcount(self.k_index, "-inf", "(0").zcard(self.k_claims).exists(self.k_marker)
        size, claimed, claims, marker = pipe.execute()
        return {"indexed": size, "claimed": claimed, "claims": claims, "complete": bool(marker)}


class Shards:
    """The index split into ``count`` shards (module docstring): ``shards[k]`` is shard k's
    ``Index``. One object per process, thread-safe. With count 1 on a single node it is the
    one index of the plain prefix (the keys as before issue 18)."""

    def __init__(self, client: "redis.Redis | redis.cluster.RedisCluster | LazyCluster",
                 prefix: str = DEFAULT_PREFIX, count: int = 1):
        if count < 1:
            raise ValueError(f"shards must be >= 1, got {count}")
        self.r = client
        self.prefix = prefix
        self.count = count
        self.cluster = isinstance(client, CLUSTER_CLIENTS)
        if count == 1 and not self.cluster:
            self.shards = [Index(client, prefix)]
        else:
            self.shards = [Index(client, "{%s:%d}" % (prefix, k)) for k in range(count)]

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX, count: int | None = None,
                 timeout: float = 5.0) -> "Shards":
        """``count`` None or 0: 1 on a single node, DEFAULT_CLUSTER_SHARDS on a cluster."""
        if not count:
            count = DEFAULT_CLUSTER_SHARDS if is_cluster_url(url) else 1
        return cls(connect(url, timeout), prefix, count)

    def close(self) -> None:
        self.r.close()

    def of(self, ident: int) -> int:
        """The shard of a schedule id."""
        return ident % self.count

    def split(self, items: Iterable, key=lambda item: item[0]) -> dict[int, list]:
        """Items grouped by the shard of their schedule id (``key``), shards in order."""
        out: dict[int, list] = {}
        for item in items:
            out.setdefault(key(item) % self.count, []).append(item)
        return dict(sorted(out.items()))

    def each(self, items: Iterable, call, key=lambda item: item[0]) -> tuple[list, dict[int, BaseException]]:
        """``call(index, items of its shard)`` for each shard that has items; an unreachable
        shard does not stop the others. -> (results, {shard: its error})"""
        results, failed = [], {}
        for k, part in self.split(items, key).items():
            try:
                results.append(call(self.shards[k], part))
            except UNREACHABLE as exc:
                failed[k] = exc
        return results, failed

    # the whole index (relay, tests, status): every shard, raising if one is unreachable

    def mirror(self, entries: Sequence[tuple[int, int | None, int | None]]) -> int:
        """Index.mirror on each entry's shard; the reachable shards are written even when one
        is not (then its error is raised after them: the caller retries, the writes are
        idempotent)."""
        results, failed = self.each(entries, lambda ix, part: ix.mirror(part))
        if failed:
            raise next(iter(failed.values()))
        return sum(results)

    def members(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for ix in self.shards:
            out.update(ix.members())
        return out

    def hashed_ids(self) -> set[int]:
        ids: set[int] = set()
        for ix in self.shards:
            ids |= ix.hashed_ids()
        return ids

    def prune(self, ids: Sequence[int], older_than_ms: int) -> int:
        results, failed = self.each(ids, lambda ix, part: ix.prune(part, older_than_ms), key=lambda i: i)
        if failed:
            raise next(iter(failed.values()))
        return sum(results)

    def markers(self) -> list[str | None]:
        return [ix.marker() for ix in self.shards]

    def marker(self) -> str | None:
        """None unless every shard has its marker (the index is complete); else the marker
        (the shards' markers, comma-separated, when they differ)."""
        markers = self.markers()
        if not all(markers):
            return None
        return ",".join(dict.fromkeys(markers))

    def stats(self) -> dict[str, int | bool]:
        total: dict[str, int | bool] = {"indexed": 0, "claimed": 0, "claims": 0, "complete": True}
        for ix in self.shards:
            st = ix.stats()
            for k in ("indexed", "claimed", "claims"):
                total[k] += st[k]
            total["complete"] = total["complete"] and st["complete"]
        return total


def _chunks(seq: Sequence, n: int):
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
