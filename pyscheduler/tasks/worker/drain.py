"""Draining a queue in the calling thread (tests): lease one ready task at a time, run the
worker's handler on it, record its outcome as the worker would (``returned``/``raised``, the
recorder's one-at-a-time writes), until no task is ready. No threads, no heartbeats: a handler
must finish within the worker's lease timeout."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .. import sqlapi as sql
from .context import Suspended, TaskContext
from .outcomes import raised, returned

if TYPE_CHECKING:
    from .lifecycle import Worker

Drain = Literal["completed", "failed", "aborted", "snoozed", "suspended"]
_OUTCOMES: dict[str | None, Drain] = {sql.COMPLETE_TASK: "completed", None: "completed", sql.FAIL_TASK: "failed",
                                      sql.ABORT_TASK: "aborted", sql.YIELD_TASK: "snoozed"}


@dataclass(frozen=True, slots=True)
class Drained:
    """A task a drain worked: the context it ran with, what its handler's end recorded
    (``completed``; ``failed``: the attempt failed, retried unless it was the last;
    ``aborted``; ``snoozed``; ``suspended``: a durable sleep or wait ended the lease), what the
    handler returned and what it raised."""

    ctx: TaskContext
    outcome: Drain
    result: Any = None
    error: BaseException | None = None


def drain(worker: Worker, max_tasks: int | None = None) -> list[Drained]:
    """Work the ready tasks of ``worker``'s queue in this thread, at most ``max_tasks``, in lease
    order (a task submitted meanwhile, or failed with a retry due at once, is worked too)."""
    db, recorder = worker.db, worker.recorder
    if worker.worker_id is None:
        worker.worker_id = db.call_value(sql.REGISTER_WORKER)
    done: list[Drained] = []
    while max_tasks is None or len(done) < max_tasks:
        rows = db.call_tuples(sql.LEASE_TASKS_LEAN, as_text=("uuid", "jsonb"), queue=worker.queue,
                              worker=worker.worker_id, n=1, timeout=worker.timeout, **worker.aging)
        if not rows:
            break
        rn, token, spec, priority, _seq, attempt = rows[0]
        ctx = worker.context_class._leased(rn, token, spec, priority, worker.queue, math.inf, attempt)
        ctx.started, ctx._db = True, db
        worker.held[rn] = ctx
        value, error = None, None
        try:
            value = worker.handler(ctx)
            function, args = returned(ctx, value, None)
        except (Exception, Suspended) as exc:  # noqa: BLE001 - the handler's failure (Ctrl-C ends the drain)
            error = exc
            function, args = raised(ctx, exc, None)
        if function is sql.COMPLETE_TASK:
            recorder._complete_alone([ctx])  # a result refused aborts the task, as in a batch
        else:
            if function is not None:
                recorder.record(ctx, function, args)
            recorder.release(ctx)
        done.append(Drained(ctx, "suspended" if isinstance(error, Suspended) else _OUTCOMES[function], value, error))
    return done
