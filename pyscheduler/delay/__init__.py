"""The delay queue (seeds/chronos.md): a Kafka topic that adds a delay.

SQL API in sql/delay.sql (enqueue_message(s), ready_and_claim, delete_fired,
reset_stuck, next_deadline, cancel_message, views delay_queue and
delay_ready_by_node), what Python uses of it in sqlapi.py; the relay daemon in
relay.py (message.py, publisher.py); commands in cli.py; ``DelayProducer``
(producer.py) publishes to the input topic from Python.
"""

from .producer import DelayProducer, DeliveryFailed

__all__ = ["DelayProducer", "DeliveryFailed"]
