"""CLI hints name CLI commands and flags, not SQL functions.

The SQL API's errors carry hints for psql users ("list_schedules() shows the
schedules there are."); a command group made with ``HintedGroup`` rewrites them
for the shell ("pyscheduler schedules list shows the schedules there are.")
before ``pyscheduler``'s main command prints them.
"""

from __future__ import annotations

from typing import Any

import click

from .errors import SchedulerError


class HintedGroup(click.Group):
    """A click group whose commands' errors have their hints rewritten: ``codes`` maps a
    SQLSTATE to the hint a shell user acts on, ``hints`` a SQL hint (or part of one) to its
    text for the shell."""

    codes: dict[str, str] = {}
    hints: dict[str, str] = {}

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SchedulerError as exc:
            exc.hint = self.codes.get(exc.sqlstate or "", exc.hint)
            for sql_text, cli_text in self.hints.items():
                if exc.hint and sql_text in exc.hint:
                    exc.hint = exc.hint.replace(sql_text, cli_text)
            raise
