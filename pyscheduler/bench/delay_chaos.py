"""Chaos run of the delay queue: relays SIGKILLed and restarted while messages flow, then a
fresh read of the output topic counts the messages lost, early (before deadline - timing
advance) and duplicated; exit code 1 when any was lost or early (docs/operations.md).

    python -m pyscheduler.bench.delay_chaos [--audit] [--duration 60] [--rate 2000] [--nodes 3]

--audit records every insert, claim, reset and delete of pyscheduler.delay_messages (a
trigger into public.delay_audit) and prints the trail of any id a reader missed. Uses
--dsn/--bootstrap-servers, else an embedded PostgreSQL and broker.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

import click
import psycopg
from confluent_kafka import Producer

from .. import migrate
from ..config import bootstrap_option, dsn_option
from ..delay.message import delayed_headers
from ..delay.output import OutputReader, fresh_read, send_warm_up
from ..embedded import create_topics
from .delay import relay_command, servers, stop_processes
from .stats import percentiles

AUDIT = """
CREATE TABLE IF NOT EXISTS public.delay_audit (
    at timestamptz NOT NULL DEFAULT clock_timestamp(), op text NOT NULL, id text NOT NULL,
    readied_by uuid, deadline timestamptz);
CREATE OR REPLACE FUNCTION public.delay_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO public.delay_audit (op, id, readied_by, deadline)
        VALUES ('insert', NEW.id, NEW.readied_by, NEW.deadline);
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO public.delay_audit (op, id, readied_by, deadline)
        VALUES ('delete', OLD.id, OLD.readied_by, OLD.deadline);
    ELSIF NEW.readied_at IS DISTINCT FROM OLD.readied_at THEN
        INSERT INTO public.delay_audit (op, id, readied_by, deadline)
        VALUES (CASE WHEN NEW.readied_at IS NULL THEN 'reset' ELSE 'claim' END, NEW.id,
                coalesce(NEW.readied_by, OLD.readied_by), NEW.deadline);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS delay_audit ON pyscheduler.delay_messages;
CREATE TRIGGER delay_audit AFTER INSERT OR UPDATE OR DELETE ON pyscheduler.delay_messages
    FOR EACH ROW EXECUTE FUNCTION public.delay_audit();
