"""The edges' wiring without a broker or Redis: Kafka security reaches Faust and kafka-python,
the factory builds receivers from settings and routes files, the CLI refuses a bad routes file."""

from __future__ import annotations

import pytest

from alerts.factory import build_notifiers, build_routing
from contract.settings import Settings

FAKE_BOT = "xox" + "b-"   # a bot-token prefix, built so no literal looks like a real token

SASL = dict(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-256",
            kafka_sasl_username="svc", kafka_sasl_password="pw")


def test_faust_app_gets_the_broker_credentials():
    from streams.app import build_app

    app = build_app(Settings(app_id="rlwatch-unit-creds", **SASL))
    creds = app.conf.broker_credentials
    assert creds.username == "svc" and creds.password == "pw"
    assert str(creds.protocol.value) == "SASL_SSL" and creds.ssl_context is not None


def test_ensure_topics_passes_the_security_settings_to_kafka_python(monkeypatch):
    import kafka.admin

    from streams import app as app_module

    seen = {}

    class FakeAdmin:
        def __init__(self, **kw):
            seen.update(kw)

        def list_topics(self):
            return ["rlwatch.events", "rlwatch.alerts", "rlwatch.dlq"]

        def close(self):
            pass

    monkeypatch.setattr(kafka.admin, "KafkaAdminClient", FakeAdmin)
    app_module.ensure_topics(Settings(**SASL))
    assert seen["security_protocol"] == "SASL_SSL" and seen["sasl_mechanism"] == "SCRAM-SHA-256"
    assert seen["sasl_plain_username"] == "svc" and seen["sasl_plain_password"] == "pw"


def test_receivers_from_settings_have_fixed_names():
    s = Settings(slack_webhook="http://x/services/a", slack_token=FAKE_BOT + "1", slack_channel="#c",
                 webhook_url="http://x/hook", alertmanager_url="http://am:9093",
                 pagerduty_routing_key="k", pagerduty_url="http://pd")
    assert [n.name for n in build_notifiers(s)] == ["console", "slack-webhook", "slack-bot", "webhook",
                                                    "alertmanager", "pagerduty"]
    routing, notifiers = build_routing(s, build_notifiers(s))
    assert [n for _, n in routing.targets(_alert())] == [n.name for n in notifiers]


def test_routes_file_receivers_become_notifiers(tmp_path, monkeypatch):
    monkeypatch.setenv("ONCALL_KEY", "pd-key")
    f = tmp_path / "routes.yaml"
    f.write_text("""
receivers:
  - {name: oncall, type: pagerduty, routing_key: "${ONCALL_KEY}", url: "http://pd.local"}
  - {name: exp-hook, type: webhook, url: "http://hooks.local/x", secret: s}
route:
  receiver: console
  routes:
    - {match: {severity: black}, receiver: oncall}
""")
    routing, notifiers = build_routing(Settings(routes=str(f)), build_notifiers(Settings()))
    names = {n.name: n for n in notifiers}
    assert set(names) == {"console", "oncall", "exp-hook"}
    assert names["oncall"].routing_key == "pd-key" and names["oncall"].url == "http://pd.local/v2/enqueue"
    assert [n for _, n in routing.targets(_alert(severity="black"))] == ["oncall"]


def test_worker_refuses_a_bad_routes_file_before_touching_kafka(tmp_path):
    from rlwatch.cli import main

    f = tmp_path / "routes.yaml"
    f.write_text("route:\n  receiver: nobody\n")
    with pytest.raises(SystemExit) as exc:
        main(["worker", "--routes", str(f), "--kafka", "127.0.0.1:1"])
    assert "routes.yaml:2: route.receiver: unknown receiver 'nobody'" in str(exc.value)


def _alert(**kw):
    from tests.unit.alerts._helpers import alert

    return alert(**kw)


def test_each_worker_process_on_a_host_gets_its_own_stable_group_instance_id():
    import os
    import subprocess
    import sys
    import uuid

    from streams import app as app_module

    s = Settings(app_id=f"rlwatch-unit-slots-{uuid.uuid4().hex[:6]}")
    assert app_module.worker_instance_id(Settings(worker_id="trainer-7")) == "trainer-7"
    assert app_module.worker_instance_id(Settings(worker_id="none")) is None
    # another process holds slot 0 (a running worker); this one gets slot 1
    code = ("import sys, time; from contract.settings import Settings; from streams.app import worker_instance_id; "
            f"print(worker_instance_id(Settings(app_id={s.app_id!r})), flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        theirs = holder.stdout.readline().strip()
        mine = app_module.worker_instance_id(s)
        assert theirs.endswith("-0") and mine.endswith("-1")
    finally:
        holder.kill()                         # like kill -9: its lock goes with it
        holder.wait()
    for fd in app_module._held_locks:
        os.close(fd)
    app_module._held_locks.clear()
    assert app_module.worker_instance_id(s).endswith("-0")     # the restarted worker's id
    for fd in app_module._held_locks:
        os.close(fd)
    app_module._held_locks.clear()


def test_decoded_run_states_are_bounded_and_an_evicted_run_keeps_its_state():
    import json
    import time

    from contract.events import parse_event
    from rules.loader import load_pack
    from streams.app import RunStates
    from streams.processor import Processor

    processor = Processor(load_pack("rlhf"))
    table: dict[bytes, bytes] = {}
    states = RunStates(table, processor, limit=3)
    now = time.time()
    decoded = {}
    for i in range(5):
        run_id = f"lru-{i}"
        decoded[run_id] = states.get(run_id)
        for step in range(3):
            ev = parse_event(json.dumps({"schema": 1, "kind": "step", "run_id": run_id, "step": step, "ts": now,
                                         "metrics": {"kl/mean": 0.02}}).encode(), now)
            processor.process(states.get(run_id), ev, now)
            states.touch(run_id)
    assert list(states.cache) == ["lru-2", "lru-3", "lru-4"]          # at most three decoded
    assert {b"lru-0", b"lru-1"} <= set(table)                            # the others in the table
    # the states let go are released (their rules compiled against them dropped: streams.heap)
    assert not decoded["lru-0"].programs and not decoded["lru-1"].programs
    assert decoded["lru-4"].programs
    assert states.get("lru-0").summary()["last_step"] == 2              # and back, as they were
    states.drop("lru-4")
    states.forget()
    assert not decoded["lru-4"].programs and not decoded["lru-3"].programs and not states.cache
