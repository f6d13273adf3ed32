"""Minimal reproduction: a consumer tailing the embedded broker (tansu) can skip acknowledged
messages while several producers write the same partitions (docs/operations.md).

    python -m pyscheduler.bench.tansu_tail_repro [--runs 4] [--producers 3] [--partitions 6] [--rate 6000]

No pyscheduler code involved: producers write round-robin and wait for every acknowledgement
while one consumer tails the topic (assign); per run, how many acknowledged messages the tail
never saw although a fresh read finds them.
"""

from __future__ import annotations

import tempfile
import threading
import time
import uuid
from pathlib import Path

import click
from confluent_kafka import Producer

from .. import embedded
from ..delay.output import OutputReader, fresh_read


def one_run(bootstrap: str, producers: int, partitions: int, rate: int, duration: float) -> tuple[int, int, int]:
    topic = f"repro-{uuid.uuid4().hex[:8]}"
    embedded.create_topics(bootstrap, [topic], partitions=partitions)
    tail: set[bytes] = set()
    stop = threading.Event()
    reader = OutputReader(bootstrap, topic)

    def tailing() -> None:
        while not stop.is_set():
            tail.update(m.value() for m in reader.consumer.consume(10000, 0.2) if m.error() is None)

    acked: list[bytes] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})

        def done(err, msg) -> None:
            if err is None:
                with lock:
                    acked.append(msg.value())

        total, start, sent = int(rate / producers * duration), time.time(), 0
        while sent < total:
            due = min(total, int((time.time() - start) * rate / producers) + 1)
            for i in range(sent, due):
                while True:
                    try:
                        p.produce(topic, value=f"{n}-{i}".encode(), partition=(i + n) % partitions, on_delivery=done)
                        break
                    except BufferError:  # the local queue is full: serve delivery reports first
                        p.poll(0.05)
            sent = due
            p.poll(0)
            time.sleep(0.002)
        p.flush(30)

    t = threading.Thread(target=tailing, daemon=True)
    t.start()
    workers = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    end = time.monotonic() + 20
    while time.monotonic() < end and not set(acked) <= tail:
        time.sleep(0.2)
    stop.set()
    t.join(5)
    reader.close()
    fresh = {m.value() for m in fresh_read(bootstrap, topic, len(acked), idle=2.0, timeout=60)}
    return len(acked), len(set(acked) - tail), len(set(acked) - fresh)


@click.command()
@click.option("--runs", default=4, show_default=True)
@click.option("--producers", default=3, show_default=True)
@click.option("--partitions", default=6, show_default=True)
@click.option("--rate", default=6000, show_default=True, help="Messages per second, all producers together.")
@click.option("--duration", default=30.0, show_default=True)
def main(runs, producers, partitions, rate, duration) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = embedded.Kafka(Path(tmp)).start()
        try:
            for r in range(1, runs + 1):
                acked, tail_missed, fresh_missed = one_run(broker.bootstrap, producers, partitions, rate, duration)
                click.echo(f"run {r}: {acked} acknowledged; the tailing consumer never saw {tail_missed}; "
                           f"a fresh read misses {fresh_missed}")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
