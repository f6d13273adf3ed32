"""pyscheduler's commands as a user or an operator runs them: a clean environment, a child's
output to wait on, a command serving its HTTP endpoint, and a check job that fires every second."""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import wait_for


def clean_env():
    """The environment of a new user: no pyscheduler configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYSCHEDULER_")}


class Output:
    """A child's stdout, read in a thread, that a test can wait on line by line."""

    def __init__(self, proc):
        self.proc, self.lines, self.done = proc, [], threading.Event()
        self.changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.done.set()
            self.changed.notify_all()

    def wait_for(self, pattern, timeout=120.0) -> str:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not any(re.search(pattern, line) for line in self.lines):
                left = deadline - time.monotonic()
                if self.done.is_set() or left <= 0:
                    self.proc.kill()
                    raise AssertionError(f"{pattern!r} not seen:\n{self.text()}\n{self.proc.stderr.read()}")
                self.changed.wait(left)
            return self.text()

    def text(self) -> str:
        return "".join(self.lines)


def get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def samples(text: str) -> dict[str, float]:
    """Prometheus text -> {'name{label="v",...}': value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


class Process:
    """A pyscheduler command with --http-port 0; its log in a file; the port it serves on."""

    def __init__(self, log: Path, *args: str, env: dict | None = None, max_files: int | None = None):
        self.log = log

        def limit_files() -> None:  # in the child: RLIMIT_NOFILE, soft and hard
            resource.setrlimit(resource.RLIMIT_NOFILE, (max_files, max_files))

        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "pyscheduler", *args, "--http-port", "0"],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                                         preexec_fn=limit_files if max_files else None)
        self.url = wait_for(self._url, timeout=60, interval=0.05)

    def _url(self) -> str | None:
        assert self.proc.poll() is None, f"exited:\n{self.text()[-3000:]}"
        m = re.search(r"HTTP on (http://\S+?)/ ", self.text())
        return m.group(1) if m else None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        return get(self.url + path)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


# a future check job that records each run and comes back a second later (the restart walk,
# the outages)
WALK_JOB = """
CREATE TABLE public.walk_runs (slot timestamptz NOT NULL, ran timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION public.walk_job(c pyscheduler.future_check) RETURNS timestamptz
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO public.walk_runs (slot) VALUES (c.next_check_at);
    -- the next second; a run late by more than a second (a catch-up after a restart on a
    -- loaded machine) goes on from now: a time already past would end the check ('past')
    RETURN CASE WHEN c.next_check_at + interval '1 second' > now() THEN c.next_check_at + interval '1 second'
                ELSE now() + interval '1 second' END;
END $$;
"""
