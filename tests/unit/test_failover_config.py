"""Failover configuration without servers: `sentinel://` URLs for the broker, the result backend and
the front door's own Redis clients; multi-host PostgreSQL URLs; and the start-up checks that turn
a configuration which cannot work (no Sentinel answers, only standbys listed) into a precise
error and an exit status instead of a failure at the first request."""

from __future__ import annotations

import functools
import socket

import pytest
from sqlalchemy.engine import make_url

from adaptive_rag.errors import ConfigurationError
from adaptive_rag.storage.db import check_writable, database_hosts, make_engine, normalise_url
from workers import redis_connections
from workers.celery_app import celery_config, create_app
from workers.redis_connections import check_reachable, parse
from workers.settings import WorkerSettings

SENTINELS = "sentinel://127.0.0.1:26401,127.0.0.1:26402,127.0.0.1:26403/0?master_name=arag"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- REDIS_URL ---------------------------------------------------------------------------------------

def test_a_plain_redis_url_stays_as_it_is():
    address = parse("redis://:secret@127.0.0.1:6399/2")
    assert not address.is_sentinel and address.celery_url() == "redis://:secret@127.0.0.1:6399/2"
    assert address.transport_options() == {}


@pytest.mark.parametrize("url", [
    SENTINELS,
    "sentinel://127.0.0.1:26401;sentinel://127.0.0.1:26402;sentinel://127.0.0.1:26403/0?master_name=arag",
])
def test_a_sentinel_url_names_the_sentinels_and_the_group(url):
    address = parse(url)
    assert address.is_sentinel and address.master_name == "arag" and address.db == 0
    assert address.sentinels == (("127.0.0.1", 26401), ("127.0.0.1", 26402), ("127.0.0.1", 26403))
    assert address.celery_url() == ("sentinel://127.0.0.1:26401/0;sentinel://127.0.0.1:26402/0;"
                                    "sentinel://127.0.0.1:26403/0")  # Celery's and kombu's form
    assert address.transport_options()["master_name"] == "arag"


def test_a_sentinel_password_reaches_celery_but_never_a_message():
    address = parse("sentinel://:s3cret@10.0.0.1:26379,10.0.0.2/1?master_name=cache")
    assert address.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379)) and address.db == 1
    assert address.password == "s3cret" and address.celery_url().startswith("sentinel://:s3cret@10.0.0.1:26379/1;")
    assert "s3cret" not in address.describe() and "s3cret" not in repr(address)


@pytest.mark.parametrize(("url", "says"), [
    ("sentinel://127.0.0.1:26401/0", "master_name"),
    ("sentinel://127.0.0.1:notaport/0?master_name=arag", "bad Sentinel address"),
    ("sentinel:///0?master_name=arag", "names no Sentinel"),
])
def test_a_malformed_sentinel_url_is_a_configuration_error(url, says):
    with pytest.raises(ConfigurationError, match=says):
        parse(url)


def test_celery_takes_the_sentinel_transport_and_backend():
    settings = WorkerSettings(_env_file=None, redis_url=SENTINELS, visibility_timeout_s=40)
    config = celery_config(settings)
    assert config["broker_url"] == parse(SENTINELS).celery_url()
    assert config["broker_transport"] == "workers.redis_broker:SentinelTransport"
    assert config["broker_transport_options"]["master_name"] == "arag"
    assert config["broker_transport_options"]["visibility_timeout"] == 40
    assert config["result_backend"].startswith("workers.redis_results:WriteOnceSentinelBackend+sentinel://")
    assert config["result_backend_transport_options"]["master_name"] == "arag"
    app = create_app(settings)  # nothing connects until used
    assert type(app.backend).__name__ == "WriteOnceSentinelBackend"
    assert [(h["host"], h["port"]) for h in app.backend.connparams["hosts"]] == list(parse(SENTINELS).sentinels)
    assert type(app.connection_for_write().transport).__name__ == "SentinelTransport"


