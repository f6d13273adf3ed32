"""Schedule executors: claim due occurrences from Redis, fire, record, move the score.

One ``Executor`` is a daemon with a main loop and a recorder thread:

* main loop: the seed's global next-check (stuck claims older than ``stuck_after``
  are reset), one resync batch while the index is incomplete (marker key absent:
  Redis lost its data), one atomic Lua claim of up to ``batch`` due members, fire
  them (Kafka, HTTP; task targets go to the recorder), serve delivery reports,
  while a backlog lasts the prefetch thread claims the next batch and loads its
  fire details (``fire_details``, cached by version) as this one is fired,
  schedule retries (base * 2^n + random(0, jitter); a try the egress policy
  refused is not retried: every try would be), sleep until the next due
  score or the next retry;
* recorder: records outcomes in batches (``record_executions``,
  ``fire_task_schedules``), then sets each score to the next run the database
  computed from the expected time (or removes the member when the schedule ended).

A stored value never stops an executor (docs/sql-api.md, convention A): only an
outage is retried. The SQL side ends a poison item itself (record_executions and
fire_task_schedules answer each item, fire_details returns only values the executor
loads); should a call still fail with a data error (``errors.rejects_arguments``: a
value psycopg cannot load, a row PostgreSQL refuses), the batch is split until the
poison occurrence is alone (``isolate``) and that one is ended the same way
(``stop_schedules``: recorded with its outcome and the error, its schedule paused;
logged, counted in ``pyscheduler_schedules_poison``); its neighbours go on. Any
other error crashes the executor (``run_daemons`` restarts it with ``fresh()``).

Redis unreachable -> degraded mode: critical schedules are claimed from
PostgreSQL (``claim_due_critical``) and fired until Redis answers again; then the
index is resynced. One log line per transition, gauge ``pyscheduler_schedules_degraded``.

A sharded index (index.Shards: N shards, e.g. on a Redis Cluster) is served shard by
shard, round-robin from a random start per executor, one claim per shard per round
(a full claim makes the round go on at once; else the executor sleeps until the
earliest due score of the round, at most ``poll_ms``). Every shard has its own marker,
resync, stuck-claim check and outage: a shard whose master is unreachable is "down"
(its critical schedules are claimed from PostgreSQL with ``claim_due_critical_shards``
once per round, the other shards go on from Redis); when it answers again, only it is
resynced. Shards whose data was lost together share one resync (one pass over
PostgreSQL, each row written to its own shard). All shards down is the degraded mode
above.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import heapq
import logging
import math
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import redis
from prometheus_client import Histogram

from .. import egress
from ..sqlapi import HTTP_ALLOW
from ..db import Database, Outage, Wakeup
from ..errors import RETRYABLE, rejects_arguments
from ..masking import mask_url
from ..metrics import counter, gauge, histogram
from ..redisconn import UNREACHABLE
from . import sqlapi as sql
from .arrays import EpochMsArray, Int4Array, Int8Array
from .index import DEFAULT_PREFIX, ClaimResult, Shards, from_ms, to_ms
from .targets import Details, Firer, Occurrence, retry_delay

log = logging.getLogger("pyscheduler.schedules")

CLAIMED = counter("pyscheduler_schedules_claimed", "Occurrences claimed (Redis and Postgres-only)", ["source"])
FIRED = counter("pyscheduler_schedules_fired", "Occurrences delivered to their target", ["target"])
FAILED = counter("pyscheduler_schedules_failed", "Occurrences given up after the retry policy's attempts")
RETRIES = counter("pyscheduler_schedules_retries", "Retries of failed tries")
RECORDED = counter("pyscheduler_schedules_recorded", "Executions recorded in PostgreSQL", ["outcome"])
DUPLICATES = counter("pyscheduler_schedules_duplicates", "Occurrences recorded before (counted once)")
RECOVERED = counter("pyscheduler_schedules_recovered", "Stuck claims reset by the next-check")
RESYNCED = counter("pyscheduler_schedules_resynced", "Index members written by a resync")
DEGRADED = gauge("pyscheduler_schedules_degraded", "1 while Redis (or a shard of the index) is unreachable "
                                                   "(critical schedules fire from PostgreSQL)")
SHARDS_DOWN = gauge("pyscheduler_schedules_shards_down", "Index shards unreachable (their critical schedules fire "
                    "from PostgreSQL)")
POISON = counter("pyscheduler_schedules_poison", "Occurrences stopped, or schedules left out of the index, because a "
                 "value could not be loaded or a row was refused (logged with the schedule id)", ["where"])
LATENESS = histogram("pyscheduler_schedules_lateness_seconds", "Fire time minus expected time",
                     buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
SERIES = (CLAIMED, FIRED, FAILED, RETRIES, RECORDED, DUPLICATES, RECOVERED, RESYNCED, DEGRADED, SHARDS_DOWN, POISON,
          LATENESS)


@dataclass
class ExecutorConfig:
    """Settings of one executor; the CLI flags map one to one."""

    dsn: str
    redis_url: str
    kafka_bootstrap: str | None = None
    kafka_settings: dict[str, str] = field(default_factory=dict)
    prefix: str = DEFAULT_PREFIX
    shards: int = 0  # index shards (0: 1 on a single node, 16 on a Redis Cluster); fixed per deployment
    batch: int = 1000  # members per claim
    poll_ms: int = 100  # longest sleep between claims
    stuck_after_ms: int = 30000  # a claim older than this is reset (its executor died)
    check_every_ms: int = 5000  # the global next-check period
    fire_timeout_ms: int = 10000  # Kafka delivery / HTTP request timeout
    http_concurrency: int = 64  # HTTP requests in flight
    http_per_host: int = 4  # ... to one host: a slow host delays only its own schedules
    allow_refresh_ms: int = 10000  # how often the egress allow-list (http_allow()) is read again
    max_in_flight: int = 20000  # occurrences claimed and not recorded yet
    record_batch: int = 2000
    # recorder threads (connections). One: two per executor made PostgreSQL spend ~10 us more
    # per firing in the bench (concurrent writers) and recorded no faster
    recorders: int = 1
    resync_batch: int = 1000
    degraded_batch: int = 1000
    degraded_hold_ms: int = 30000  # claimed_until of the Postgres-only claim
    owner: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


class Executor:
    """One executor; ``run(stop)`` until stop is set. Several may run against one index."""

    series = SERIES  # what a process running an executor exports (pyscheduler.metrics)

    def __init__(self, cfg: ExecutorConfig):
        self.cfg = cfg
        self.name = f"schedules-executor-{cfg.owner}"
        self.wakeup = Wakeup()
        self.firer = Firer(kafka_settings=({"bootstrap.servers": cfg.kafka_bootstrap, **cfg.kafka_settings}
                                           if cfg.kafka_bootstrap else {}),
                           timeout=cfg.fire_timeout_ms / 1000, http_concurrency=cfg.http_concurrency,
                           http_per_host=cfg.http_per_host)
        self.db: Database | None = None
        self.index: Shards | None = None
        self.details: dict[int, tuple[str, float, Details]] = {}  # id -> (version, fetched at, details)
        self.poison: dict[int, str] = {}  # id -> why its fire details could not be loaded
        self.held: dict[tuple[int, int], Occurrence] = {}  # claimed, not settled yet
        self.held_lock = threading.Lock()
        self.done: collections.deque[tuple[Occurrence, str | None]] = collections.deque()
        self.retries: list[tuple[float, int, Occurrence]] = []  # (due monotonic, seq, occ)
        self._seq = 0
        self.to_record: queue.Queue = queue.Queue()
        self.unfired: list[Occurrence] = []  # claimed, details not loaded yet (database outage)
        self.degraded = False  # every shard down: the PostgreSQL-only mode
        self.down: set[int] = set()  # shards unreachable (all of them: degraded)
        self.markers: dict[int, str] = {}  # shard -> last marker value seen
        self.lost: set[int] = set()  # shards whose index was lost after this executor saw it complete
        self.resyncing: set[int] = set()  # shards whose index is incomplete (data lost, first start)
        self._order: list[int] = [0]  # the shards in this executor's round-robin order
        self._pos = 0
        self._round_busy = False  # a full claim this round: the next round starts at once
        self._round_due = math.inf  # seconds until the earliest due score seen this round
        # names this executor in resync_take: a new one per instance and after a batch it could
        # not write (a call acknowledges the caller's previous batch as written)
        self.resync_owner = f"{cfg.owner}-{uuid.uuid4().hex[:6]}"
        self._next_resync = 0.0
        self._next_allow = 0.0
        self.crashed: BaseException | None = None  # a recorder thread's crash, raised by the main loop
        self._next_recover = 0.0
        self._next_refresh = 0.0
        self._next_ping = 0.0
        self._down_since: dict[int, float] = {}
        # (claim and details of the next batch, its limit, "redis" or "postgres" (degraded mode),
        # (its shard, last of the round))
        self._prefetch: tuple[Future, int, str, tuple[int, bool]] | None = None
        self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}:prefetch")
        self.stop = threading.Event()
        self.counts = collections.Counter()  # fired, failed, recorded, duplicates, prefetched, poison (tests, bench)

    def fresh(self) -> "Executor":
        """A new executor with these settings (run_daemons' restart): nothing half-torn is kept."""
        return Executor(dataclasses.replace(self.cfg, owner=uuid.uuid4().hex[:12]))

    def degraded_reason(self) -> str | None:
        """Why this executor fires only part of the schedules now (/readyz), or None."""
        if self.degraded:
            return "Redis unreachable: critical schedules fire from PostgreSQL, the others wait"
        down = sorted(self.down)
        if down:
            return (f"Redis unreachable for shard(s) {', '.join(map(str, down))} of {self.index.count}: their "
                    f"critical schedules fire from PostgreSQL, their others wait")
        return None

    # -- running -------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        cfg = self.cfg
        log.info("schedules executor %s starting (batch %d, stuck after %dms, Redis %s)", cfg.owner, cfg.batch,
                 cfg.stuck_after_ms, mask_url(cfg.redis_url))
        self.db = Database.for_daemon(cfg.dsn, name=self.name, max_size=2 + cfg.recorders)
        self.index = Shards.from_url(cfg.redis_url, cfg.prefix, cfg.shards, timeout=2.0)
        n = self.index.count
        start = random.randrange(n)  # executors start their rounds on different shards
        self._order = [(start + k) % n for k in range(n)]
        recorders = [Recorder(self) for _ in range(cfg.recorders)]
        rec_threads = [threading.Thread(target=r.run, name=f"{self.name}:recorder-{k}", daemon=True)
                       for k, r in enumerate(recorders)]
        for t in rec_threads:
            t.start()
        db_outage = Outage("schedules executor: PostgreSQL", log)
        try:
            while not stop.is_set():
                if self.crashed is not None:
                    raise RuntimeError(f"a recorder thread crashed: {self.crashed!r}") from self.crashed
                try:
                    self._refresh_allow()
                    wait = self._degraded_step() if self.degraded else self._redis_step()
                    db_outage.ok()
                except UNREACHABLE as exc:
                    if not self.degraded:
                        self._enter_degraded(exc)
                    wait = 0.2
                except RETRYABLE as exc:
                    # the backoff never outlasts a claim refresh (held claims are not taken for stuck)
                    wait = min(db_outage.failed(exc), cfg.stuck_after_ms / 3000)
                self._serve(wait)
            self._take_prefetch()
            # claimed by the prefetch: fired before stopping (in degraded mode those claimed from
            # PostgreSQL: recorded by their tokens without Redis)
            occs = [o for o in self.unfired if not self.degraded or o.token is not None]
            if occs:
                try:
                    taken = {id(o) for o in occs}
                    self.unfired = [o for o in self.unfired if id(o) not in taken]
                    self._fire(occs, {})
                except (*UNREACHABLE, *RETRYABLE):
                    pass  # their claims are recovered by another executor
            self._drain()
        finally:
            for r in recorders:
                r.stop.set()
                self.to_record.put(None)
            for t in rec_threads:
                t.join(60)
            self._prefetcher.shutdown(wait=True)
            self.firer.close()
            self.index.close()
            self.db.close()
        log.info("schedules executor %s stopped", cfg.owner)

    def _refresh_allow(self) -> None:
        """Read the egress allow-list again (http_allow(), set by an admin) now and then."""
        now = time.monotonic()
        if now >= self._next_allow:
            self._next_allow = now + self.cfg.allow_refresh_ms / 1000
            try:
                self.firer.allow = egress.allow_list(self.db.call_value(HTTP_ALLOW))
            except RETRYABLE:
                pass  # PostgreSQL away: the list read last stays

    def _redis_step(self) -> float:
        """One claim on the Redis index (one shard of the round); returns how long to wait
        before the next."""
        cfg, now = self.cfg, time.monotonic()
        if now >= self._next_recover:
            for k in [k for k in self._order if k not in self.down]:
                try:
                    stuck = self.index.shards[k].recover(cfg.check_every_ms, cfg.stuck_after_ms)
                except UNREACHABLE as exc:
                    self._shard_down(k, exc)
                    continue
                if stuck:
                    RECOVERED.inc(len(stuck))
                    log.warning("reset %d stuck claim(s) older than %dms (an executor died holding them)%s: %s",
                                len(stuck), cfg.stuck_after_ms, self._shard_text(k),
                                ", ".join(map(str, stuck[:20])))
            self._next_recover = now + cfg.check_every_ms / 2000
            if self.degraded:
                return 0.0
        if now >= self._next_refresh:
            self._refresh_claims(now)
        if self.unfired:
            occs, self.unfired = self.unfired, []
            self._fire(occs, {})
        if self.down and now >= self._next_ping:
            self._ping_down(now)
        if self.resyncing and now >= self._next_resync:
            self._resync_step(now)
        if self.degraded:
            return 0.0
        room = cfg.max_in_flight - len(self.held)
        if self._prefetch is not None and self._prefetch[2] == "redis":
            # claimed (and details loaded) while the last batch was fired
            fut, limit, _, (shard, last) = self._prefetch
            self._prefetch = None
            try:
                res, load_error = fut.result()
            except UNREACHABLE as exc:
                self._shard_down(shard, exc)
                return 0.2 if self.degraded else 0.0
            preloaded = True
            self.counts["prefetched"] += len(res.claimed)
        else:
            if room <= 0:
                return cfg.poll_ms / 1000
            if len(self.details) > 2_000_000:  # schedules deleted long ago (no prefetch is loading now)
                self.details.clear()
            shard, last = self._next_shard()
            if shard in self.down:  # went down since (a refresh, a resync write)
                return self._end_of_round(last)
            limit = min(cfg.batch, room)
            try:
                res = self.index.shards[shard].claim(limit)
            except UNREACHABLE as exc:
                self._shard_down(shard, exc)
                return 0.2 if self.degraded else self._end_of_round(last)
            load_error, preloaded = None, False
        if res.marker:
            self.markers[shard] = res.marker
        elif shard not in self.resyncing:
            lost = [shard] + self._incomplete(shard)  # shards lost together share one resync
            for k in lost:
                self.resyncing.add(k)
                # a warning when an index this executor saw complete is gone (Redis lost its
                # data); at start (a first start, or Redis restarted while no executor ran) news
                seen = self.markers.get(k) is not None
                if seen:
                    self.lost.add(k)  # its "resynced" is a warning too: the end of a loss
                log.log(logging.WARNING if seen else logging.INFO,
                        "Redis index%s incomplete (%s): resyncing it from PostgreSQL, critical schedules first",
                        self._shard_text(k), "data lost" if seen else "first start, or Redis lost its data meanwhile")
        full = len(res.claimed) >= limit
        if res.claimed:
            CLAIMED.labels("redis").inc(len(res.claimed))
            more = min(cfg.batch, room - len(res.claimed))
            if full and more > 0 and shard not in self.resyncing and not self.stop.is_set():
                # a backlog: claim the next batch (the next shard's) and load its details in the
                # prefetch thread (Redis and PostgreSQL round trips) while this one is fired
                if last:  # the next batch is the next round's
                    self._round_busy = True
                    self._end_of_round(True)
                nxt = self._next_shard()
                self._prefetch = (self._prefetcher.submit(self._claim_and_load, more, nxt[0]), more, "redis", nxt)
            occs = self._claimed(res.claimed)
            if load_error is not None:
                self._hold(occs)
                self.unfired += occs
                raise load_error
            self._fire(occs, {c.id: c.version for c in res.claimed}, preloaded=preloaded)
        if full or (shard in self.resyncing and self._next_resync <= now):
            self._round_busy = True
        elif res.next_due_ms is not None:
            self._round_due = min(self._round_due, max(0.0, (res.next_due_ms - res.now_ms) / 1000))
        if self._prefetch is not None:
            return 0.0
        return self._end_of_round(last)

    def _incomplete(self, seen: int) -> list[int]:
        """The other shards (up, not resyncing yet) whose marker is missing too."""
        out = []
        for k in self._order:
            if k == seen or k in self.down or k in self.resyncing:
                continue
            try:
                if self.index.shards[k].marker() is None:
                    out.append(k)
            except UNREACHABLE as exc:
                self._shard_down(k, exc)
        return out

    def _next_shard(self) -> tuple[int, bool]:
        """The next shard of the round-robin that is not down, and whether it is the last of
        this round (the shards after it in the order are down)."""
        order, n = self._order, len(self._order)
        for _ in range(n):
            k = order[self._pos]
            self._pos = (self._pos + 1) % n
            if k not in self.down:
                return k, self._pos == 0 or all(j in self.down for j in order[self._pos:])
        return order[0], True  # every shard down (the degraded mode takes over)

    def _end_of_round(self, last: bool) -> float:
        """0 within a round; at its end: the shards that are down get their PostgreSQL claim,
        and the wait until the next round (none after a full claim, else until the earliest
        due score seen, at most poll_ms)."""
        if not last:
            return 0.0
        self._pos = 0
        busy, due = self._round_busy, self._round_due
        self._round_busy, self._round_due = False, math.inf
        if self.down and not self.degraded and self._claim_down_shards():
            busy = True
        if busy:
            return 0.0
        return min(self.cfg.poll_ms / 1000, due)

    def _claim_down_shards(self) -> bool:
        """Some shards down (not all): claim their due critical schedules from PostgreSQL and
        fire them (recorded by their tokens). -> whether the claim was full."""
        room = self.cfg.max_in_flight - len(self.held)
        if room <= 0:
            return False
        limit = min(self.cfg.degraded_batch, room)
        occs = self._claim_critical(limit, sorted(self.down))
        if occs:
            CLAIMED.labels("postgres").inc(len(occs))
            self._fire(occs, {})
        return len(occs) >= limit

    def _shard_text(self, k: int) -> str:
        return f" (shard {k} of {self.index.count})" if self.index.count > 1 else ""

    def _shard_down(self, k: int, exc: BaseException) -> None:
        """Shard k's master is unreachable: its critical schedules fire from PostgreSQL until it
        answers (all shards down: the degraded mode)."""
        if k in self.down:
            return
        if len(self.down | {k}) == self.index.count:
            self._enter_degraded(exc)
            return
        self.down.add(k)
        self._down_since[k] = time.monotonic()
        self._next_ping = time.monotonic() + 0.5
        DEGRADED.set(1)
        SHARDS_DOWN.set(len(self.down))
        log.warning("Redis unreachable for shard %d of %d (%s): its critical schedules fire from PostgreSQL "
                    "until it is back, the other shards go on", k, self.index.count,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def _ping_down(self, now: float) -> list[int]:
        """Probe the shards that are down; those that answer are back (and resynced: their
        critical schedules fired from PostgreSQL meanwhile). -> the shards back"""
        self._next_ping = now + 0.5
        back = []
        for k in sorted(self.down):
            try:
                self.index.shards[k].probe()
            except UNREACHABLE:
                continue
            back.append(k)
        if not back:
            return back
        proposal = uuid.uuid4().hex
        for k in back:
            self.down.discard(k)
            try:
                seen = self.markers.get(k)
                if seen or self.index.count == 1:
                    started = self.index.shards[k].force_resync(seen, proposal) if seen else None
                else:
                    # no marker seen (lost before it went down, or never complete): a resync it
                    # belonged to may have gone on without it (its rows skipped while it was
                    # down), so a new one
                    started = self.index.shards[k].force_resync(None, proposal)
            except UNREACHABLE as exc:
                self.down.add(k)
                log.warning("shard %d answered and failed again: %s", k, exc)
                continue
            self.resyncing.add(k)
            self.lost.add(k)  # the end of an outage: its "resynced" is a warning as its start was
            self._next_resync = 0.0
            log.warning("Redis back%s after %.1fs: %s%s", self._shard_text(k), now - self._down_since.pop(k, now),
                        "leaving degraded mode, " if self.degraded else "",
                        f"resyncing the index (sync {started})" if started else "joining the index resync")
        SHARDS_DOWN.set(len(self.down))
        if not self.down:
            DEGRADED.set(0)
        return back

    def _serve(self, wait: float) -> None:
        """Serve delivery reports and due retries, waiting up to ``wait`` for something to do."""
        if self.retries:
            wait = min(wait, max(0.0, self.retries[0][0] - time.monotonic()))
        if self.done:
            wait = 0.0
        if self.firer.kafka_in_flight():
            self.firer.poll(min(wait, 0.02) if self.firer.in_flight() > self.firer.kafka_in_flight() else wait)
        elif wait > 0:
            self.wakeup.wait(wait, jitter=0.0)
        self.firer.poll(0)
        self._complete()
        now = time.monotonic()
        while self.retries and self.retries[0][0] <= now and not self.stop.is_set():
            _, _, occ = heapq.heappop(self.retries)
            RETRIES.inc()
            self.firer.fire(occ, self._on_done)

    # -- firing --------------------------------------------------------------------

    def _claim_and_load(self, limit: int, shard: int) -> tuple[ClaimResult, BaseException | None]:
        """The prefetch thread: the next claim (on this shard) and its fire details. A claim that
        fails raises (in the main thread, from the future); details that fail come back with
        the claim."""
        res = self.index.shards[shard].claim(limit)
        if res.claimed:
            try:
                self._load_details({c.id for c in res.claimed}, {c.id: c.version for c in res.claimed})
            except RETRYABLE as exc:
                return res, exc
        return res, None

    def _claim_critical(self, limit: int, shards: list[int] | None = None) -> list[Occurrence]:
        """Degraded mode: claim due critical schedules from PostgreSQL (held with a token); of
        these shards only when given (claim_due_critical_shards: the others fire from Redis).
        The due times come as text: one a row stored before the range checks holds (infinity,
        year 10000, BC) would fail the whole batch's loading after the claim was committed; it
        is left out instead (its claim expires; logged)."""
        hold = timedelta(milliseconds=self.cfg.degraded_hold_ms)
        if shards is None:
            rows = self.db.call_tuples(sql.CLAIM_DUE_CRITICAL, as_text=("timestamptz",), max_schedules=limit,
                                       hold=hold)
        else:
            rows = self.db.call_tuples(sql.CLAIM_DUE_CRITICAL_SHARDS, as_text=("timestamptz",), shards=shards,
                                       shard_count=self.index.count, max_schedules=limit, hold=hold)
        occs = []
        for ident, expected, token in rows:
            ms = parse_ms(expected)
            if ms is None:
                POISON.labels("claim").inc()
                log.error("schedule %s is due at %s, outside the supported range [1970, 9999): not fired "
                          "(update_schedule or delete it)", ident, expected)
                continue
            occs.append(Occurrence(ident, ms, token=token))
        return occs

    def _claim_critical_and_load(self, limit: int) -> tuple[list[Occurrence], BaseException | None]:
        """The prefetch thread in degraded mode: the next PostgreSQL claim and its fire details."""
        occs = self._claim_critical(limit)
        if occs:
            try:
                self._load_details({o.id for o in occs}, {})
            except RETRYABLE as exc:
                return occs, exc
        return occs, None

    def _take_prefetch(self) -> None:
        """Settle a prefetch still running (stop, a change of mode): what it claimed is fired later."""
        if self._prefetch is None:
            return
        (fut, _, kind, _), self._prefetch = self._prefetch, None
        try:
            res, _ = fut.result()
        except Exception:  # noqa: BLE001  (claim failed: nothing was claimed)
            return
        occs = self._claimed(res.claimed) if kind == "redis" else res
        self._hold(occs)
        self.unfired += occs

    def _claimed(self, claimed: list) -> list[Occurrence]:
        """The occurrences of a Redis claim, but those this executor holds already: a claim
        the stuck-claim check reset (its refresh came late, e.g. during a PostgreSQL outage)
        and this executor took again is still being fired or recorded here."""
        held = self.held
        return [Occurrence(c.id, c.expected_ms) for c in claimed if (c.id, c.expected_ms) not in held]

    def _hold(self, occs: list[Occurrence]) -> None:
        now = time.monotonic()
        with self.held_lock:
            for occ in occs:
                if (occ.id, occ.expected_ms) not in self.held:
                    occ.claimed_at = now
                    self.held[(occ.id, occ.expected_ms)] = occ

    def _fire(self, occs: list[Occurrence], versions: dict[int, str], preloaded: bool = False) -> None:
        self._hold(occs)
        if not preloaded:
            try:
                self._load_details({o.id for o in occs}, versions)
            except RETRYABLE:
                self.unfired += occs  # PostgreSQL away: fired when it is back (claims kept and refreshed)
                raise
        gone: list[Occurrence] = []
        now_ms = int(time.time() * 1000)
        paused: list[Occurrence] = []
        out: list = []  # to the recorders, in one queue item (a put per occurrence costs GIL hand-offs)
        kafka: list[Occurrence] = []
        details = self.details
        for occ in occs:
            entry = details.get(occ.id)
            occ.details = d = entry[2] if entry else None
            if d is None and occ.id in self.poison:
                out.append(("poison", occ, self.poison[occ.id]))  # its fire details cannot be loaded
            elif d is None or not d.active:
                gone.append(occ)  # deleted or ended since it was indexed: re-read its index entry
            elif d.paused:
                paused.append(occ)  # fires only if it is the pending trigger
            elif occ.expected_ms < now_ms - d.catchup_ms:
                out.append(("missed", occ, None))  # too late: joins the catch-up summary
            elif d.kind == "kafka":
                kafka.append(occ)
            elif d.kind == "task":
                out.append(("task", occ, None))
            else:
                self.firer.fire(occ, self._on_done)
        if kafka:
            self.firer.fire_kafka(kafka, self._on_done)
        out += [("reindex", occ, None) for occ in gone]
        if out:
            self.to_record.put(out)
        if paused:
            self._fire_paused(paused)

    def _fire_paused(self, paused: list[Occurrence]) -> None:
        """A paused schedule's claimed occurrence fires only if it is the pending trigger."""
        try:
            due = {r["id"]: r["next_run_at"] for r in self.db.call(sql.INDEX_ENTRIES, ids=[o.id for o in paused])}
        except RETRYABLE:
            self.unfired += paused
            raise
        out: list = []
        for occ in paused:
            if due.get(occ.id) is not None and to_ms(due[occ.id]) == occ.expected_ms:
                if occ.details.kind == "task":
                    out.append(("task", occ, None))
                else:
                    self.firer.fire(occ, self._on_done)
            else:
                out.append(("reindex", occ, None))
        if out:
            self.to_record.put(out)

    def _load_details(self, ids: set[int], versions: dict[int, str]) -> None:
        """Load the fire details of these ids unless cached at their version; the ids whose
        details cannot be loaded (a data error, isolated) go to ``self.poison``."""
        now = time.monotonic()
        stale = []
        for i in ids:
            entry = self.details.get(i)
            version = versions.get(i, "")
            if entry is None or entry[0] != version or (version == "" and now - entry[1] > 2.0):
                stale.append(i)
        if not stale:
            return
        rows, poison = isolate(stale, lambda chunk: self.db.call_binary(sql.FIRE_DETAILS, ids=Int8Array(chunk)))
        for row in rows:
            ver = "" if row["version"] is None else str(row["version"])
            self.details[row["id"]] = (versions.get(row["id"], ver) or ver, now, Details.from_row(row))
            self.poison.pop(row["id"], None)
        for ident, exc in poison:
            self.details.pop(ident, None)
            self.poison[ident] = f"its fire details cannot be loaded: {exc}"

    def _on_done(self, occ: Occurrence, error: str | None) -> None:
        """A try finished (Kafka delivery report, HTTP response): called from any thread."""
        self.done.append((occ, error))
        if occ.details.kind != "kafka":
            self.wakeup.poke()

    def _complete(self) -> None:
        out: list = []
        fired: dict[str, int] = {}
        late: list[float] = []
        now_ms = int(time.time() * 1000)  # one clock read per batch of reports
        while self.done:
            occ, error = self.done.popleft()
            d = occ.details
            if error is None:
                occ.fired_at_ms = now_ms
                late.append(now_ms - occ.expected_ms)
                fired[d.kind] = fired.get(d.kind, 0) + 1
                out.append(("fired", occ, None))
            elif occ.tries <= d.retry_attempts and not occ.refused and not self.stop.is_set():
                occ.error = error
                delay = retry_delay(occ.tries - 1, d.retry_base, d.retry_jitter)
                self._seq += 1
                heapq.heappush(self.retries, (time.monotonic() + delay, self._seq, occ))
            else:
                FAILED.inc()
                self.counts["failed"] += 1
                log.warning("schedule %s (%s) occurrence %s failed after %d tr%s: %s", d.name, d.id,
                            from_ms(occ.expected_ms).isoformat(), occ.tries, "y" if occ.tries == 1 else "ies",
                            error)
                out.append(("failed", occ, error))
        if out:
            self.to_record.put(out)
        for kind, n in fired.items():
            FIRED.labels(kind).inc(n)
        if late:
            self.counts["fired"] += len(late)
            observe_ms(LATENESS, late)

    def _refresh_claims(self, now: float) -> None:
        """Date the Redis claims still held now, so a long retry is not taken as stuck."""
        third = self.cfg.stuck_after_ms / 3000
        self._next_refresh = now + third
        with self.held_lock:
            old = [o for o in self.held.values() if o.token is None and now - o.claimed_at > third]
        if old:
            for k, part in self.index.split(old, key=lambda o: o.id).items():
                if k in self.down:
                    continue
                try:
                    self.index.shards[k].refresh([(o.id, o.expected_ms) for o in part])
                except UNREACHABLE as exc:
                    self._shard_down(k, exc)
                    continue
                for o in part:
                    o.claimed_at = now

    def _drain(self, grace: float = 10.0) -> None:
        """On stop: wait for tries in flight (their outcome is recorded); pending retries and
        HTTP tries waiting for a slow host are left claimed (the stuck-claim recovery hands them
        to another executor)."""
        end = time.monotonic() + grace
        dropped = self.firer.drop_queued()
        if dropped:
            log.info("stopping with %d HTTP tr%s waiting for a slow host: their claims are recovered by another "
                     "executor", dropped, "y" if dropped == 1 else "ies")
        while self.firer.in_flight() and time.monotonic() < end:
            self._serve(0.05)
        self._serve(0.0)
        if self.retries:
            log.info("stopping with %d retr%s pending: their claims are recovered by another executor",
                     len(self.retries), "y" if len(self.retries) == 1 else "ies")

    # -- resync --------------------------------------------------------------------

    def _resync_step(self, now: float) -> None:
        """Take a batch of the resync (leased to this executor), write it, and so acknowledge
        it with the next take; the index is complete once every batch was acknowledged. Shards
        lost together share a sync id (proposed here): one pass over PostgreSQL refills them,
        each row written to its own shard (the rows of other shards are skipped)."""
        proposal = uuid.uuid4().hex
        groups: dict[str, list[int]] = {}
        for k in sorted(self.resyncing - self.down):
            try:
                sync_id = self.index.shards[k].begin_resync(proposal)
            except UNREACHABLE as exc:
                self._shard_down(k, exc)
                continue
            if sync_id is None:
                self.resyncing.discard(k)
            else:
                groups.setdefault(sync_id, []).append(k)
        for sync_id, shards in groups.items():
            rows = self.db.call(sql.RESYNC_TAKE, sync_id=sync_id, owner=self.resync_owner,
                                max_schedules=self.cfg.resync_batch,
                                lease=timedelta(milliseconds=self.cfg.stuck_after_ms))
            if self.index.count > 1:
                # every shard of this sync id, not only those this executor found lost: a batch
                # it acknowledges is not handed out again (the id's shards are fixed before its
                # first take: the executor that proposed it began them all before taking)
                shards = self._resync_members(sync_id, shards)
            if rows:
                if self.index.count > 1:
                    mine = set(shards)
                    rows = [r for r in rows if self.index.of(r["id"]) in mine]
                written, failed = self.index.each(mirror_entries(rows), lambda ix, part: ix.mirror(part))
                if failed:
                    # not written: the next take must not acknowledge it (its lease expires and
                    # another taker writes it)
                    self.resync_owner = f"{self.cfg.owner}-{uuid.uuid4().hex[:6]}"
                    for k, exc in failed.items():
                        self._shard_down(k, exc)
                RESYNCED.inc(len(rows))
            elif not self.db.call_one(sql.RESYNC_PROGRESS, sync_id=sync_id)["complete"]:
                self._next_resync = now + self.cfg.poll_ms / 1000  # other takers' batches are still out
            else:
                for k in shards:
                    try:
                        finished = self.index.shards[k].finish_resync(sync_id)
                    except UNREACHABLE as exc:
                        self._shard_down(k, exc)
                        continue
                    if finished:
                        self.resyncing.discard(k)
                        self.markers[k] = sync_id
                        log.log(logging.WARNING if k in self.lost else logging.INFO,
                                "Redis index%s resynced from PostgreSQL (sync %s)", self._shard_text(k), sync_id)
                        self.lost.discard(k)

    def _resync_members(self, sync_id: str, known: list[int]) -> list[int]:
        """The shards (up) whose resync in progress is ``sync_id``."""
        out = []
        for k in range(self.index.count):
            if k in self.down:
                continue
            if k in known:
                out.append(k)
                continue
            try:
                value = self.index.shards[k].resync_id()
            except UNREACHABLE as exc:
                self._shard_down(k, exc)
                continue
            if value == sync_id:
                out.append(k)
        return out

    # -- degraded mode -------------------------------------------------------------

    def _enter_degraded(self, exc: BaseException) -> None:
        self._take_prefetch()  # its occurrences (if it claimed any) are fired from PostgreSQL's details
        self.degraded = True
        now = time.monotonic()
        for k in range(self.index.count):
            if k not in self.down:
                self.down.add(k)
                self._down_since[k] = now
        self._next_ping = now + 0.5
        DEGRADED.set(1)
        SHARDS_DOWN.set(len(self.down))
        log.warning("Redis unreachable (%s): degraded mode, critical schedules fire from PostgreSQL "
                    "until it is back", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def _degraded_step(self) -> float:
        cfg = self.cfg
        now = time.monotonic()
        if self.unfired:
            occs, self.unfired = self.unfired, []
            self._fire(occs, {})
        if now >= self._next_ping:
            if self._ping_down(now):
                self._take_prefetch()  # claimed from PostgreSQL: fired (and recorded by token) in the Redis mode
                self.degraded = False
                self._pos, self._round_busy, self._round_due = 0, False, math.inf
                return 0.0
        room = cfg.max_in_flight - len(self.held)
        if self._prefetch is not None and self._prefetch[2] == "postgres":
            # claimed (and details loaded) while the last batch was fired, as on the Redis path
            (occs, load_error), limit = self._prefetch[0].result(), self._prefetch[1]
            self._prefetch = None
            preloaded = True
            self.counts["prefetched"] += len(occs)
        else:
            if room <= 0:
                return cfg.poll_ms / 1000
            limit = min(cfg.degraded_batch, room)
            occs, load_error, preloaded = self._claim_critical(limit), None, False
        if not occs:
            return cfg.poll_ms / 1000
        CLAIMED.labels("postgres").inc(len(occs))
        more = min(cfg.degraded_batch, room - len(occs))
        if len(occs) >= limit and more > 0 and not self.stop.is_set():
            self._prefetch = (self._prefetcher.submit(self._claim_critical_and_load, more), more, "postgres",
                              (0, True))
        if load_error is not None:
            self._hold(occs)
            self.unfired += occs
            raise load_error
        self._fire(occs, {}, preloaded=preloaded)
        return 0.0 if len(occs) >= limit else cfg.poll_ms / 1000


def observe_ms(hist: Histogram, values_ms: list[float]) -> None:
    """Observe many durations (ms, negative = 0) in a seconds histogram: one increment per
    bucket touched instead of a locked increment per value and bucket."""
    bounds = getattr(hist, "_upper_bounds", None)
    buckets = getattr(hist, "_buckets", None)
    if bounds is None or buckets is None or len(bounds) != len(buckets):  # another prometheus_client
        for v in values_ms:
            hist.observe(max(0.0, v / 1000))
        return
    counts = [0] * len(bounds)
    total = 0.0
    for v in values_ms:
        v = max(0.0, v / 1000)
        total += v
        counts[bisect.bisect_left(bounds, v)] += 1  # the first bound >= v (the last is +Inf)
    hist._sum.inc(total)
    for bucket, n in zip(buckets, counts):
        if n:
            bucket.inc(n)


def mirror_entries(rows: list[dict]) -> list[tuple[int, int | None, int | None]]:
    """(id, score or None, version) for Index.mirror from index_entries / index_page / resync_take rows."""
    out = []
    for r in rows:
        active = r.get("active", True)
        nxt = r["next_run_at"] if active else None
        upd = r.get("updated")
        out.append((r["id"], None if nxt is None else to_ms(nxt), None if upd is None else to_ms(upd)))
    return out


class Recorder:
    """The executor's recorder thread: outcomes -> PostgreSQL in batches -> Redis scores."""

    def __init__(self, ex: Executor):
        self.ex = ex
        self.stop = threading.Event()
        self.unsettled: list[tuple[int, int, int | None]] = []
        self.changed: list[tuple[int, int]] = []  # (id, expected) still claimed: due time to read again
        self.outage = Outage("schedules recorder: PostgreSQL", log)
        self.redis_outage = Outage("schedules recorder: Redis", log)
        self.shard_retry: dict[int, float] = {}  # sharded index: shard -> when to try its settle again
        self.shard_tries: dict[int, int] = {}

    def run(self) -> None:
        """The thread: a crash (neither an outage nor a data error) stops the executor, whose
        main loop raises it (run_daemons restarts the executor)."""
        try:
            self._run()
        except BaseException as exc:
            log.exception("schedules recorder crashed")
            self.ex.crashed = exc
            self.ex.wakeup.poke()

    def _run(self) -> None:
        q = self.ex.to_record
        limit = self.ex.cfg.record_batch
        while True:
            items: list = []
            try:
                first = q.get(timeout=0.5)
            except queue.Empty:
                first = []
            if first is None:
                break
            items += first
            deadline = time.monotonic() + 0.002
            while items and len(items) < limit:
                try:
                    nxt = q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    q.put(None)
                    break
                items += nxt
            if items:
                self.record(items)
            self.settle()
        rest: list = []  # stop: what is queued still gets recorded
        while True:
            try:
                item = q.get_nowait()
            except queue.Empty:
                break
            if item is None:  # another recorder's stop signal
                q.put(None)
                break
            rest += item
        if rest:
            self.record(rest, give_up_after=10.0)
        self.settle()

    def record(self, items: list, give_up_after: float | None = None) -> None:
        groups: dict[tuple[str, bool], list] = collections.defaultdict(list)
        for kind, occ, error in items:
            group = kind if kind in ("task", "reindex", "poison") else "record"
            groups[(group, occ.token is not None)].append((kind, occ, error))
        for (group, tokens), batch in groups.items():
            if group == "poison":  # from the main loop: fire details that cannot be loaded
                self._stop([("failed", occ, error) for _, occ, error in batch], tokens, "details", give_up_after)
                continue
            rows, poison = isolate(batch, lambda part: self._call(give_up_after, group, part))
            if poison:
                bad = {id(occ) for (_, occ, _), _ in poison}
                batch = [item for item in batch if id(item[1]) not in bad]
                self._stop([(kind if group == "record" else "failed", occ,
                             f"PostgreSQL refused to record it or returned a value that cannot be loaded: {exc}")
                            for (kind, occ, _), exc in poison], tokens, "record", give_up_after)
            self._recorded(group, tokens, [occ for _, occ, _ in batch], rows)

    def _stop(self, items: list[tuple[str, Occurrence, str]], tokens: bool, where: str,
              give_up_after: float | None) -> None:
        """End (outcome, occurrence, error) items as record_executions ends a poison item of
        its own (stop_schedules: recorded with the outcome and the error, the schedule paused
        with a note); logged and counted. stop_schedules reads nothing from the schedule's row
        that could be poison, so a data error here is a bug: raised, not isolated."""
        for _, occ, why in items:
            POISON.labels(where).inc()
            self.ex.counts["poison"] += 1
            log.error("schedule %s occurrence %s stopped: %s; its schedule is paused (last_error says why: fix it "
                      "with update_schedule, then resume it)", occ.id, from_ms(occ.expected_ms).isoformat(), why)
        occs = [occ for _, occ, _ in items]
        self._recorded("stop", tokens, occs, self._call(give_up_after, "stop", items))

    def _recorded(self, group: str, tokens: bool, occs: list[Occurrence], rows: list[dict] | None) -> None:
        """Count what a call recorded and queue the next runs it answered for the settle."""
        if not occs:
            return
        if rows is None:  # not recorded: the claims stay and the stuck-claim recovery retries them
            self._settled(occs, [])
            return
        if group == "reindex":
            by_id = {r["id"]: r for r in rows}
            self._settled(occs, [(o.id, o.expected_ms,
                                  _next_ms(by_id.get(o.id)) if by_id.get(o.id, {}).get("active") else None)
                                 for o in occs])
            return
        self._count(rows, group)
        if tokens:
            self._settled(occs, [])
            return
        entries = []
        if len({o.id for o in occs}) == len(occs):  # one row per occurrence: matched by schedule id
            nexts = {r["id"]: r["next_run_at"] for r in rows}
            for o in occs:
                nxt = nexts.get(o.id)
                entries.append((o.id, o.expected_ms, None if nxt is None else to_ms(nxt)))
        else:
            by_key = {(r["id"], to_ms(r["expected_at"])): r["next_run_at"] for r in rows}
            for o in occs:
                nxt = by_key.get((o.id, o.expected_ms))
                entries.append((o.id, o.expected_ms, None if nxt is None else to_ms(nxt)))
        self._settled(occs, entries)

    def _count(self, rows: list[dict], group: str) -> None:
        recorded = sum(1 for r in rows if r["recorded"])
        counts = self.ex.counts
        if recorded:
            RECORDED.labels(group).inc(recorded)
            counts["recorded"] += recorded
        if len(rows) > recorded:
            DUPLICATES.inc(len(rows) - recorded)
            counts["duplicates"] += len(rows) - recorded

    def _settled(self, occs: list[Occurrence], entries: list) -> None:
        with self.ex.held_lock:
            for o in occs:
                self.ex.held.pop((o.id, o.expected_ms), None)
        self.unsettled.extend(entries)

    def settle(self, rounds: int = 3) -> None:
        """Write the next runs recorded to Redis. A member the relay met while it was claimed
        (its schedule changed: update_schedule, pause, trigger, delete) is not given the next
        run recorded, which may be the old cadence's: its due time is read again
        (index_entries) and settled, in up to ``rounds`` rounds here, the rest in the next call."""
        for _ in range(rounds):
            if self.changed:
                changed, self.changed = self.changed, []
                self.record([("reindex", Occurrence(i, e), None) for i, e in changed])
            if not self.unsettled:
                return
            index = self.ex.index
            if index.count == 1:
                try:
                    self.changed = index.shards[0].settle(self.unsettled)
                    self.unsettled = []
                    self.redis_outage.ok()
                except UNREACHABLE as exc:  # kept until Redis answers (a resync follows an outage anyway)
                    self.stop.wait(self.redis_outage.failed(exc))
                    return
            else:
                # shard by shard: an unreachable shard keeps its entries (tried again after a
                # backoff of its own) and does not hold up the others
                now = time.monotonic()
                waiting = {k for k, at in self.shard_retry.items() if at > now}
                ready = [e for e in self.unsettled if index.of(e[0]) not in waiting]
                results, failed = index.each(ready, lambda ix, part: ix.settle(part))
                self.changed = [x for part in results for x in part]
                for k, exc in failed.items():
                    tries = self.shard_tries.get(k, 0) + 1
                    self.shard_tries[k] = tries
                    self.shard_retry[k] = now + min(5.0, 0.1 * 2 ** tries)
                    if tries == 1:
                        log.warning("schedules recorder: Redis unreachable for shard %d (%s): its next runs are "
                                    "kept until it answers", k, str(exc).splitlines()[0] if str(exc) else exc)
                for k in {index.of(e[0]) for e in ready} - set(failed):
                    if self.shard_tries.pop(k, 0):
                        log.info("schedules recorder: shard %d answers again", k)
                    self.shard_retry.pop(k, None)
                keep = waiting | set(failed)
                self.unsettled = [e for e in self.unsettled if index.of(e[0]) in keep]
            if not self.changed:
                return

    def _call(self, give_up_after: float | None, group: str, batch: list) -> list[dict] | None:
        """Record (re-read, for "reindex"; stop, for "stop") a batch in one transaction; an
        outage is retried with backoff (None: given up at stop), a data error is raised
        (``isolate`` splits the batch). The transaction makes a batch whose answer cannot be
        loaded leave nothing behind: its parts are recorded as if it had never been tried."""
        occs = [occ for _, occ, _ in batch]
        tokens = [o.token for o in occs] if occs[0].token is not None else None
        if group == "reindex":
            function, binary, args = sql.INDEX_ENTRIES, False, {"ids": [o.id for o in occs]}
        elif group == "stop":
            function, binary = sql.STOP_SCHEDULES, False
            args = {"ids": [o.id for o in occs], "expected": [from_ms(o.expected_ms) for o in occs],
                    "outcomes": [k for k, _, _ in batch], "errors": [e for _, _, e in batch]}
        elif group == "task":
            function, binary = sql.FIRE_TASK_SCHEDULES, False
            args = {"ids": [o.id for o in occs], "expected": [from_ms(o.expected_ms) for o in occs]}
            if tokens:
                args["tokens"] = tokens
        else:
            # binary arrays packed in one go (arrays.py): a text array of 2,000 timestamps
            # cost the executor (datetimes, quoting) and the server (parsing) more
            errors = [e for _, _, e in batch]
            function, binary = sql.RECORD_EXECUTIONS, True
            args = {"ids": Int8Array(o.id for o in occs), "expected": EpochMsArray(o.expected_ms for o in occs),
                    "outcomes": [k for k, _, _ in batch],  # fired | failed | missed
                    "attempts": Int4Array(o.tries for o in occs),
                    "errors": errors if any(e is not None for e in errors) else None}
            if tokens:
                args["tokens"] = tokens
        end = None if give_up_after is None else time.monotonic() + give_up_after
        while True:
            try:
                with self.ex.db.session() as session, session.conn.transaction():
                    rows = (session.call_binary if binary else session.call)(function, **args)
                self.outage.ok()
                return rows
            except RETRYABLE as exc:
                pause = self.outage.failed(exc)
                if end is None and self.stop.is_set():
                    end = time.monotonic() + 10.0
                if end is not None and time.monotonic() + pause > end:
                    log.warning("giving up recording %d occurrence(s) at stop: their claims are recovered "
                                "by another executor and fired again with the same idempotency keys", len(occs))
                    return None
                self.stop.wait(pause) if end is None else time.sleep(pause)


T = TypeVar("T")


def isolate(items: list[T], call) -> tuple[list | None, list[tuple[T, BaseException]]]:
    """``call(items)`` -> rows; when it fails with a data error (``rejects_arguments``: a value
    that cannot be loaded, a row the database refuses), split the batch in halves until
    each poison item is alone: (rows of the other items, [(poison item, error)]). Rows are
    None when ``call`` returned None for a part (it gave up). Any other error is raised."""
    try:
        return call(items), []
    except Exception as exc:
        if not rejects_arguments(exc):
            raise
        if len(items) == 1:
            return [], [(items[0], exc)]
    mid = len(items) // 2
    rows1, poison1 = isolate(items[:mid], call)
    rows2, poison2 = isolate(items[mid:], call)
    return (None if rows1 is None or rows2 is None else rows1 + rows2), poison1 + poison2


def parse_ms(text: str | None) -> int | None:
    """Epoch ms of a timestamptz in PostgreSQL's ISO text form, or None when it cannot be
    loaded or is outside [1970-01-01Z, 9999-01-01Z) (infinity, year 10000, BC)."""
    try:
        ms = to_ms(datetime.fromisoformat(text))
    except (TypeError, ValueError, OverflowError):
        return None
    return ms if 0 <= ms < _MAX_MS else None


_MAX_MS = 253_370_764_800_000  # 9999-01-01T00:00:00Z


def _next_ms(row: dict | None) -> int | None:
    if row is None or row.get("next_run_at") is None:
        return None
    return to_ms(row["next_run_at"])


__all__ = ["Executor", "ExecutorConfig", "mirror_entries", "redis"]
