"""``pyscheduler bench peers``: pyscheduler side by side with the PostgreSQL job queues users
already know, and its delay relay side by side with a naive one, in one command.

Starts one private PostgreSQL (pyscheduler.embedded) unless --dsn is given and,
for the delay part, a tansu broker unless --bootstrap-servers is given. Prints
each run as it ends, then writes the tables into docs/benchmarks.md (between
marker comments) and PNG charts into docs/img/.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import click

from ...config import bootstrap_option, dsn_option
from . import delay as delay_part
from . import flow as flow_part
from . import report
from . import tasks as tasks_part

ROOT = Path(__file__).resolve().parents[3]
FULL = {"jobs": 100_000, "rounds": 3, "samples": 30, "max_work_seconds": 20.0, "loads": "1000,10000",
        "delay_duration": 6.0, "min_delay": 1.0, "max_delay": 5.0, "enqueue_jobs": 50_000, "single_jobs": 3000,
        "e2e_rates": "1000,50%", "e2e_seconds": 10.0, "e2e_backlog": 5000}
QUICK = {"jobs": 2000, "rounds": 1, "samples": 10, "max_work_seconds": 20.0, "loads": "500",
         "delay_duration": 4.0, "min_delay": 0.5, "max_delay": 1.5, "enqueue_jobs": 5000, "single_jobs": 300,
         "e2e_rates": "50%", "e2e_seconds": 2.0, "e2e_backlog": 2000}


@contextlib.contextmanager
def _servers(dsn: str | None, bootstrap: str | None, need_broker: bool, echo):
    from ... import embedded

    with tempfile.TemporaryDirectory(prefix="pyscheduler-peers-") as tmp, contextlib.ExitStack() as stack:
        what = "the PostgreSQL at --dsn"
        if not dsn:
            pg = embedded.Postgres(Path(tmp) / "pg").start()
            stack.callback(pg.stop)
            dsn, what = pg.dsn(), "one embedded PostgreSQL"
        if need_broker and not bootstrap:
            broker = embedded.Kafka(Path(tmp) / "kafka").start()
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        echo(f"servers: {what}" + (f", broker {bootstrap}" if need_broker else ""))
        yield dsn, bootstrap, what


def _context(dsn: str, what: str, note: str | None) -> str:
    import os

    import psycopg

    with psycopg.connect(dsn) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("node") else "none"
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    settings = " (default settings)" if what.startswith("one embedded") else ""
    return (f"{when}; {what} {version.split()[0]}{settings}, Node.js {node}, "
            f"{os.cpu_count()} cores" + (f"; {note}" if note else "") + ".")


def _command(ctx: click.Context) -> str:
    """The command as given, without server addresses or output paths."""
    skip = {"dsn", "kafka_bootstrap", "markdown", "img_dir", "note"}
    parts = ["pyscheduler bench peers"]
    for param in ctx.command.params:
        if param.name in skip or ctx.get_parameter_source(param.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[param.name]
        flag = param.opts[0]
        if isinstance(value, bool):
            parts.append(flag if value else (param.secondary_opts or [flag])[0])
        elif isinstance(value, tuple):
            parts += [f"{flag} {v}" for v in value]
        else:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


@click.command("peers")
@dsn_option
@bootstrap_option
@click.option("--quick", is_flag=True,
              help=f"A check that runs in under 2 minutes: {QUICK['jobs']:,} jobs, 1 round, "
                   f"one load of {QUICK['loads']} msg/s for {QUICK['delay_duration']:g} s (explicit options win).")
@click.option("--jobs", type=click.IntRange(1), default=None,
              help=f"No-op jobs per system and round  [default: {FULL['jobs']:,}]")
@click.option("--concurrency", type=click.IntRange(1), default=10, show_default=True,
              help="Jobs in flight per system (Worker capacity, graphile-worker and procrastinate concurrency, "
                   "pg-boss pollers).")
@click.option("--rounds", type=click.IntRange(1), default=None,
              help=f"Rounds; systems alternate  [default: {FULL['rounds']}]")
@click.option("--samples", type=click.IntRange(1), default=None,
              help=f"Enqueue-to-start latency samples per system and round  [default: {FULL['samples']}]")
@click.option("--gap-ms", type=click.FloatRange(0), default=20.0, show_default=True,
              help="Pause between latency samples.")
@click.option("--max-work-seconds", type=click.FloatRange(1), default=None,
              help=f"Cap on one system's work phase, seconds  [default: {FULL['max_work_seconds']:g}]")
@click.option("--system", "only", multiple=True, type=click.Choice([s.key for s in tasks_part.SYSTEMS]),
              help="Run only these systems (repeatable). Default: all.")
@click.option("--scenario", "scenarios", multiple=True, type=click.Choice(list(tasks_part.SCENARIOS)),
              help="Job-queue runs (repeatable): noop (every system), fail (10 % of jobs fail once and retry) "
                   "and delay (50 % delayed 1 s), these two for pyscheduler and graphile-worker. Default: all.")
@click.option("--loads", default=None,
              help=f"Delay part: offered loads in msg/s, comma-separated  [default: {FULL['loads']}]")
@click.option("--delay-duration", type=click.FloatRange(1), default=None,
              help=f"Delay part: seconds of producing per run  [default: {FULL['delay_duration']:g}]")
@click.option("--min-delay", type=float, default=None,
              help=f"Shortest delay, seconds  [default: {FULL['min_delay']:g}]")
@click.option("--max-delay", type=float, default=None,
              help=f"Longest delay, seconds  [default: {FULL['max_delay']:g}]")
@click.option("--delay/--no-delay", "with_delay", default=True, show_default=True, help="Run the delay part.")
@click.option("--tasks/--no-tasks", "with_tasks", default=True, show_default=True, help="Run the job-queue part.")
@click.option("--flow/--no-flow", "with_flow", default=True, show_default=True,
              help="Run the enqueue and end-to-end sections (pyscheduler, pgqueuer, graphile-worker).")
@click.option("--enqueue-jobs", type=click.IntRange(1000), default=None,
              help=f"Enqueue section: jobs submitted 1,000 per call  [default: {FULL['enqueue_jobs']:,}]")
@click.option("--single-jobs", type=click.IntRange(1), default=None,
              help=f"Enqueue section: calls of one job  [default: {FULL['single_jobs']:,}]")
@click.option("--enqueue/--no-enqueue", "with_enqueue", default=True, show_default=True,
              help="Run the enqueue section (with --flow).")
@click.option("--e2e-backlog", type=click.IntRange(0), default=None,
              help="Capacity section: the producer submits as fast as it goes while fewer than this many jobs wait "
                   f"to start; 0: no capacity runs  [default: {FULL['e2e_backlog']:,}]")
@click.option("--e2e-rates", default=None,
              help="End-to-end section: offered loads in jobs/s, or N% of pyscheduler's measured capacity, "
                   f"comma-separated  [default: {FULL['e2e_rates']}]")
@click.option("--e2e-seconds", type=click.FloatRange(2), default=None,
              help="Capacity and end-to-end sections: seconds of producing per run (a capacity run's rate is "
                   f"counted after its first second)  [default: {FULL['e2e_seconds']:g}]")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), default=ROOT / "docs" / "benchmarks.md",
              show_default="docs/benchmarks.md", help="Markdown file whose peers section is replaced.")
@click.option("--img-dir", type=click.Path(file_okay=False, path_type=Path), default=ROOT / "docs" / "img",
              show_default="docs/img", help="Where the PNG charts go.")
@click.option("--note", default=None, help="Said about the run in the markdown, e.g. 'measured on a busy machine'.")
@click.pass_context
def bench(ctx, dsn, kafka_bootstrap, quick, jobs, concurrency, rounds, samples, gap_ms, max_work_seconds, only,
          scenarios, loads, delay_duration, min_delay, max_delay, with_delay, with_tasks, with_flow, enqueue_jobs,
          single_jobs, with_enqueue, e2e_backlog, e2e_rates, e2e_seconds, markdown, img_dir, note) -> None:
    """pyscheduler side by side with procrastinate, graphile-worker and pg-boss (no-op jobs, same
    concurrency, same server), and its delay relay side by side with a naive one."""
    echo = click.echo
    defaults = QUICK if quick else FULL
    given = dict(jobs=jobs, rounds=rounds, samples=samples, max_work_seconds=max_work_seconds, loads=loads,
                 delay_duration=delay_duration, min_delay=min_delay, max_delay=max_delay, enqueue_jobs=enqueue_jobs,
                 single_jobs=single_jobs, e2e_rates=e2e_rates, e2e_seconds=e2e_seconds, e2e_backlog=e2e_backlog)
    o = {k: (v if v is not None else defaults[k]) for k, v in given.items()}
    try:
        load_rates = [int(x) for x in str(o["loads"]).split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of msg/s: {o['loads']!r}", param_hint="--loads") from None
    try:
        flow_rates = flow_part.parse_rates(str(o["e2e_rates"]))
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of jobs/s or N%: {o['e2e_rates']!r}",
                                 param_hint="--e2e-rates") from None
    if not 0 <= o["min_delay"] <= o["max_delay"]:
        raise click.BadParameter("need 0 <= --min-delay <= --max-delay", param_hint="--min-delay")

    scenarios = tuple(sc for sc in tasks_part.SCENARIOS if not scenarios or sc in scenarios)
    wanted = [s for s in tasks_part.SYSTEMS
              if (not only or s.key in only) and with_tasks and s.scenarios & set(scenarios)]
    skipped = {s.name: why for s in wanted if (why := s.missing())}
    systems = [s for s in wanted if s.name not in skipped]
    for name, why in skipped.items():
        echo(f"{name}: skipped, {why}")
    if any(s.argv()[0] == "node" for s in systems):
        tasks_part.ensure_node_modules(echo)
    started = time.monotonic()
    params = tasks_part.Params(jobs=o["jobs"], concurrency=concurrency, samples=o["samples"], gap_ms=gap_ms,
                               max_seconds=o["max_work_seconds"])
    flow_systems = []
    for f in flow_part.SYSTEMS if with_flow else []:
        if why := f.missing():
            echo(f"{f.key}: skipped, {why}")
        else:
            flow_systems.append(f)
    if any(f.argv()[0] == "node" for f in flow_systems):
        tasks_part.ensure_node_modules(echo)
    with _servers(dsn, kafka_bootstrap, with_delay and bool(load_rates), echo) as (dsn, bootstrap, what):
        context = _context(dsn, what, note)
        if flow_systems:
            flow_started = time.monotonic()
            flow = flow_part.run_rounds(dsn, flow_systems, o["rounds"], echo, bulk_jobs=o["enqueue_jobs"],
                                        single_jobs=o["single_jobs"], rates=flow_rates, seconds=o["e2e_seconds"],
                                        concurrency=concurrency, backlog=o["e2e_backlog"], enqueue=with_enqueue)
            flow_chart = flow_part.chart(img_dir / flow_part.CHART, flow, bulk_jobs=o["enqueue_jobs"])
            flow_section = flow_part.markdown(flow, command=_command(ctx), context=context,
                                              bulk_jobs=o["enqueue_jobs"], single_jobs=o["single_jobs"],
                                              seconds=o["e2e_seconds"], concurrency=concurrency, rounds=o["rounds"],
                                              elapsed=time.monotonic() - flow_started, backlog=o["e2e_backlog"],
                                              chart=Path(os.path.relpath(flow_chart, markdown.parent)).as_posix())
            flow_part.write_markdown(markdown, flow_section)
            echo(flow_section)
        runs = tasks_part.run_rounds(dsn, systems, params, o["rounds"], echo, scenarios) if systems else {}
        results = runs.get("noop", {})
        loads_run = [delay_part.Load(rate, o["delay_duration"], o["min_delay"], o["max_delay"])
                     for rate in load_rates] if with_delay else []
        delays = delay_part.run_loads(dsn, bootstrap, loads_run, o["rounds"], echo)
    delay_note = (f"Offered loads {', '.join(f'{r:,}' for r in load_rates)} msg/s for {o['delay_duration']:g} s "
                  f"each, {o['rounds']} round{'s' if o['rounds'] != 1 else ''} (which relay goes first alternates), "
                  f"delays uniform {o['min_delay']:g}–{o['max_delay']:g} s, {delay_part.PARTITIONS} input "
                  "partitions, one relay process each: the pyscheduler relay (`pyscheduler delay run`, defaults: "
                  "50 ms timing advance, batches of 2,000) and the naive baseline "
                  "(`python -m pyscheduler.bench.peers.naive_relay`). Jitter = output timestamp - deadline; "
                  "delivered counted by a fresh read of the output topic.")
    if not systems and not delays:
        echo(f"\nwrote {markdown} in {time.monotonic() - started:.0f} s" if flow_systems else "nothing run")
        return
    noop_systems = [s for s in systems if s.key in results]
    section = report.markdown(command=_command(ctx), context=context, systems=noop_systems, skipped=skipped,
                              results=results, delay=delays, jobs=o["jobs"], concurrency=concurrency,
                              rounds=o["rounds"], max_seconds=o["max_work_seconds"], samples=o["samples"],
                              delay_note=delay_note, charts=img_dir, doc=markdown, scenarios=runs)
    report.write_markdown(markdown, section)
    paths = report.charts(img_dir, noop_systems, results, delays)
    echo("")
    echo(section)
    echo(f"\nwrote {markdown} and {', '.join(str(p) for p in paths)} in {time.monotonic() - started:.0f} s")
