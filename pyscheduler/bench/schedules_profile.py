"""``python -m pyscheduler.bench.schedules_profile OUT run ...``: ``pyscheduler schedules run``
with each Executor's main loop under cProfile (stats written to OUT at stop), for
``PYSCHEDULER_BENCH_PROFILE`` in ``pyscheduler bench schedules``."""

from __future__ import annotations

import sys


def profiled_executor(out: str) -> None:
    """The executor command with each Executor's main loop under cProfile."""
    import cProfile
    import logging
    import threading

    from ..schedules.cli import group
    from ..schedules.executor import Executor
    from ..schedules.recorder import Recorder

    def profiled(run, path):
        def wrapper(*args):
            prof = cProfile.Profile()
            try:
                prof.runcall(run, *args)
            finally:
                prof.dump_stats(path())
        return wrapper

    Executor.run = profiled(Executor.run, lambda: out)
    Recorder.run = profiled(Recorder.run, lambda: f"{out}.{threading.current_thread().name.rsplit(':', 1)[-1]}")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    group(prog_name="pyscheduler schedules")


if __name__ == "__main__":
    profiled_executor(sys.argv.pop(1))
