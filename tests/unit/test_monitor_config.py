"""A Monitor given a wrong Redis address says so at once (a configuration mistake), instead of
retrying it forever as if Redis were down."""

import pytest

from producers import Monitor


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_a_redis_address_without_its_scheme_is_refused_when_the_monitor_starts(how, monkeypatch):
    if how == "environment":
        monkeypatch.setenv("RLWATCH_REDIS", "localhost:6379")
        kw = {}
    else:
        kw = {"redis": "localhost:6379"}
    with pytest.raises(ValueError) as exc:
        Monitor("r", kafka=False, **kw)
    assert "must be a URL such as redis://localhost:6379/0" in str(exc.value)


def test_a_redis_url_starts_the_listener():
    mon = Monitor("r", kafka=False, redis="redis://127.0.0.1:1/0", heartbeat_seconds=0)
    try:
        assert mon.control is not None
    finally:
        mon.close(1)
