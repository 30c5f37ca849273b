"""The LeaveGroup a stopping static member sends (streams.group_leave): what goes on the wire,
and what the worker says when the broker refuses it. The leave through a real broker is in
tests/integration/test_loop.py."""
from __future__ import annotations

import asyncio
import logging

from aiokafka.errors import KafkaConnectionError

from streams.group_leave import LeaveGroupRequest_v3, StaticLeaveGroupRequest, leave_on_close


class Coordinator:
    """The parts of aiokafka's GroupCoordinator that leaving reads, with the broker's answer."""

    def __init__(self, instance, answer=None, error=None):
        self.group_id, self.member_id, self.generation = "g", "member-1", 3
        self._group_instance_id = instance
        self.answer, self.error, self.sent, self.own_left = answer, error, [], 0

    async def _maybe_leave_group(self):
        self.own_left += 1

    async def _send_req(self, request):
        self.sent.append(request)
        if self.error:
            raise self.error
        return self.answer

    def reset_generation(self):
        self.generation, self.member_id = -1, ""


class Answer:
    def __init__(self, error_code=0, member_code=0):
        self.error_code = error_code
        self.members = [("member-1", "host-0", member_code)]


def test_the_request_names_the_member_by_its_id_and_its_instance_id():
    wire = StaticLeaveGroupRequest("g", "member-1", "host-0").prepare({13: (0, 5)})
    assert isinstance(wire, LeaveGroupRequest_v3)
    assert LeaveGroupRequest_v3.decode(wire.encode()).members == [("member-1", "host-0")]


def test_a_static_member_leaves_and_forgets_its_generation(caplog):
    c = Coordinator("host-0", Answer())
    leave_on_close(c)
    with caplog.at_level(logging.INFO, "rlwatch"):
        asyncio.run(c._maybe_leave_group())
    assert [r.build(LeaveGroupRequest_v3).members for r in c.sent] == [[("member-1", "host-0")]]
    assert c.generation == -1 and c.own_left == 0
    assert "left group g as host-0" in caplog.text


def test_a_dynamic_member_keeps_aiokafkas_own_leave():
    c = Coordinator(None)
    leave_on_close(c)
    asyncio.run(c._maybe_leave_group())
    assert c.sent == [] and c.own_left == 1


def test_a_refused_or_lost_leave_is_said_and_the_stop_goes_on(caplog):
    for c in (Coordinator("host-0", Answer(member_code=25)),       # unknown member
              Coordinator("host-0", error=KafkaConnectionError())):
        leave_on_close(c)
        with caplog.at_level(logging.WARNING, "rlwatch"):
            caplog.clear()
            asyncio.run(c._maybe_leave_group())
        assert "when its session times out" in caplog.text
        assert c.generation == -1


def test_an_aiokafka_without_the_step_it_replaces_keeps_its_own_close_and_says_so(caplog):
    """A later aiokafka may rename the coordinator's internals: the worker still starts (and
    stops), and says that its partitions move when its session times out."""

    class Renamed:
        _group_instance_id, generation, group_id, member_id = "host-0", 3, "g", "member-1"

    c = Renamed()
    with caplog.at_level(logging.WARNING, "rlwatch"):
        leave_on_close(c)
    assert "no _maybe_leave_group" in caplog.text and "when its session times out" in caplog.text
    assert not hasattr(c, "_maybe_leave_group")
