"""The asyncio flavour of the worker library: handlers written with ``async def``.

``AsyncWorker`` has the same semantics as ``Worker`` (leases, the local queue
with prefetch, batched heartbeats and completions, cancellation, yield on stop,
history, tokens): the database side runs in the same threads as ``Worker``'s;
only the handlers run as coroutines, at most ``capacity`` at once, in an event
loop: yours (``await worker.run_async(stop)``) or one of its own (``run(stop)``,
the daemon contract, e.g. in ``pyscheduler run``).

    async def handle(ctx: AsyncTaskContext) -> None:
        for i, item in enumerate(ctx.spec["items"]):
            if ctx.stopping.is_set():
                return                       # unfinished: yielded (see Worker)
            await process(item)
            ctx.progress((i + 1) / len(ctx.spec["items"]))

    await AsyncWorker(dsn, "orders", handle, capacity=100).run_async(stop_event)

``ctx.cancelled`` and ``ctx.stopping`` are set from the worker's threads and
can be awaited: ``await ctx.stopping.wait()`` (or ``wait(timeout)``, True
when set). A handler that blocks the event loop blocks every other handler
of the worker: run blocking work with ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from ..calls import json_value
from ..db import AsyncSession
from .worker import _FULL, _SLOW, TaskContext, Worker, poke_on

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
            "complete_task", rn=uuid.UUID(self.rn), token=uuid.UUID(str(self.token)),
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
        poke_on(self._halt, _LoopSetter(loop, halted))
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

    def _queued(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            loop.call_soon_threadsafe(wake.set)

    async def _consume(self) -> None:
        """One handler slot: run tasks from the local queue until it closes."""
        ctx = await self._next(None)
        counted, clock = self._counted, time.perf_counter
        while ctx is not None:
            began = clock() if counted is not None else 0.0
            try:
                function, args = self._returned(ctx, await self.handler(ctx))  # type: ignore[misc]
            except asyncio.CancelledError as exc:
                if _being_cancelled():
                    if ctx.reason is None:
                        raise  # this slot is cancelled (the worker stops): not the handler's outcome
                    function, args = "complete_task", {}  # cancelled after being told to stop: settled below
                else:  # the handler's own CancelledError (a future it awaited was cancelled): a failure
                    function, args = self._failed(ctx, exc)
            except BaseException as exc:  # noqa: BLE001 - any exception a handler raises is its failure
                function, args = self._failed(ctx, exc)
            if counted is not None:
                counted.took.append(clock() - began)
            if function is None:  # completed in the application's transaction: nothing to record
                self._release(ctx)
                ctx = await self._next(ctx)
                continue
            if function == "complete_task":
                while (following := self._take(ctx, block=False, complete=True)) is _FULL:
                    await asyncio.sleep(0.005)  # back-pressure: the completer is behind
                if following is not _SLOW:
                    ctx = following if following is not None else await self._next(None)
                    continue
            await self._outcome_async(ctx, function, args)
            ctx = await self._next(ctx)

    async def _next(self, finished: TaskContext | None) -> TaskContext | None:
        """The next task to start; None once the local queue is closed."""
        assert self._wake is not None
        ctx = self._take(finished, block=False)
        while ctx is None and not self._closed:
            self._wake.clear()
            ctx = self._take(None, block=False)  # pushed before the clear: not missed
            if ctx is None and not self._closed:
                await self._wake.wait()
                ctx = self._take(None, block=False)
        return ctx

    async def _outcome_async(self, ctx: TaskContext, function: str, args: dict[str, Any]) -> None:
        """Worker._outcome without blocking the event loop."""
        queued = False
        try:
            settled = self._settle(ctx, function)
            if settled in ("complete_task", "fail_task"):
                while True:
                    with self._lock:
                        queued = self._batch(ctx, settled, args, block=False)
                    if queued:
                        break
                    await asyncio.sleep(0.005)  # back-pressure: the completer is behind
            elif settled is not None:
                await asyncio.to_thread(self._record, ctx, settled, args)
        except Exception:  # never silently, and never kill the slot
            log.exception("task %s: recording the outcome failed", ctx.rn)
        finally:
            if not queued:
                self._release(ctx)


def _being_cancelled() -> bool:
    """Whether the running asyncio task was asked to cancel (task.cancel()), as opposed to a
    CancelledError raised inside it by something it awaited."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _LoopSetter:
    """Sets an asyncio event from a thread when poked (poke_on)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event):
        self.loop, self.event = loop, event

    def poke(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)
