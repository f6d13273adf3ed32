"""Tracing task functions (pyscheduler/tasks/tracing.py, the ``otel`` extra): a submit's span and
the worker's run of its task are one trace, recorded with the OpenTelemetry SDK's in-memory
exporter on a tracer provider of the app's own (the global one is left alone)."""

from __future__ import annotations

import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pyscheduler.tasks import TaskApp


@pytest.fixture
def exporter():
    spans = InMemorySpanExporter()
    yield spans
    spans.shutdown()


@pytest.fixture
def provider(exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def by_name(exporter) -> dict:
    return {s.name: s for s in exporter.get_finished_spans()}


def test_the_run_of_a_task_is_a_child_of_its_submit_in_one_trace(dsn, exporter, provider):
    with TaskApp(dsn, tracer_provider=provider) as app:
        @app.task(queue="mail", name="mail.send")
        def send(to: str) -> str:
            return to

        @app.task(queue="mail", name="mail.fail", max_attempts=1)
        def fail() -> None:
            raise ConnectionError("SMTP down")

        @app.task(queue="pages", name="pages.fetch")
        async def fetch(url: str) -> int:  # on an AsyncWorker
            return len(url)

        handle = send.submit(to="a@example.com")
        doomed = fail.submit()
        page = fetch.submit(url="/a")
        assert handle.spec["trace"]["traceparent"].startswith("00-")  # W3C, stored with the task
        running = app.worker(capacity=2).start()
        try:
            assert handle.result(timeout=30) == "a@example.com"
            doomed.wait(timeout=30)
            assert page.result(timeout=30) == 2
        finally:
            running.stop()
    spans = by_name(exporter)
    submit, run = spans["submit mail.send"], spans["run mail.send"]
    assert run.context.trace_id == submit.context.trace_id and run.parent.span_id == submit.context.span_id
    assert (submit.kind, run.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER)
    assert submit.attributes["pyscheduler.task.rn"] == str(handle.rn)
    assert dict(run.attributes) == {"pyscheduler.task.rn": str(handle.rn), "pyscheduler.task.queue": "mail",
                                    "pyscheduler.task.name": "mail.send", "pyscheduler.task.attempt": 1}
    failed = spans["run mail.fail"]
    assert failed.parent.span_id == spans["submit mail.fail"].context.span_id
    assert failed.status.status_code == StatusCode.ERROR and "SMTP down" in failed.status.description
    assert [e.name for e in failed.events] == ["exception"]
    assert run.status.status_code == StatusCode.UNSET
    assert spans["run pages.fetch"].parent.span_id == spans["submit pages.fetch"].context.span_id


def test_a_task_without_a_trace_context_starts_one_and_submit_many_shares_its_span(dsn, exporter, provider):
    with TaskApp(dsn, tracer_provider=provider) as app:
        @app.task(queue="q", name="q.job")
        def job(n: int) -> int:
            return n

        with psycopg.connect(dsn, autocommit=True) as psql:  # psql, or a schedule's firing
            psql.execute("SELECT pyscheduler.submit_task(queue => 'q', spec => '{\"task\": \"q.job\", "
                         "\"args\": {\"n\": 1}}')")
        many = job.submit_many([{"n": 2}, {"n": 3}])
        assert [d.result for d in app.drain()] == [1, 2, 3]
    spans = exporter.get_finished_spans()
    runs = [s for s in spans if s.name == "run q.job"]
    (submit,) = [s for s in spans if s.name == "submit q.job"]
    assert runs[0].parent is None  # a trace of its own
    assert [r.parent.span_id for r in runs[1:]] == [submit.context.span_id] * 2
    assert list(submit.attributes["pyscheduler.task.rn"]) == [str(h.rn) for h in many]


def test_without_a_tracer_provider_nothing_is_traced(dsn):
    with TaskApp(dsn) as app:  # the global provider is the API's default: no spans
        @app.task(queue="q", name="q.job")
        def job() -> None:
            pass

        assert app.tracer is None and "trace" not in job.submit().spec
