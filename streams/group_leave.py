"""A worker that stops leaves its consumer group at once, static membership or not.

Each worker has a group instance id (Kafka static membership, :func:`streams.app.worker_instance_id`)
so that one restarted after a crash takes its partitions back without a rebalance. But a static
member's consumer sends no LeaveGroup when it closes (aiokafka skips it, as the Java client
does): the broker only notices it gone when its session times out. A worker stopped for good (a
scale-down, a host drained, a deploy that moves it) left its runs unwatched that long, no rule
read and no brake able to fire there: about 8 s of the default 10 s session, measured, and
however long a user set ``RLWATCH_SESSION_TIMEOUT`` to.

Kafka 2.4 and later take a LeaveGroup (version 3 on) that names the static member
(KIP-345), which aiokafka does not implement. :func:`leave_on_close` makes a consumer's
coordinator send it when the consumer closes: the other workers take its partitions at once. A
worker restarted in place then costs two quick rebalances (its partitions go and come back)
instead of none, while its runs are watched by the other workers meanwhile. A worker killed
outright sends nothing and still gets its place back on restart.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

__all__ = ["LeaveGroupRequest_v3", "StaticLeaveGroupRequest", "leave_on_close"]

log = logging.getLogger("rlwatch")


class LeaveGroupResponse_v3(Response):
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("members", Array(("member_id", String("utf-8")),
                          ("group_instance_id", String("utf-8")),
                          ("error_code", Int16))),
    )


class LeaveGroupRequest_v3(RequestStruct):
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class StaticLeaveGroupRequest(Request[LeaveGroupRequest_v3]):
    """LeaveGroup for one member, named by its member id and its group instance id."""

    API_KEY = 13

    def __init__(self, group: str, member_id: str, group_instance_id: str):
        self._group = group
        self._member = (member_id, group_instance_id)

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(self._group, [self._member])


def leave_on_close(coordinator: Any) -> None:
    """Make ``coordinator`` (an aiokafka ``GroupCoordinator``) leave its group when it closes,
    static member or not. Its close calls ``_maybe_leave_group`` once its heartbeat has stopped,
    so nothing rejoins after the leave; that is the step replaced here, for this coordinator."""
    if not getattr(coordinator, "_group_instance_id", None):
        return      # a dynamic member: aiokafka sends its own LeaveGroup
    own = getattr(coordinator, "_maybe_leave_group", None)
    needs = ("_send_req", "reset_generation", "generation", "group_id", "member_id")
    if own is None or not all(hasattr(coordinator, name) for name in needs):
        # another aiokafka than the one this was written against: its own close, said once
        log.warning("rlwatch: this aiokafka's group coordinator has no %s; a static member's "
                    "partitions go to the other workers when its session times out",
                    ", ".join(n for n in ("_maybe_leave_group", *needs) if not hasattr(coordinator, n)))
        return

    async def leave() -> None:
        if coordinator.generation <= 0:
            return await own()
        group, member = coordinator.group_id, coordinator.member_id
        instance = coordinator._group_instance_id
        try:
            response = await coordinator._send_req(StaticLeaveGroupRequest(group, member, instance))
        except (KafkaError, NotImplementedError) as exc:
            # the broker's session timeout hands the partitions over instead: say so
            log.warning("rlwatch: could not leave group %s as %s (%r); the other workers take "
                        "its partitions when its session times out", group, instance, exc)
        else:
            codes = [response.error_code] + [m[2] for m in getattr(response, "members", [])]
            failed = next((code for code in codes if code), 0)
            if failed:
                log.warning("rlwatch: leaving group %s as %s failed (%s); the other workers take "
                            "its partitions when its session times out", group, instance,
                            for_code(failed).__name__)
            else:
                log.info("rlwatch: left group %s as %s: its partitions go to the other workers now",
                         group, instance)
        coordinator.reset_generation()

    coordinator._maybe_leave_group = leave
