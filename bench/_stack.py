"""What the brake, restart and fleet benches share: the real stack (Apache Kafka and Redis from
scripts/services.sh), `rlwatch worker` subprocesses, a recording stand-in for Slack and the
webhook, and a load generator in a process of its own."""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

KAFKA = os.environ.get("RLWATCH_BENCH_KAFKA", "127.0.0.1:9092")
REDIS = os.environ.get("RLWATCH_BENCH_REDIS", "redis://127.0.0.1:6379/0")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def services_up() -> None:
    def open_(port: int) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    if not (open_(int(KAFKA.rsplit(":", 1)[1])) and open_(6379)):
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "start"], check=True, timeout=300)


def pct(xs: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of xs; nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q / 100 * len(s) + 0.5)) - 1))]


def bench_env(sid: str, **extra) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "RLWATCH_KAFKA": KAFKA, "RLWATCH_REDIS": REDIS, "RLWATCH_APP_ID": f"rlwatch-bench-{sid}",
        "RLWATCH_EVENTS_TOPIC": f"rlwatch.events.bench-{sid}", "RLWATCH_ALERTS_TOPIC": f"rlwatch.alerts.bench-{sid}",
        "RLWATCH_DLQ_TOPIC": f"rlwatch.dlq.bench-{sid}", "PYTHONUNBUFFERED": "1",
    })
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Worker:
    """`rlwatch worker` in a subprocess; its output lines are kept (with arrival times). It
    runs in a directory of its own (Faust's data directory goes there), the same one after a
    restart, removed when the bench ends; the tree's root is put on its path."""

    def __init__(self, env: dict[str, str], loglevel: str = "warning", root: Path | None = None):
        self.env, self.loglevel = dict(env), loglevel
        root = root or ROOT         # (another tree's worker, e.g. an older checkout's)
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)
        self.cwd = tempfile.mkdtemp(prefix="rlwatch-bench-worker-")
        atexit.register(shutil.rmtree, self.cwd, True)
        self.lines: list[tuple[float, str]] = []
        self.proc: subprocess.Popen | None = None
        self.started = 0.0

    def start(self, wait: str | None = "Ready", timeout: float = 120.0) -> Worker:
        self.lines = []
        self.started = time.time()
        # "Ready" is logged at INFO by Faust's worker; keep its own log at info, ours quiet
        self.proc = subprocess.Popen([sys.executable, "-m", "rlwatch", "worker", "--loglevel", "info"],
                                     cwd=self.cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        threading.Thread(target=self._pump, daemon=True).start()
        if wait:
            self.wait_for(wait, timeout)
        return self

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def wait_for(self, text: str, timeout: float = 60.0, after: float = 0.0) -> float:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for t, line in list(self.lines):
                if t >= after and text in line:
                    return t
            if self.proc.poll() is not None:
                raise RuntimeError("worker exited:\n" + "\n".join(x for _, x in self.lines[-30:]))
            time.sleep(0.02)
        raise RuntimeError(f"worker never printed {text!r}")

    def kill(self) -> float:
        t = time.time()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        return t

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def usage(self) -> tuple[float, float]:
        """(CPU seconds used so far, resident MB now) of the worker process."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        cpu = (int(parts[11]) + int(parts[12])) / CLK_TCK
        with open(f"/proc/{self.proc.pid}/statm") as f:
            rss = int(f.read().split()[1]) * PAGE / 2**20
        return cpu, rss


# -- load: healthy step events of many runs and ranks, at a set rate, from another process -------

def _payloads(n: int, seed: int) -> list[str]:
    """Metric dicts of healthy steps (JSON text without braces), noisy so no rule fires."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m = {"kl/mean": 0.02 + rng.gauss(0, 0.002), "reward/mean": 0.5 + rng.gauss(0, 0.05),
             "reward/std": 0.2 + rng.gauss(0, 0.01), "entropy/mean": 2.0 + rng.gauss(0, 0.02),
             "loss/policy": 0.1 + rng.gauss(0, 0.01), "loss/value": 0.3 + rng.gauss(0, 0.02),
             "grad_norm": 1.0 + rng.gauss(0, 0.05), "clip_frac": 0.05 + rng.gauss(0, 0.005),
             "lr": 1e-6, "response_length/mean": 200 + rng.gauss(0, 5)}
        out.append(",".join(f'"{k}":{v:.6g}' for k, v in m.items()))
    return out