def test_moving_to_the_next_sentinel_keeps_this_projects_transport():
    """kombu re-reads the scheme of the next `sentinel://` alternate after a failed connect."""
    import kombu

    address = parse(SENTINELS)
    connection = kombu.Connection(address.celery_url(), transport="workers.redis_broker:SentinelTransport",
                                  transport_options=address.transport_options())
    assert type(connection.transport).__qualname__ == "SentinelTransport"
    connection.maybe_switch_next()
    assert connection.hostname == "127.0.0.1" and connection.port == 26402
    assert type(connection.transport).__module__ == "workers.redis_broker"


def test_the_front_door_clients_follow_the_primary_through_the_sentinels():
    sync = redis_connections.sync_client(SENTINELS, socket_timeout=0.25, socket_connect_timeout=0.25, retry=None)
    pool = sync.connection_pool
    assert type(pool).__name__ == "SentinelConnectionPool" and pool.service_name == "arag"
    assert [s.connection_pool.connection_kwargs["port"] for s in pool.sentinel_manager.sentinels] == [
        26401, 26402, 26403]
    client = redis_connections.async_client(SENTINELS, max_connections=4, socket_connect_timeout=1.0)
    pool = client.connection_pool
    assert isinstance(pool, redis_connections.BlockingSentinelConnectionPool)
    assert pool.max_connections == 4 and pool.service_name == "arag"
    plain = redis_connections.async_client("redis://127.0.0.1:6399/0", max_connections=4)
    assert type(plain.connection_pool).__name__ == "BlockingConnectionPool"


def test_no_sentinel_answering_is_an_error_naming_each_one():
    ports = [closed_port(), closed_port()]
    url = f"sentinel://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/0?master_name=arag"
    with pytest.raises(ConfigurationError) as info:
        check_reachable(url, timeout_s=0.5)
    message = str(info.value)
    assert "no Sentinel gives a working primary for 'arag'" in message
    assert all(f"127.0.0.1:{port} does not answer" in message for port in ports)
    assert check_reachable("redis://127.0.0.1:1/0") is None and check_reachable(None) is None


# --- DATABASE_URL -----------------------------------------------------------------------------------

MULTI = "postgresql://arag@127.0.0.1:5433,127.0.0.1:5434/arag?target_session_attrs=read-write"


def test_a_libpq_multi_host_url_becomes_sqlalchemys_form():
    url = normalise_url(MULTI)
    assert url == ("postgresql+psycopg://arag@/arag?host=127.0.0.1:5433&host=127.0.0.1:5434"
                   "&target_session_attrs=read-write")
    assert database_hosts(MULTI) == [("127.0.0.1", 5433), ("127.0.0.1", 5434)]
    assert database_hosts("postgresql://arag@db.internal:5432/arag") == [("db.internal", 5432)]
    assert normalise_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"


def test_the_driver_gets_libpq_host_and_port_lists():
    engine = make_engine(MULTI)
    try:
        _, options = engine.dialect.create_connect_args(make_url(normalise_url(MULTI)))
    finally:
        engine.dispose()
    assert options["host"] == "127.0.0.1,127.0.0.1" and options["port"] == "5433,5434"
    assert options["target_session_attrs"] == "read-write" and options["dbname"] == "arag"


def probe_of(roles: dict[int, str]):
    def probe(_url, _host, port, _timeout):
        role = roles[port]
        if role == "down":
            raise ConnectionRefusedError("refused")
        return role
    return probe


def test_a_list_of_standbys_only_is_an_error_naming_each_host():
    with pytest.raises(ConfigurationError) as info:
        check_writable(MULTI, probe=probe_of({5433: "standby", 5434: "down"}))
    message = str(info.value)
    assert message.startswith("DATABASE_URL: no host accepts writes")
    assert "127.0.0.1:5433 is a standby (accepts no writes)" in message
    assert "127.0.0.1:5434 does not answer" in message


