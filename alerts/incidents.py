"""Incident snapshots: what a person needs to look at an alert that fired with ``snapshot``.

The processor attaches a snapshot to such an alert (:func:`streams.snapshot.attach_snapshot`:
the metric window around the onset, the offending step's samples beside the last stable
step's, ranks and batch ids); the dispatcher stores it once, under an id derived from the
alert's identity and onset, in ``<ns>:incident:<id>`` (30 days), indexed by time in
``<ns>:incidents``, where ``<ns>`` is the application's namespace ``rlwatch:<app id>`` (two
deployments sharing a Redis keep their incidents apart). ``rlwatch incidents list`` / ``rlwatch incidents show ID``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Protocol

from alerts.control import pipelined
from contract.alert import Alert, Raw, read_json, splice_json
from contract.events import record_json

__all__ = ["IncidentStore", "MemoryIncidents", "RedisIncidents", "answered_commands", "incident_id",
           "incident_json", "make_incident"]

TTL = 30 * 24 * 3600


def incident_id(alert: Alert) -> str:
    return "inc-" + hashlib.sha256(f"{alert.fingerprint}:{alert.onset_step}".encode()).hexdigest()[:12]


#: a snapshot kept as its JSON text (msgspec.Raw) this long or shorter is read (``{}``,
#: ``null``: "no snapshot"); a longer one holds something and is kept as it came
_SHORT_SNAPSHOT = 16


def make_incident(alert: Alert, snapshot: dict | Raw | None, now: float, done: list[str],
                  commands: dict[str, str] | None = None) -> dict:
    """The incident record of ``alert``: plain JSON values throughout (the alert and its
    snapshot as their JSON reads back, non-finite numbers as the contract's strings), the
    same in memory as a store reads back. A snapshot that comes as its JSON text (a
    ``msgspec.Raw``: :meth:`contract.alert.Alert.from_json_keeping_snapshot`) stays that text,
    the same JSON value, which the stores write as it is (:func:`incident_json`)."""
    data = read_json(alert.to_json())
    data.pop("snapshot", None)
    if isinstance(snapshot, Raw):
        if len(snapshot) > _SHORT_SNAPSHOT:
            return _incident(alert, data, now, done, commands, snapshot)
        snapshot = read_json(bytes(snapshot))
    # through pydantic-core's writer and msgspec's reader: a tenth of the time of walking
    # the snapshot (thousands of numbers) in Python
    return _incident(alert, data, now, done, commands, read_json(record_json(snapshot)) if snapshot else
                     {"note": "no snapshot data came with this alert (the processor keeps none "
                              "for this run)"})


def _incident(alert: Alert, data: dict, now: float, done: list[str], commands: dict[str, str] | None,
              snapshot) -> dict:
    return {
        "id": incident_id(alert), "created": now, "run_id": alert.run_id, "rule": alert.rule,
        "severity": alert.severity, "step": alert.step, "onset_step": alert.onset_step,
        "summary": alert.summary, "actions_taken": done, "commands": dict(commands or {}),
        "alert": data, "snapshot": snapshot,
    }


def answered_commands(incident: dict, entries: list, secret: str | None) -> dict[str, str]:
    """What the run's ranks answered to each command the incident's alert sent it (action ->
    the answers in a few words, or that none came), from the run's audit entries since the
    incident (:meth:`alerts.control.RedisControl.since`; signed answers only, with a control
    secret): did the training side keep its snapshot, does the pause hold?"""
    from alerts.notices import say_heard
    from alerts.operator import answers_of

    out = {}
    for action, cid in (incident.get("commands") or {}).items():
        answers = answers_of(entries, cid, secret)
        out[action] = say_heard(answers)[2] if answers else "no answer from the run"
    return out


def incident_json(incident: dict) -> bytes:
    """The stored text of an incident from :func:`make_incident` (a snapshot kept as its JSON
    text written as it is)."""
    snapshot = incident.get("snapshot")
    if not isinstance(snapshot, Raw):
        return record_json(incident)
    return splice_json(record_json({k: v for k, v in incident.items() if k != "snapshot"}),
                       "snapshot", snapshot)


def summary_of(inc: dict) -> dict:
    return {k: inc.get(k) for k in ("id", "created", "run_id", "rule", "severity", "step",
                                    "onset_step", "summary")}


class IncidentStore(Protocol):
    async def save(self, incident: dict) -> bool: ...
    async def save_all(self, incidents: list[dict]) -> list[bool]:
        """:meth:`save` each (one round trip for all): whether each was new."""
    async def list(self, run_id: str | None = None, limit: int = 50) -> list[dict]: ...
    async def get(self, incident_id: str) -> dict | None: ...


class MemoryIncidents:
    def __init__(self):
        self.items: dict[str, dict] = {}

    async def save(self, incident: dict) -> bool:
        if incident["id"] in self.items:
            return False
        if isinstance(incident.get("snapshot"), Raw):     # kept as a store reads it back
            incident = {**incident, "snapshot": read_json(bytes(incident["snapshot"]))}
        self.items[incident["id"]] = incident
        return True

    async def save_all(self, incidents: list[dict]) -> list[bool]:
        return [await self.save(inc) for inc in incidents]

    async def list(self, run_id: str | None = None, limit: int = 50) -> list[dict]:
        out = sorted(self.items.values(), key=lambda i: i["created"], reverse=True)
        return [summary_of(i) for i in out if run_id in (None, i["run_id"])][:limit]

    async def get(self, incident_id: str) -> dict | None:
        hits = [v for k, v in self.items.items() if k.startswith(incident_id)]
        return hits[0] if len(hits) == 1 else None


#: RedisIncidents.save: KEYS the incident's record, the index; ARGV the record, its TTL, its id,
#: its creation time. 1 when stored, 0 when an incident of that id was there already.
_SAVE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[3])
  return 1
end
return 0
"""


class RedisIncidents:
    def __init__(self, redis, namespace: str = "rlwatch"):
        self.redis = redis
        self.index = f"{namespace}:incidents"
        self.p = f"{namespace}:incident:"
        self._save = redis.register_script(_SAVE)

    async def save(self, incident: dict) -> bool:
        """Store the incident and index it, at once (one script); False if it was there."""
        return (await self.save_all([incident]))[0]

    async def save_all(self, incidents: list[dict]) -> list[bool]:
        """Each incident stored and indexed at once (one script each, all in one round trip,
        :func:`alerts.control.pipelined`); whether each was new (saving one twice stores it
        once)."""
        def queue(pipe) -> None:
            for inc in incidents:
                pipe.evalsha(self._save.sha, 2, f"{self.p}{inc['id']}", self.index,
                             incident_json(inc), TTL, inc["id"], inc["created"])
        return [bool(x) for x in await pipelined(self.redis, queue, (self._save,))] if incidents else []

    async def list(self, run_id: str | None = None, limit: int = 50) -> list[dict]:
        ids = [i.decode() if isinstance(i, bytes) else i
               for i in await self.redis.zrevrange(self.index, 0, max(limit * 5, 200) - 1)]
        out: list[dict[str, Any]] = []
        stale = []
        for i in ids:
            raw = await self.redis.get(f"{self.p}{i}")
            if raw is None:
                stale.append(i)
                continue
            inc = json.loads(raw)
            if run_id in (None, inc["run_id"]):
                out.append(summary_of(inc))
            if len(out) >= limit:
                break
        if stale:
            await self.redis.zrem(self.index, *stale)
        return out

    async def get(self, incident_id: str) -> dict | None:
        raw = await self.redis.get(f"{self.p}{incident_id}")
        if raw is None:  # a unique prefix is enough, as with silences
            ids = [i.decode() if isinstance(i, bytes) else i for i in await self.redis.zrange(self.index, 0, -1)]
            hits = [i for i in ids if i.startswith(incident_id)]
            if len(hits) != 1:
                return None
            raw = await self.redis.get(f"{self.p}{hits[0]}")
        return None if raw is None else json.loads(raw)
