"""The asyncio flavour of the worker library: ``AsyncWorker`` runs ``async def`` handlers, at most
``capacity`` at once, in an event loop: yours (``await worker.run_async(stop)``) or one of its own
(``run(stop)``, the daemon contract). Leasing, heartbeats and recording run in ``Worker``'s
threads; ``ctx.cancelled`` and ``ctx.stopping`` can be awaited (docs/python-api.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..calls import json_value
from ..db import AsyncSession, poke_on
from . import sqlapi as sql
from .worker import TaskContext, Worker
from .worker.localqueue import Taken
from .worker.outcomes import raised, returned

log = logging.getLogger(__name__)


class LoopEvent:
    """An event set from any thread and awaited in one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._set = False
        self._event: asyncio.Event | None = None  # made in the loop, on the first wait

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Until set (True), or ``timeout`` seconds passed (False)."""
        if self._set:
            return True
        if self._event is None:
            self._event = asyncio.Event()
            if self._set:  # set meanwhile, before the event existed
                return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return self._set
        return True


class AsyncTaskContext(TaskContext):
    """A TaskContext whose ``cancelled`` and ``stopping`` can be awaited (LoopEvent)."""

    loop: asyncio.AbstractEventLoop

    def _event(self) -> Any:
        return LoopEvent(self.loop)

    async def complete_in(self, conn: Any, *, result: Any = None) -> None:
        """``ctx.complete(conn=...)`` on the application's psycopg ``AsyncConnection`` (or
        ``AsyncCursor``), inside its transaction: raises if the lease was lost, and the
        application rolls back; the worker records nothing more for the task."""
        self.completed = True
        await AsyncSession.borrow(conn).call_binary(
            sql.COMPLETE_TASK, rn=uuid.UUID(self.rn), token=uuid.UUID(str(self.token)),
            result=None if result is None else json_value("result", result))
        self.completed_outside = True


AsyncHandler = Callable[[AsyncTaskContext], Awaitable[Any]]


class AsyncWorker(Worker):
    """``Worker`` for ``async def`` handlers (same arguments; see the module doc)."""

    def __init__(self, dsn: str, queue: str, handler: AsyncHandler, **kwargs: Any):
        super().__init__(dsn, queue, handler, **kwargs)  # type: ignore[arg-type]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    def run(self, stop: threading.Event) -> None:
        """The daemon contract: run in an event loop of its own until ``stop``."""
        asyncio.run(self._serve(stop))

    async def run_async(self, stop: asyncio.Event | None = None) -> None:
        """Run in the calling event loop until ``stop`` is set (or the task is cancelled)."""
        threaded = threading.Event()
        waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if waiter is not None:
            waiter.add_done_callback(lambda _: threaded.set())
        try:
            await self._serve(threaded)
        except asyncio.CancelledError:
            threaded.set()
            raise
        finally:
            if waiter is not None:
                waiter.cancel()

    async def _serve(self, stop: threading.Event) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        halted = asyncio.Event()
        self.context_class = type("BoundAsyncTaskContext", (AsyncTaskContext,), {"loop": loop})
        try:
            begun = await asyncio.to_thread(self._begin, stop)
        except asyncio.CancelledError:
            stop.set()
            raise
        if not begun:
            return
        poke_on(self._halt, lambda: loop.call_soon_threadsafe(halted.set))
        try:
            consumers = [asyncio.ensure_future(self._consume()) for _ in range(self.capacity)]
            try:
                await halted.wait()
            except asyncio.CancelledError:
                stop.set()
                self._halt.set()
            await asyncio.to_thread(self._give_back)
            if self.yield_on_stop:
                # handed back and told to stop: give them a moment, then cancel
                _, pending = await asyncio.wait(consumers, timeout=self.timeout.total_seconds())
                for task in pending:
                    task.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
        finally:
            await asyncio.to_thread(self._end)

    def on_queued(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    async def _consume(self) -> None:
        """One handler slot: run tasks from the local queue until it closes."""
        ctx = await self._next(None)
        take, recorder, counted, clock = self.local.take, self.recorder, self._counted, time.perf_counter
        while ctx is not None:
            began = clock() if counted is not None else 0.0
            try:
                function, args = returned(ctx, await self.handler(ctx), counted)
            except asyncio.CancelledError as exc:
                if _being_cancelled():
                    if ctx.reason is None:
                        raise  # this slot is cancelled (the worker stops): not the handler's outcome
                    function, args = sql.COMPLETE_TASK, {}  # cancelled after being told to stop: settled below
                else:  # the handler's own CancelledError (a future it awaited was cancelled): a failure
                    function, args = raised(ctx, exc, counted)
            except BaseException as exc:  # noqa: BLE001 - any exception a handler raises is its failure
                function, args = raised(ctx, exc, counted)
            if counted is not None:
                counted.took.append(clock() - began)
            if function is None:  # completed in the application's transaction: nothing to record
                recorder.release(ctx)
                ctx = await self._next(ctx)
                continue
            if function is sql.COMPLETE_TASK:
                while (following := take(ctx, False, True)) is Taken.FULL:
                    await asyncio.sleep(0.005)  # back-pressure: the recorder is behind
                if following is not Taken.SETTLE:
                    ctx = following if following is not None else await self._next(None)
                    continue
            await self._outcome_async(ctx, function, args)
            ctx = await self._next(ctx)

    async def _next(self, finished: TaskContext | None) -> TaskContext | None:
        """The next task to start; None once the local queue is closed."""
        assert self._wake is not None
        local = self.local
        ctx = local.take(finished, False)
        while ctx is None and not local.closed:
            self._wake.clear()
            ctx = local.take(None, False)  # pushed before the clear: not missed
            if ctx is None and not local.closed:
                await self._wake.wait()
                ctx = local.take(None, False)
        return ctx

    async def _outcome_async(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Recorder.outcome without blocking the event loop."""
        recorder, queued = self.recorder, False
        try:
            settled = recorder.settle(ctx, function)
            if settled is sql.COMPLETE_TASK or settled is sql.FAIL_TASK:
                while True:
                    with self._lock:
                        queued = recorder.queue(ctx, settled, args, block=False)
                    if queued:
                        break
                    await asyncio.sleep(0.005)  # back-pressure: the recorder is behind
            elif settled is not None:
                await asyncio.to_thread(recorder.record, ctx, settled, args)
        except Exception:  # never silently, and never kill the slot
            log.exception("task %s: recording the outcome failed", ctx.rn)
        finally:
            if not queued:
                recorder.release(ctx)


def _being_cancelled() -> bool:
    """Whether the running asyncio task was asked to cancel (task.cancel()), as opposed to a
    CancelledError raised inside it by something it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