def _generate(topic: str, runs: int, ranks: int, rate: float, prefix: str, sent, stop) -> None:
    """Step events of every rank of every run, round after round, paced to ``rate`` events/s."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=KAFKA, linger_ms=20, batch_size=1 << 20, acks=1,
                             max_in_flight_requests_per_connection=5)
    payloads = _payloads(997, sum(map(ord, prefix)))
    ids = [f"{prefix}-{r:05d}" for r in range(runs)]
    keys = [i.encode() for i in ids]
    t0, n, step = time.time(), 0, 0
    while not stop.is_set():
        for r in range(runs):
            now = time.time()
            for rank in range(ranks):
                body = (f'{{"schema":1,"kind":"step","run_id":"{ids[r]}","rank":{rank},"world_size":{ranks},'
                        f'"step":{step},"ts":{now:.3f},"metrics":{{{payloads[n % 997]}}}}}').encode()
                producer.send(topic, key=keys[r], value=body)
                n += 1
            if r % 16 == 15:
                sent.value = n
                ahead = t0 + n / rate - time.time()
                if ahead > 0:
                    time.sleep(ahead)
                if stop.is_set():
                    break
        step += 1
    sent.value = n
    producer.flush(30)
    producer.close(10)


class Load:
    """``runs`` x ``ranks`` runs at ``rate`` events/s in total, from a process of its own."""

    def __init__(self, topic: str, runs: int, ranks: int, rate: float, prefix: str | None = None):
        ctx = mp.get_context("spawn")
        self.sent = ctx.Value("q", 0)
        self.stop_ = ctx.Event()
        self.prefix = prefix or f"load-{uuid.uuid4().hex[:6]}"
        self.proc = ctx.Process(target=_generate, args=(topic, runs, ranks, rate, self.prefix, self.sent,
                                                        self.stop_), daemon=True)
        self.t0 = 0.0

    def start(self) -> Load:
        self.t0 = time.time()
        self.proc.start()
        return self

    def stop(self) -> int:
        self.stop_.set()
        self.proc.join(60)
        return self.sent.value

    @property
    def rate(self) -> float:
        return self.sent.value / max(1e-9, time.time() - self.t0)


def committed_offsets(admin, group: str) -> dict:
    """The offsets ``group`` committed, by partition, with kafka-python 3 (``list_group_offsets``)
    or 2 (``list_consumer_group_offsets``, which 3 renamed)."""
    if hasattr(admin, "list_group_offsets"):
        return admin.list_group_offsets(group).get(group, {})
    return admin.list_consumer_group_offsets(group)


def group_offsets(group: str, topic: str) -> tuple[int, int] | None:
    """(events written to ``topic``, events of it committed by consumer group ``group``)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=KAFKA, client_id="rlwatch-bench-lag")
    consumer = KafkaConsumer(bootstrap_servers=KAFKA, client_id="rlwatch-bench-lag")
    try:
        offsets = committed_offsets(admin, group)
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in parts]
        ends = consumer.end_offsets(tps)
        done = 0
        for tp in tps:
            got = offsets.get(tp)
            off = getattr(got, "offset", got) if got is not None else 0
            done += off if off and off > 0 else 0
        return sum(ends.values()), done
    except Exception:  # noqa: BLE001 - a bench: report nothing rather than fail
        return None
    finally:
        admin.close()
        consumer.close()


def group_lag(group: str, topic: str) -> int | None:
    """Events of ``topic`` not yet committed by consumer group ``group``."""
    got = group_offsets(group, topic)
    return None if got is None else got[0] - got[1]
