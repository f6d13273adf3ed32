"""OpenTelemetry for task functions (the ``otel`` extra; without it, or without a tracer provider,
nothing happens): ``submit`` runs in a span "submit <name>" whose W3C trace context goes in the
spec (``"trace": {"traceparent": ...}``), and a worker runs the task in a span "run <name>", its
child (a task without one, fired by a schedule or submitted by psql, starts a trace), with the
task's id, queue, name and attempt as attributes and its failure recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:  # the otel extra is not installed
    trace = None  # type: ignore[assignment]

TRACE = "trace"  # the spec's key of the W3C trace context (traceparent, tracestate)
_global: tuple[Any, Any] = (None, None)  # (the global tracer provider, its tracer), cached


def tracer(provider: Any = None) -> Any:
    """The tracer of ``provider`` (a ``TaskApp``'s ``tracer_provider``), else of the global
    tracer provider once one is set; None: no spans."""
    global _global
    if provider is not None:
        return provider.get_tracer(__name__)
    if trace is None:
        return None
    current = trace.get_tracer_provider()
    if current is not _global[0]:
        real = not isinstance(current, (ProxyTracerProvider, NoOpTracerProvider))
        _global = (current, current.get_tracer(__name__) if real else None)
    return _global[1]


@contextlib.contextmanager
def submitting(tracer: Any, name: str, queue: str, specs: list[dict[str, Any]]) -> Iterator[Any]:
    """A span of ``tracer`` around submitting ``specs``, its context stored in each; yields the
    span (None without a tracer): ``submitted(span, rns)`` names the tasks."""
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(f"submit {name}", kind=SpanKind.PRODUCER,
                                      attributes={"pyscheduler.task.name": name,
                                                  "pyscheduler.task.queue": queue}) as span:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        for spec in specs:
            spec[TRACE] = carrier
        yield span


def submitted(span: Any, rns: list[Any]) -> None:
    if span is not None:
        span.set_attribute("pyscheduler.task.rn", [str(rn) for rn in rns] if len(rns) > 1 else str(rns[0]))


@contextlib.contextmanager
def running(tracer: Any, ctx: Any, name: str) -> Iterator[None]:
    """A span of ``tracer`` around running task ``ctx`` (a TaskContext), child of the submit's
    when its spec carries that context; an exception (but Snooze and Suspended: no failure)
    is recorded."""
    from .worker import Snooze, Suspended

    carrier = ctx.spec.get(TRACE)
    parent = propagate.extract(carrier) if isinstance(carrier, dict) else None
    with tracer.start_as_current_span(
            f"run {name}", context=parent, kind=SpanKind.CONSUMER, record_exception=False,
            set_status_on_exception=False,
            attributes={"pyscheduler.task.rn": str(ctx.rn), "pyscheduler.task.queue": ctx.queue,
                        "pyscheduler.task.name": name, "pyscheduler.task.attempt": ctx.attempt}) as span:
        try:
            yield
        except (Snooze, Suspended):
            raise
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
