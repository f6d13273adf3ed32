"""The root of every command line: ``pyscheduler`` (pyscheduler.cli) and ``python -m
pyscheduler.<capability>`` (one capability's commands without loading the others) run under
the same root group, so they set up logging alike and print pyscheduler's errors alike: one
line, no traceback."""

from __future__ import annotations

import importlib
import logging
import sys
import warnings

import click

from . import __version__
from .config import option
from .errors import InvalidArgument, SchedulerError


class LazyGroup(click.Group):
    """A group whose commands may be named before they are loaded: ``lazy(name, "module:attr")``
    imports the module when the command is run (or listed by --help), so that ``pyscheduler
    migrate`` loads neither the relay, the schedules' Redis client nor the benches (0.7 s of
    imports before, 0.25 s after)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._lazy: dict[str, str] = {}

    def lazy(self, name: str, target: str) -> None:
        self._lazy[name] = target

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.pop(cmd_name, None)
        if target is not None:
            module, attr = target.split(":")
            self.add_command(getattr(importlib.import_module(module), attr), cmd_name)
        return super().get_command(ctx, cmd_name)


class Main(LazyGroup):
    """Turns pyscheduler's own errors into one line on stderr and exit code 1; 2 for a value the
    database refused as invalid (InvalidArgument: a bad flag value it is the judge of, such as
    a cron expression, a run_at before 1970 or a check job that does not exist), as for the
    values click refuses."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SchedulerError as exc:
            click.echo(f"error: {exc}", err=True)
            if getattr(exc, "hint", None):
                click.echo(f"hint: {exc.hint}", err=True)
            ctx.exit(2 if isinstance(exc, InvalidArgument) else 1)


def root(help: str) -> click.Group:
    """A root group: --version, --log-level (PYSCHEDULER_LOG_LEVEL), errors as Main prints them."""

    @click.group(cls=Main, help=help, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="pyscheduler")
    @option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                                              case_sensitive=False))
    def group(log_level: str) -> None:
        logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        warnings.filterwarnings("ignore", module="platformdirs")

    return group


def run_alone(capability: click.Group) -> None:
    """``python -m pyscheduler.<capability> ARGS`` runs ``pyscheduler <capability> ARGS`` with only
    that capability's commands loaded."""
    top = root(capability.help or "")
    top.add_command(capability)
    top.main([capability.name, *sys.argv[1:]], prog_name="pyscheduler")
