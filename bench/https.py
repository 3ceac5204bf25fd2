"""https: deliveries to an https receiver, beside a raw client over TLS.

The run makes a CA and a certificate for 127.0.0.1 signed by it (tests/support/tls.py),
starts a TLS receiver process with it, and has the worker trust the CA through
WEBHOOKS_CA_BUNDLE (certificates verified as for any target). SUBSCRIPTIONS
subscriptions get a burst of deliveries; the limit is the raw aiohttp client posting
the same body over TLS to the same receiver (uvloop, 64 in flight), trusting the same CA.
Connections and TLS sessions are reused per host: the burst pays a handshake per
connection, not per delivery.
"""

from __future__ import annotations

from bench.common import (
    PYTHON,
    Result,
    connect,
    create_table,
    info_result,
    insert_rows,
    reset_service_state,
    subscribe,
)
from bench.context import Context
from bench.delivery import PAD
from bench.receiver import read_port
from bench.slow import drain, get_stats
from tests.support.tls import make_tls

SUBSCRIPTIONS = 8


def scenario(ctx: Context) -> list[Result]:
    """The worker's deliveries/s over TLS against the raw client's."""
    directory = ctx.procs.workdir / "tls"
    directory.mkdir(exist_ok=True)
    tls = make_tls(directory)
    receiver = ctx.procs.start("tls-receiver", [PYTHON, "-m", "bench.receiver", "--cert",
                                                str(tls.cert), "--key", str(tls.key)],
                               stdout_pipe=True)
    assert receiver.popen.stdout is not None
    port = read_port(receiver.popen.stdout)
    try:
        total = 3_000 if ctx.quick else 20_000
        rows = total // SUBSCRIPTIONS
        raw = ctx.raw("rate", "--url", f"https://127.0.0.1:{port}/tlsraw/0", "--lib",
                      "aiohttp", "--loop", "uvloop", "--concurrency", "64", "--duration",
                      "2" if ctx.quick else "4", "--ca", str(tls.ca))
        with connect(ctx.url) as conn:
            reset_service_state(conn)
            create_table(conn, "tls_rows", attach="tls_rows", pad=PAD)
            subscribe(conn, "tls_rows", [f"https://127.0.0.1:{port}/tls/{i}"
                                         for i in range(SUBSCRIPTIONS)])
            get_stats(port, "/reset", method="POST", tls=True)
            with ctx.worker(WEBHOOKS_CA_BUNDLE=str(tls.ca)) as worker:
                mark = ctx.cpu_mark(worker)
                insert_rows(conn, "tls_rows", rows)
                count, rate = drain(port, "tls", rows * SUBSCRIPTIONS, 180, tls=True)
                cpu = ctx.cpu_note(worker, mark, count)
                cpu_us = ctx.cpu_us(worker, mark, count)
    finally:
        ctx.procs.stop(receiver)
    return [info_result(
        "https: deliveries/s, one worker", rate, raw["rate"], "req/s",
        f"{count:,} deliveries ({rows:,} rows x {SUBSCRIPTIONS} subscriptions) to a TLS "
        f"receiver whose CA the run made (WEBHOOKS_CA_BUNDLE), first→last receipt; {cpu} "
        f"({cpu_us:.0f} us per delivery); limit = raw aiohttp over TLS, uvloop c=64 "
        f"({raw['cpu_us']:.0f} us CPU/request), same receiver")]
