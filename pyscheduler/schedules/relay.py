"""The index relay and the cleanup loop of recurring schedules.

``IndexRelay`` mirrors enabled schedules from PostgreSQL into the Redis index: it follows
NOTIFY ``pyscheduler_schedules`` (``index_entries`` of each changed id) and reconciles the
whole index every ``reconcile_interval`` (``index_page``), pruning the ``last``/``ver``
entries of schedules no longer active; ``mirror_entries`` turns those rows into index
entries. ``Cleanup`` deletes executions past retention (``purge_executions``) in batches.
Only an outage is retried; a schedule whose due time cannot be indexed is left out and
logged once (docs/operations.md, "Recurring schedules").
"""

from __future__ import annotations

import logging
import threading
import time

from ..db import Database, Listener, Outage, Wakeup
from ..errors import RETRYABLE
from ..metrics import counter
from ..redisconn import UNREACHABLE
from . import sqlapi as sql
from .index import DEFAULT_PREFIX, Index, Shards, to_ms
from .series import POISON

log = logging.getLogger("pyscheduler.schedules")

CHANNEL = "pyscheduler_schedules"
MIRRORED = counter("pyscheduler_schedules_mirrored", "Index members written by the relay (NOTIFY and reconcile)")
PURGED = counter("pyscheduler_schedules_purged", "Executions deleted past retention")


def mirror_entries(rows: list[dict]) -> list[tuple[int, int | None, int | None]]:
    """(id, score or None, version) for Index.mirror from index_entries / index_page / resync_take rows."""
    out = []
    for r in rows:
        active = r.get("active", True)
        nxt = r["next_run_at"] if active else None
        upd = r.get("updated")
        out.append((r["id"], None if nxt is None else to_ms(nxt), None if upd is None else to_ms(upd)))
    return out


