"""The container files (Docker does not run on the dev machines, so these read the files): the
image has the dashboard, runs as a user, leaves the Kafka jars and .git out; compose publishes
nothing beyond loopback, Redis has a password, and host-side scripts are told which ports to use."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_image_has_the_dashboard_and_runs_as_a_user():
    docker = (ROOT / "Dockerfile").read_text()
    install = re.search(r'pip install[^\n]*"rlwatch\[([a-z,]+)\]"', docker)
    assert install and {"worker", "web"} <= set(install.group(1).split(","))
    # the wheels are built with a Rust toolchain, and the image checks it runs the native core
    assert re.search(r'pip wheel[^\n]*"\.\[worker,web\]"', docker) and "rustup" in docker
    assert 'grep -q "native core"' in docker
    users = re.findall(r"^USER\s+(\S+)", docker, re.M)
    assert users and users[-1] not in ("root", "0")
    assert "EXPOSE 8765" in docker and '"--web", "0.0.0.0:8765"' in docker


def test_the_build_context_leaves_out_git_kafka_jars_and_virtualenvs():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".local", ".venv", "web/frontend/node_modules"} <= ignored
    assert (ROOT / "scripts" / "kafka.sh").read_text().count(".local/kafka") >= 1   # where the jars go


def test_compose_publishes_on_loopback_with_a_redis_password():
    text = (ROOT / "docker-compose.yml").read_text()
    services = yaml.safe_load(text)["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)     # never all interfaces
    assert "--requirepass" in services["redis"]["command"]
    assert services["redis"]["ports"] == ["127.0.0.1:16379:6379"]       # not a local Redis's 6379
    assert "127.0.0.1:8765:8765" in services["worker"]["ports"]          # the dashboard
    worker_redis = services["worker"]["environment"]["RLWATCH_REDIS"]
    assert worker_redis == "redis://:${RLWATCH_REDIS_PASSWORD:-rlwatch}@redis:6379/0"   # with the password
    assert "RLWATCH_KAFKA=localhost:29092" in text                       # said for host-side scripts
    assert "redis://:rlwatch@localhost:16379/0" in text
    readme = (ROOT / "README.md").read_text()
    assert "localhost:29092" in readme and "localhost:16379" in readme
