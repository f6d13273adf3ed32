"""The durable task functions of tests/tasks/test_durable.py, also run as a worker process of
their own (``python -m tests.support.durable DSN EFFECTS``) for the test that SIGKILLs it:
``three_steps`` appends each step's side effect to a file of ``effects`` (one line per call);
in the process, its third step blocks after saying so (file ``three-started``)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from pyscheduler.tasks import TaskApp, current_context

QUEUE = "durable"


def effect(effects: Path, name: str) -> str:
    """A step's side effect, counted: one line appended to effects/name."""
    with open(effects / name, "a") as f:
        f.write("x\n")
    return name


def count(effects: Path, name: str) -> int:
    path = effects / name
    return len(path.read_text().splitlines()) if path.exists() else 0


def build(dsn: str, effects: Path, block_at_three: bool = False) -> TaskApp:
    app = TaskApp(dsn)

    @app.task(name="three_steps", queue=QUEUE)
    def three_steps(order: int) -> list[str]:
        ctx = current_context()
        done = [ctx.step("one", effect, effects, "one"), ctx.step("two", effect, effects, "two")]
        if block_at_three:
            effect(effects, "three-started")
            time.sleep(3600)  # killed here
        return done + [ctx.step("three", effect, effects, "three")]

    return app


if __name__ == "__main__":
    build(sys.argv[1], Path(sys.argv[2]), block_at_three=True).worker(timeout=1.0).run(threading.Event())
