"""A schedule's Kafka target topic that does not exist: on a broker that does not
create topics on first use (docker-compose.yml's Kafka) a try fails within a second with an
error naming the topic, the occurrence ends failed after the schedule's retries, other
schedules go on, and once the topic is created the schedule fires again. The test broker
(tansu) creates topics when a producer asks it to: the executor's producer is told not to
ask (``allow.auto.create.topics=false``, which tansu honours), as a broker that does not
create them would answer; with the default settings tansu creates the topic. ``schedules
create --kafka T`` with a Kafka configured warns when T does not exist."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from pyscheduler import embedded
from pyscheduler.cli import main

from tests.support import wait_for
from tests.support.schedules import Running, count, create, executions, executor, relay


def topics(kafka: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": kafka}).list_topics(timeout=10).topics)


@pytest.mark.slow
def test_a_missing_target_topic_fails_fast_with_its_name_others_go_on_and_creating_it_heals(
        db, dsn, redis_url, kafka, topic):
    missing = f"never-created-{uuid.uuid4().hex[:10]}"
    fine = topic("fine")
    create(db, "to-missing", every=1, soon=True, target_kind="kafka", target=missing, retry_attempts=1,
           retry_base=0.05, retry_jitter=0)
    create(db, "to-fine", every=1, soon=True, target_kind="kafka", target=fine)
    no_create = {"allow.auto.create.topics": "false"}
    with Running(relay(dsn, redis_url), executor(dsn, redis_url, kafka, kafka_settings=no_create)):
        wait_for(lambda: count(db, "to-missing", "failed") >= 1, 30, "an occurrence of to-missing to fail")
        [failed, *_] = [e for e in executions(db, "to-missing") if e["outcome"] == "failed"]
        assert failed["attempts"] == 2  # one try and the schedule's one retry, no more
        assert f"topic '{missing}' does not exist" in failed["error"]
        assert "create it" in failed["error"]
        row = db.query("SELECT last_error FROM pyscheduler.schedules_failing WHERE name = 'to-missing'")
        assert row and missing in row[0]["last_error"]
        wait_for(lambda: count(db, "to-fine") >= 2, 30, "to-fine to go on firing")
        assert count(db, "to-fine", "failed") == 0
        assert missing not in topics(kafka)  # nobody created it
        embedded.create_topics(kafka, [missing])
        wait_for(lambda: count(db, "to-missing") >= 1, 30, "to-missing to fire once its topic exists")


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("PYSCHEDULER_TEST_KAFKA_BOOTSTRAP")),
                    reason="asserts what the embedded broker (tansu) does; a configured broker may not create topics")
def test_the_embedded_broker_creates_a_missing_target_topic_on_the_first_try(db, dsn, redis_url, kafka):
    missing = f"created-on-use-{uuid.uuid4().hex[:10]}"
    create(db, "to-new", every=60, soon=True, target_kind="kafka", target=missing)
    with Running(relay(dsn, redis_url), executor(dsn, redis_url, kafka)):
        wait_for(lambda: count(db, "to-new") >= 1, 30, "to-new to fire")
    [run] = executions(db, "to-new")
    assert run["outcome"] == "fired" and run["attempts"] == 1
    assert missing in topics(kafka)


def test_schedules_create_with_kafka_configured_warns_of_a_missing_topic_and_creates_nothing_on_the_broker(
        dsn, db, kafka, topic):
    missing = f"not-there-{uuid.uuid4().hex[:10]}"
    there = topic("there")

    def create_cli(name: str, target: str, *more: str):
        result = CliRunner().invoke(main, ["schedules", "create", name, "--every", "1m", "--kafka", target,
                                           "--dsn", dsn, *more])
        assert result.exit_code == 0, result.output
        return result

    warned = create_cli("to-missing", missing, "--bootstrap-servers", kafka)
    assert f"warning: topic '{missing}' does not exist on {kafka}" in warned.stderr
    json.loads(warned.stdout)  # the schedule, created all the same
    assert db.call_value("get_schedule", name="to-missing")["target"] == missing
    assert missing not in topics(kafka)  # asking did not create it, even on a broker that creates on use
    assert create_cli("to-there", there, "--bootstrap-servers", kafka).stderr == ""
    assert create_cli("no-kafka", missing).stderr == ""  # no Kafka configured: nothing to ask
    result = CliRunner().invoke(main, ["schedules", "update", "no-kafka", "--kafka", f"{missing}-2", "--dsn", dsn,
                                       "--bootstrap-servers", kafka])
    assert result.exit_code == 0 and f"topic '{missing}-2' does not exist" in result.stderr, result.output
