"""The executor's recorder thread: outcomes -> PostgreSQL in batches (``record_executions``,
``fire_task_schedules``), then each member's score in Redis -> the next run the database
computed (the member goes when its schedule ended). A batch that fails with a data error is
split until the poison occurrence is alone (``isolate``), which ends with ``stop_schedules``
(docs/operations.md, "Schedule daemons: poison values, restarts, HTTP egress")."""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from functools import partial
from typing import Any, Protocol, TypeVar

from ..db import Database, Outage, Wakeup
from ..errors import RETRYABLE, rejects_arguments
from ..redisconn import UNREACHABLE
from . import sqlapi as sql
from .arrays import EpochMsArray, Int4Array, Int8Array
from .index import Shards, from_ms, to_ms
from .series import DUPLICATES, POISON, RECORDED
from .targets import Occurrence

log = logging.getLogger("pyscheduler.schedules")


class Owner(Protocol):
    """What a recorder uses of its executor (executor.Executor, which imports this module)."""

    cfg: Any  # ExecutorConfig: record_batch
    db: Database
    index: Shards
    to_record: queue.Queue
    held: dict[tuple[int, int], Occurrence]  # claimed and not recorded yet, by (id, expected ms)
    held_lock: threading.Lock
    counts: collections.Counter
    wakeup: Wakeup
    crashed: BaseException | None


class Recorder:
    """The executor's recorder thread: outcomes -> PostgreSQL in batches -> Redis scores."""

    def __init__(self, ex: Owner):
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
            rows, poison = isolate(batch, partial(self._call, give_up_after, group))
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


def _next_ms(row: dict | None) -> int | None:
    if row is None or row.get("next_run_at") is None:
        return None
    return to_ms(row["next_run_at"])
