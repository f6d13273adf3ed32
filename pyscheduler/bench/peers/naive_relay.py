"""The naive delay relay, the baseline of ``pyscheduler bench peers``: consume the input topic
in order (all partitions from the start, ``assign()``), sleep until each message's deadline,
publish it; nothing durable, one thread for every message (docs/benchmarks.md, "Side by side
with peers"). Runs until SIGTERM or SIGINT:

    python -m pyscheduler.bench.peers.naive_relay BOOTSTRAP INPUT_TOPIC OUTPUT_TOPIC
"""

from __future__ import annotations

import sys
import threading
import time

from ...daemon import install_signal_handlers
from ...delay.message import HEADER_DEADLINE, HEADER_ID, parse_deadline


def run(bootstrap: str, input_topic: str, output_topic: str, stop: threading.Event) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "naive-relay", "enable.auto.commit": False,
                         "fetch.wait.max.ms": 20})
    meta = consumer.list_topics(input_topic, timeout=10).topics[input_topic]
    consumer.assign([TopicPartition(input_topic, p, OFFSET_BEGINNING) for p in meta.partitions])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    try:
        while not stop.is_set():
            for msg in consumer.consume(1000, 0.1):
                if msg.error() is not None:
                    continue
                headers = msg.headers() or []
                deadline = next((parse_deadline(v).timestamp() for k, v in headers if k == HEADER_DEADLINE),
                                time.time())
                wait = deadline - time.time()
                if wait > 0 and stop.wait(wait):
                    return
                producer.produce(output_topic, key=msg.key(), value=msg.value(),
                                 headers=[(k, v) for k, v in headers if k not in (HEADER_ID, HEADER_DEADLINE)])
                producer.poll(0)
    finally:
        producer.flush(10)
        consumer.close()


def main(argv: list[str]) -> None:
    stop = threading.Event()
    install_signal_handlers(stop)
    run(*argv[:3], stop)


if __name__ == "__main__":
    main(sys.argv[1:])
