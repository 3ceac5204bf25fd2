"""The network options every connection of the service carries, the settings pinned once
connected, and which named queries are sent again after a broken connection."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from service import db
from service.store.pool import is_read


def test_every_connection_has_keepalives_and_timeouts() -> None:
    params = conninfo_to_dict(db.conninfo("postgresql://u@h:5/d", tcp_timeout=15.0,
                                          connect_timeout=5.0))
    assert params["keepalives"] == "1"
    assert params["tcp_user_timeout"] == "15000"
    assert params["connect_timeout"] == "5"
    idle, interval, count = (int(params[k]) for k in (
        "keepalives_idle", "keepalives_interval", "keepalives_count"))
    assert idle + interval * count <= 15  # a dead idle peer is noticed within the timeout
    assert "-c synchronous_commit=on" in params["options"]


def test_the_urls_own_network_parameters_are_kept() -> None:
    params = conninfo_to_dict(db.conninfo("postgresql://u@h/d?keepalives_idle=60&"
                                          "connect_timeout=20"))
    assert params["keepalives_idle"] == "60" and params["connect_timeout"] == "20"
    assert params["tcp_user_timeout"] == "15000"


def test_yoyos_connection_has_them_too() -> None:
    url = db.yoyo_url("postgresql://u@h/d")
    assert "keepalives=1" in url and "tcp_user_timeout=15000" in url
    assert "idle_session_timeout" not in url  # a server of unknown version
    assert "synchronous_commit%3Don" in url
    newer = db.yoyo_url("postgresql://u@h/d", 170000)
    assert "idle_session_timeout%3D0" in newer and "transaction_timeout%3D0" in newer
    assert "transaction_timeout" not in db.yoyo_url("postgresql://u@h/d", 140000)


def test_only_plain_reads_are_sent_again() -> None:
    assert is_read("api_ping") and is_read("api_subscription_list")
    assert not is_read("partitions_lock")  # an advisory lock: a session effect
    assert not is_read("claim")
    assert not is_read("record")
    assert not is_read("listen")
