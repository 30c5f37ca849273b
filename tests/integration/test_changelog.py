"""The run table's changelog on the real broker: compacted, rolled and cleaned soon, so that a
restarted worker reads about one state per run (streams.app.CHANGELOG_CONFIG)."""

from __future__ import annotations

import time
import uuid

import pytest

from contract.settings import Settings
from streams.app import CHANGELOG_CONFIG, changelog_topic, ensure_topics
from tests.integration.conftest import worker_env

pytestmark = pytest.mark.integration


def topic_config(kafka: str, topic: str) -> dict[str, str]:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka, client_id="rlwatch-test")
    try:
        got = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        admin.close()
    return {k: v["value"] for k, v in got["topic"][topic].items()}   # those set on the topic


def test_a_workers_run_table_changelog_is_rolled_and_cleaned_soon(services, start_worker):
    env = worker_env(services, uuid.uuid4().hex[:8])
    start_worker(env).stop()
    got = topic_config(services["kafka"], f"{env['RLWATCH_APP_ID']}-rlwatch-runs-changelog")
    assert got["cleanup.policy"] == "compact"
    assert {k: got[k] for k in CHANGELOG_CONFIG} == CHANGELOG_CONFIG
    assert int(got["segment.bytes"]) == 64 << 20


def test_an_older_workers_changelog_gets_the_settings_and_keeps_its_own(services):
    from kafka.admin import KafkaAdminClient, NewTopic

    sid = uuid.uuid4().hex[:8]
    settings = Settings(kafka=services["kafka"], app_id=f"rlwatch-test-{sid}",
                        events_topic=f"rlwatch.events.{sid}", alerts_topic=f"rlwatch.alerts.{sid}",
                        dlq_topic=f"rlwatch.dlq.{sid}")
    name = changelog_topic(settings)
    admin = KafkaAdminClient(bootstrap_servers=services["kafka"], client_id="rlwatch-test")
    try:     # as an older worker left it: Kafka's defaults, and a setting an operator chose
        admin.create_topics([NewTopic(name, 4, 1, topic_configs={"cleanup.policy": "compact",
                                                                 "retention.ms": "123456789"})])
        before = topic_config(services["kafka"], name)     # the settings set on the topic
        assert not set(CHANGELOG_CONFIG) & set(before)
        # the broker's metadata lists a topic just created a little later (on a slow host, later
        # than the call above); an older worker's changelog is listed long before a restart
        deadline = time.monotonic() + 30
        while name not in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.1)
        ensure_topics(settings)
        after = topic_config(services["kafka"], name)
        while not set(CHANGELOG_CONFIG) <= set(after) and time.monotonic() < deadline:
            time.sleep(0.1)      # an altered config reaches the broker's view a little later
            after = topic_config(services["kafka"], name)
        assert {k: after.get(k) for k in CHANGELOG_CONFIG} == CHANGELOG_CONFIG
        assert after["retention.ms"] == "123456789" and after["cleanup.policy"] == "compact"
    finally:
        mine = {name, settings.events_topic, settings.alerts_topic, settings.dlq_topic}
        admin.delete_topics(sorted(mine & set(admin.list_topics())))
        admin.close()