class IndexRelay:
    name = "schedules-relay"
    series = (MIRRORED, POISON)

    def __init__(self, dsn: str, redis_url: str, *, prefix: str = DEFAULT_PREFIX, reconcile_interval: float = 60.0,
                 page: int = 5000, prune_after: float = 600.0, shards: int = 0):
        self.dsn, self.redis_url, self.prefix = dsn, redis_url, prefix
        self.shards = shards  # index shards (0: 1 on a single node, 16 on a Redis Cluster)
        self.reconcile_interval = reconcile_interval
        self.page = page
        self.prune_after = prune_after  # s: last/ver entries of inactive schedules claimed longer ago go
        self.pruned = 0
        self.pending: set[int] = set()
        self.lock = threading.Lock()
        self.wakeup = Wakeup()
        self.reconcile_now = True
        self.reconciles = 0
        self.unindexable: set[int] = set()  # ids logged as not indexable (due time out of range)

    def fresh(self) -> "IndexRelay":
        """A new relay with these settings (run_daemons' restart)."""
        return IndexRelay(self.dsn, self.redis_url, prefix=self.prefix, reconcile_interval=self.reconcile_interval,
                          page=self.page, prune_after=self.prune_after, shards=self.shards)

    def _notified(self, _channel: str, payload: str) -> None:
        """A notification: schedule ids, comma-separated. Any role may NOTIFY (PostgreSQL asks
        no privilege for it), so whatever else a payload holds is ignored: only ASCII digits
        within bigint reach index_entries."""
        ids = []
        for part in payload.split(","):
            part = part.strip()
            if part.isascii() and part.isdigit() and len(part) <= 19 and int(part) < 2 ** 63:
                ids.append(int(part))
        if ids:
            with self.lock:
                self.pending.update(ids)
            self.wakeup.poke()

    def _reconnected(self) -> None:
        self.reconcile_now = True  # notifications may have been missed
        self.wakeup.poke()

    def run(self, stop: threading.Event) -> None:
        index = Shards.from_url(self.redis_url, self.prefix, self.shards)  # connects at its first command
        db = Database.for_daemon(self.dsn, name=self.name, max_size=2)
        listener = Listener(self.dsn, [CHANNEL], self._notified, on_reconnect=self._reconnected, logger=log).start()
        stop_poke = threading.Thread(target=lambda: (stop.wait(), self.wakeup.poke()), daemon=True)
        stop_poke.start()
        outage = Outage("schedules relay", log)
        next_reconcile = time.monotonic() + self.reconcile_interval
        try:
            # the first reconcile after LISTEN (notifications sent before would be missed), or after
            # its first try failed (PostgreSQL down: once it listens, _reconnected asks for a reconcile)
            listener.tried.wait(10)
            while not stop.is_set():
                try:
                    self.follow(db, index)
                    if self.reconcile_now or time.monotonic() >= next_reconcile:
                        self.reconcile_now = False
                        self.reconcile(db, index)
                        next_reconcile = time.monotonic() + self.reconcile_interval
                    outage.ok()
                except (*UNREACHABLE, *RETRYABLE) as exc:
                    self.reconcile_now = True
                    stop.wait(outage.failed(exc))
                    continue
                with self.lock:
                    busy = bool(self.pending)
                if not busy:
                    self.wakeup.wait(min(1.0, max(0.0, next_reconcile - time.monotonic())), jitter=0.0)
        finally:
            listener.stop()
            index.close()
            db.close()

    def follow(self, db: Database, index: Index | Shards) -> int:
        """Write the index entries of the schedules notified so far."""
        with self.lock:
            ids, self.pending = sorted(self.pending), set()
        written = 0
        try:
            for i in range(0, len(ids), 1000):
                rows = db.call(sql.INDEX_ENTRIES, ids=ids[i:i + 1000])
                written += index.mirror(mirror_entries(self._checked(rows)))
        except BaseException:
            with self.lock:  # not lost: tried again after the outage
                self.pending.update(ids)
            raise
        MIRRORED.inc(written)
        return written

    def reconcile(self, db: Database, index: Index | Shards) -> int:
        """Make the index match PostgreSQL: every active schedule indexed, nothing else."""
        written, after, active = 0, 0, set()
        while True:
            rows = db.call(sql.INDEX_PAGE, after=after, max_schedules=self.page)
            if not rows:
                break
            written += index.mirror(mirror_entries(self._checked(rows)))
            active.update(r["id"] for r in rows)
            after = rows[-1]["id"]
        extra = [m for m in index.members() if m not in active]
        for i in range(0, len(extra), 1000):  # re-read: created after its page was read
            written += index.mirror(mirror_entries(self._checked(db.call(sql.INDEX_ENTRIES, ids=extra[i:i + 1000]))))
        # the last-claimed and version entries of schedules that ended, paused or were
        # deleted: the hashes would otherwise grow with every schedule ever fired
        gone = [i for i in index.hashed_ids() if i not in active]
        pruned = index.prune(gone, int(self.prune_after * 1000)) if gone else 0
        if pruned:
            log.info("reconcile: pruned %d last/version entr%s of inactive schedules", pruned,
                     "y" if pruned == 1 else "ies")
        self.pruned += pruned
        self.reconciles += 1
        if written:
            log.info("reconcile: %d index member(s) written or removed (%d active schedules)", written, len(active))
        MIRRORED.inc(written)
        return written


    def _checked(self, rows: list[dict]) -> list[dict]:
        """Log (once) the active schedules whose due time cannot be indexed (out of range)."""
        for r in rows:
            if r["next_run_at"] is None and r.get("active", True) and r["id"] not in self.unindexable:
                self.unindexable.add(r["id"])
                POISON.labels("relay").inc()
                log.error("schedule %s is due at a time outside [1970-01-01, 9999-01-01) (stored before "
                          "create_schedule checked it): left out of the index until update_schedule fixes it",
                          r["id"])
        return rows


class Cleanup:
    """Deletes executions past retention (``purge_executions``) in batches."""

    name = "schedules-cleanup"
    series = (PURGED,)

    def __init__(self, dsn: str, *, interval: float = 60.0, batch: int = 10000):
        self.dsn, self.interval, self.batch = dsn, interval, batch
        self.deleted = 0

    def fresh(self) -> "Cleanup":
        """A new cleanup with these settings (run_daemons' restart)."""
        return Cleanup(self.dsn, interval=self.interval, batch=self.batch)

    def run(self, stop: threading.Event) -> None:
        outage = Outage("schedules cleanup", log)
        db = Database.for_daemon(self.dsn, name=self.name, max_size=1)
        try:
            while not stop.is_set():
                try:
                    self.purge_once(db)
                    outage.ok()
                except RETRYABLE as exc:
                    stop.wait(outage.failed(exc))
                    continue
                stop.wait(self.interval)
        finally:
            db.close()

    def purge_once(self, db: Database) -> int:
        total = 0
        while True:
            n = db.call_value(sql.PURGE_EXECUTIONS, max_executions=self.batch) or 0
            total += n
            if n < self.batch:
                break
        if total:
            log.info("deleted %d schedule executions past retention", total)
            PURGED.inc(total)
        self.deleted += total
        return total