def test_several_hosts_without_read_write_is_an_error():
    with pytest.raises(ConfigurationError, match="target_session_attrs=read-write"):
        check_writable(MULTI.replace("read-write", "any"), probe=probe_of({5433: "primary", 5434: "standby"}))


def test_a_primary_anywhere_in_the_list_passes_and_an_outage_is_no_configuration_error():
    assert check_writable(MULTI, probe=probe_of({5433: "down", 5434: "primary"})) == "primary 127.0.0.1:5434"
    assert check_writable(MULTI, probe=probe_of({5433: "down", 5434: "down"})) is None
    assert check_writable("sqlite:///var/x.db") is None


# --- the processes -------------------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def logging_left_alone(monkeypatch):
    """`main()` configures logging onto the (captured) stderr: not in a test process."""
    import services.frontdoor.__main__ as frontdoor_main
    import workers.pools

    monkeypatch.setattr(frontdoor_main, "configure_logging", lambda *_a, **_k: None)
    monkeypatch.setattr(workers.pools, "configure_logging", lambda *_a, **_k: None)


@pytest.fixture
def unreachable_sentinels(monkeypatch, tmp_path) -> str:
    url = f"sentinel://127.0.0.1:{closed_port()}/0?master_name=arag"
    monkeypatch.chdir(tmp_path)  # no .env of the checkout
    monkeypatch.setenv("REDIS_URL", url)
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'arag.db'}")
    return url


def test_the_front_door_exits_at_start_when_no_sentinel_answers(unreachable_sentinels, capsys):
    from services.frontdoor.__main__ import main

    assert main(["--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("front door not started: REDIS_URL: no Sentinel gives a working primary for 'arag'")
    assert "does not answer" in err


def test_the_worker_pools_exit_at_start_when_no_sentinel_answers(unreachable_sentinels, capsys):
    from workers.pools import main

    assert main(["--pools", "A"]) == 2
    assert capsys.readouterr().err.startswith("worker pools not started: REDIS_URL: no Sentinel gives")


def test_the_front_door_exits_at_start_on_a_standby_only_list(monkeypatch, tmp_path, capsys):
    import workers.startup
    from services.frontdoor.__main__ import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", MULTI)
    monkeypatch.delenv("REDIS_URL", raising=False)
    # two standbys, as PostgreSQL would describe them (the real ones: tests/integration/test_records_failover.py)
    monkeypatch.setattr(workers.startup, "check_writable",
                        functools.partial(check_writable, probe=probe_of({5433: "standby", 5434: "standby"})))
    assert main(["--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("front door not started: DATABASE_URL: no host accepts writes")
    assert "127.0.0.1:5433 is a standby" in err and "127.0.0.1:5434 is a standby" in err


def test_the_local_sentinels_switches_are_read_from_their_logs_once_each(tmp_path):
    """Every Sentinel logs every `+switch-master`; the harness reports each failover once, as
    `<old port> -> <new port>`, so a test can tell one failover from a spurious second one."""
    from infra.local.failover import LocalRedisSentinel

    setup = LocalRedisSentinel(tmp_path)
    lines = ["1:X 06 Dec 2026 20:31:55.323 # +switch-master arag 127.0.0.1 41111 127.0.0.1 45769",
             "1:X 06 Dec 2026 20:31:56.341 # +sdown master arag 127.0.0.1 45769",
             "1:X 06 Dec 2026 20:31:57.443 # +switch-master arag 127.0.0.1 45769 127.0.0.1 41111"]
    for n, sentinel in enumerate(setup.sentinels):
        sentinel.log.parent.mkdir(parents=True, exist_ok=True)
        sentinel.log.write_text("\n".join(lines[: 1 if n == 0 else 3]) + "\n")  # the first saw only one
    assert setup.switches() == ["41111 -> 45769", "45769 -> 41111"]
