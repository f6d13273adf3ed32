# Over 600 lines: one class, whose claim rounds, firing, degraded mode and resync share one loop's state.
"""Schedule executors (``Executor``: one daemon each, several per index): claim due members of
the Redis index with one Lua call per shard, round-robin (while Redis or a shard is down: the
due critical schedules from PostgreSQL), fire them (Kafka, HTTP; task targets in SQL), retry
per the schedule's policy, and hand each outcome to the recorder thread (recorder.py), which
records it and moves the score. A prefetch thread claims and loads the next batch while one is
fired; the main loop also resets stuck claims and resyncs a lost index. Only an outage is
retried; any other error crashes the executor (``run_daemons`` restarts it with ``fresh()``).
How and why: docs/operations.md, "Recurring schedules" and "How an executor works"."""

from __future__ import annotations

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

from .. import egress
from ..calls import MAX_INSTANT
from ..db import Database, Outage, Wakeup
from ..errors import RETRYABLE
from ..masking import mask_url
from ..metrics import Reads
from ..redisconn import UNREACHABLE
from ..sqlapi import HTTP_ALLOW
from . import sqlapi as sql
from .arrays import Int8Array
from .index import DEFAULT_PREFIX, ClaimResult, Shards, from_ms, to_ms
from .recorder import Recorder, isolate
from .relay import mirror_entries
from .series import (CLAIMED, DEGRADED, FAILED, FIRED, LATENESS, POISON, RECOVERED, RESYNCED, RETRIES, SERIES,
                     SHARDS_DOWN, late_gauge, observe_ms)
from .targets import Details, Firer, Occurrence, retry_delay

log = logging.getLogger("pyscheduler.schedules")


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

    series = SERIES  # the class's; an instance adds its Reads (schedules late)
    label = "schedules-executor"  # its daemon label in /metrics (its name has the owner's id)

    def __init__(self, cfg: ExecutorConfig):
        self.cfg = cfg
        self.name = f"schedules-executor-{cfg.owner}"
        # what a process running an executor exports (pyscheduler.metrics)
        self.series = (*SERIES, Reads(cfg.dsn, "schedules", late_gauge))
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
                FAILED.labels(d.kind).inc()
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


def parse_ms(text: str | None) -> int | None:
    """Epoch ms of a timestamptz in PostgreSQL's ISO text form, or None when it cannot be
    loaded or is outside [1970-01-01Z, 9999-01-01Z) (infinity, year 10000, BC)."""
    try:
        ms = to_ms(datetime.fromisoformat(text))
    except (TypeError, ValueError, OverflowError):
        return None
    return ms if 0 <= ms < _MAX_MS else None


_MAX_MS = to_ms(MAX_INSTANT)  # 9999-01-01T00:00:00Z, the instants every client loads


__all__ = ["Executor", "ExecutorConfig"]