"""


@click.command()
@dsn_option
@bootstrap_option
@click.option("--duration", type=click.FloatRange(min=5), default=60, show_default=True, help="Seconds of producing.")
@click.option("--rate", type=click.IntRange(min=1), default=2000, show_default=True, help="Messages per second.")
@click.option("--nodes", type=click.IntRange(min=2), default=3, show_default=True, help="Relay processes.")
@click.option("--partitions", type=click.IntRange(min=1), default=6, show_default=True, help="Input partitions.")
@click.option("--kill-every", type=click.FloatRange(min=1), default=6, show_default=True,
              help="Seconds between SIGKILLs of a random relay (restarted at once).")
@click.option("--hold-ms", type=click.IntRange(min=1000), default=3000, show_default=True)
@click.option("--audit", is_flag=True, help="Record inserts, claims, resets and deletes of the table.")
def main(dsn, kafka_bootstrap, duration, rate, nodes, partitions, kill_every, hold_ms, audit) -> None:
    with servers(dsn, kafka_bootstrap) as (dsn, bootstrap):
        migrate.migrate(dsn)
        if audit:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(AUDIT)
                c.execute("TRUNCATE public.delay_audit")
        run = uuid.uuid4().hex[:6]
        input_topic, output_topic = f"chaos.in.{run}", f"chaos.out.{run}"
        create_topics(bootstrap, [input_topic], partitions=partitions)
        create_topics(bootstrap, [output_topic], partitions=3)
        args = ["--group-id", f"chaos-{run}", "--hold-ms", str(hold_ms), "-Xsession.timeout.ms=6000",
                "-Xheartbeat.interval.ms=1000"]

        def start() -> subprocess.Popen:
            return subprocess.Popen(relay_command(dsn, bootstrap, input_topic, output_topic, *args),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        procs = [start() for _ in range(nodes)]
        tail_ids: set[str] = set()
        stop_tail = threading.Event()
        reader = OutputReader(bootstrap, output_topic)

        def tailing() -> None:
            while not stop_tail.is_set():
                tail_ids.update(m.value().split()[0].decode() for m in reader.consumer.consume(10000, 0.2)
                                if m.error() is None)

        kills = 0
        try:
            producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
            warm = send_warm_up(producer, input_topic, partitions)
            if len(reader.messages(len(warm), 90)) < len(warm):
                raise click.ClickException("the relays did not pass the warm-up messages within 90s")
            threading.Thread(target=tailing, daemon=True).start()
            total = int(rate * duration)
            deadlines: dict[str, float] = {}
            click.echo(f"{nodes} relays, {partitions} input partitions; {rate}/s for {duration:.0f}s, deadlines "
                       f"1-4 s ahead, hold {hold_ms} ms, a random relay SIGKILLed every {kill_every:g}s ...")
            start_at = time.time()
            next_kill = start_at + kill_every
            sent = 0
            while sent < total:
                now = time.time()
                due = min(total, int((now - start_at) * rate) + 1)
                for i in range(sent, due):
                    deadline = now + random.uniform(1.0, 4.0)
                    mid = f"{run}-{i}"
                    deadlines[mid] = deadline
                    producer.produce(input_topic, value=f"{mid} {deadline:.6f}".encode(),
                                     headers=delayed_headers(mid, datetime.fromtimestamp(deadline, timezone.utc)))
                sent = due
                producer.poll(0)
                if now >= next_kill:
                    victim = random.randrange(nodes)
                    procs[victim].send_signal(signal.SIGKILL)
                    procs[victim].wait()
                    procs[victim] = start()
                    kills += 1
                    next_kill += kill_every
                time.sleep(0.002)
            assert producer.flush(30) == 0, "the input producer could not deliver everything"
            click.echo(f"produced {total} (all acknowledged), {kills} relays killed; waiting until every id is "
                       "on the output (the tailing reader, else a fresh read, says so; at most 5 minutes) ...")
            wanted = set(deadlines)
            give_up = time.monotonic() + 300
            next_fresh = time.monotonic() + 30
            while time.monotonic() < give_up and not wanted <= tail_ids:
                time.sleep(0.5)
                if time.monotonic() >= next_fresh:  # the tail may have skipped some: ask a fresh reader
                    if wanted <= {m.value().split()[0].decode() for m in fresh_read(bootstrap, output_topic, 0)}:
                        break
                    next_fresh = time.monotonic() + 15
        finally:
            stop_tail.set()
            stop_processes(procs)
            time.sleep(0.3)  # the tail thread's last consume() returns
            reader.close()
        fresh = [m for m in fresh_read(bootstrap, output_topic, total, idle=3.0, timeout=180)
                 if not m.value().startswith(b"warmup-")]
        copies: dict[str, list[float]] = {}
        for m in fresh:
            mid = m.value().split()[0].decode()
            copies.setdefault(mid, []).append(m.timestamp()[1] / 1000.0)
        lost = sorted(set(deadlines) - set(copies))
        early = sorted(mid for mid, times in copies.items() if min(times) < deadlines[mid] - 0.050 - 0.001)
        duplicates = sum(len(t) - 1 for t in copies.values())
        tail_missed = sorted(set(copies) - tail_ids)
        lags = [(min(t) - deadlines[mid]) * 1000 for mid, t in copies.items()]
        click.echo(f"fresh read: {len(copies)} of {total} ids, lost {len(lost)}, early {len(early)}, "
                   f"duplicates {duplicates}; the tailing reader missed {len(tail_missed)} that the fresh read found")
        if lags:
            click.echo("first copy - deadline (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                                   percentiles(lags, (50, 99)).items()))
        if audit and (lost or tail_missed):
            with psycopg.connect(dsn) as c:
                for mid in (lost + tail_missed)[:10]:
                    trail = c.execute("SELECT to_char(at, 'HH24:MI:SS.MS'), op, readied_by FROM public.delay_audit "
                                      "WHERE id = %s ORDER BY at", (mid,)).fetchall()
                    what = "LOST" if mid in lost else "missed by the tail"
                    steps = "; ".join(f"{t} {op} {str(n)[:8] if n else ''}" for t, op, n in trail)
                    click.echo(f"  {mid} ({what}): {steps or 'never in the table (late: published at once)'}")
        if lost or early:
            sys.exit(1)


if __name__ == "__main__":
    main()
