"""`make chaos`: at-least-once delivery under faults, checked end to end.

Writers change three attached tables (inserts, updates, deletes, nested rows, bulk
statements, rolled-back transactions) while two `webhooks worker` processes deliver to
receivers that fail, hang, throttle or answer 410. Meanwhile workers are killed with
SIGKILL, Postgres is restarted, the LISTEN connections are terminated from the server
side, and, twice, every connection the workers hold stops answering (they reach Postgres
through a TCP proxy, tests/support/proxy.py, that keeps those connections open and
forwards nothing, while new ones work). At the end every committed change must have
reached every active, matching subscription at least once; nothing rolled back and
nothing for an inactive subscription may arrive. Runs against its own private cluster
(.pgdata-chaos/), which it may restart.

    python -m tests.chaos [--seconds 60] [--writers 4] [--throttle 0.2] [--short]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from aiohttp import web
from psycopg import sql

from service import db
from service.commands import devdb
from tests.support.proxy import Proxy
from tests.support.receivers import Received, Receiver
from tests.support.subscriptions import subscribe

# Below the usual ephemeral range (32768-60999): a client socket that happens to hold the
# port, even in TIME_WAIT, would keep the restarted server from binding it.
PORT = 25431
DATADIR = Path(".pgdata-chaos")
# Seconds without a delivery arriving, after the writers stop, that end the drain: every
# wait of the run (a lease, a retry, Retry-After, a connection's deadline) is far shorter.
NO_PROGRESS = 30
TABLES_SQL = """
CREATE TABLE orders (id uuid PRIMARY KEY, tenant text NOT NULL, version int NOT NULL,
                     note text);
CREATE TABLE order_lines (id uuid PRIMARY KEY, order_id uuid NOT NULL, tenant text NOT NULL,
                          version int NOT NULL);
CREATE TABLE audit (id uuid PRIMARY KEY, tenant text NOT NULL, version int NOT NULL);
SELECT webhooks.attach('orders', resource => 'orders', noun => 'order',
                       tenant_column => 'tenant');
SELECT webhooks.attach('order_lines', resource => 'order_lines', noun => 'line',
                       parent_resource => 'orders', parent_column => 'order_id',
                       tenant_column => 'tenant');
SELECT webhooks.attach('audit', resource => 'audit', noun => 'audit', include_row => false);
"""

# name, resource, events, tenant, receiver behaviour, active
SUBSCRIPTIONS = [
    ("all", "orders", ["order.create", "order.update", "order.delete", "line.create",
                       "line.update", "line.delete"], None, "ok", True),
    ("flaky", "orders", ["order.create", "order.update", "line.create"], None, "flaky", True),
    ("slow", "orders", ["order.create", "order.delete"], None, "slow", True),
    ("throttled", "audit", ["audit.create"], None, "throttle", True),
    ("tenant1", "orders", ["order.create", "order.update", "order.delete"], "t1", "ok", True),
    ("inactive", "orders", ["order.create", "order.update"], None, "ok", False),
    ("gone", "audit", ["audit.create"], None, "gone", True),
]


@dataclass
class Change:
    """One change a writer committed (or may have: `uncertain`)."""

    table: str
    event: str
    row_id: str
    tenant: str
    version: int
    uncertain: bool = False


@dataclass
class Receipts:
    """What the receivers got, by subscription name."""

    got: dict[str, list[tuple[str, str, int | None]]] = field(default_factory=dict)
    statuses: Counter[int] = field(default_factory=Counter)


def receiver_for(receipts: Receipts, rng: random.Random, throttle: float) -> Receiver:
    """One receiver; the path names the subscription and so its behaviour (the throttled
    one answers that share of its requests 429)."""
    behaviours = {name: b for name, _, _, _, b, _ in SUBSCRIPTIONS}

    async def handle(req: Received) -> web.StreamResponse:
        name = req.path.lstrip("/")
        behaviour = behaviours.get(name, "ok")
        status = 200
        if behaviour == "flaky" and rng.random() < 0.2:
            status = 500
        elif behaviour == "slow" and rng.random() < 0.1:
            await asyncio.sleep(3)  # past the workers' delivery timeout
            status = 200
        elif behaviour == "throttle" and rng.random() < throttle:
            receipts.statuses[429] += 1
            return web.Response(status=429, headers={"Retry-After": "1"})
        elif behaviour == "gone":
            status = 410
        receipts.statuses[status] += 1
        if status == 200 and req.request is not None and req.request.transport is not None:
            event = json.loads(req.body)
            row = event.get("resource") or {}
            key = (event["event"]["name"], str(event["event"]["resource_id"]),
                   row.get("version"))
            receipts.got.setdefault(name, []).append(key)
        return web.Response(status=status)

    return Receiver(behaviour=handle, cancel_on_disconnect=True)


class Writer:
    """Makes random changes on its own rows and remembers what it committed."""

    def __init__(self, url: str, seed: int, deadline: float) -> None:
        self.url = url
        self.rng = random.Random(seed)
        self.deadline = deadline
        self.changes: list[Change] = []
        self.rows: dict[str, tuple[str, str, int]] = {}  # id -> (table, tenant, version)
        self.rolled_back = 0
        self.errors = 0

    async def run(self) -> None:
        while time.monotonic() < self.deadline:
            try:
                async with await psycopg.AsyncConnection.connect(self.url) as conn:
                    while time.monotonic() < self.deadline:
                        await self.step(conn)
            except psycopg.OperationalError:
                self.errors += 1
                await asyncio.sleep(0.2)

    async def step(self, conn: psycopg.AsyncConnection) -> None:
        planned: list[Change] = []
        params: tuple[object, ...]
        rollback = self.rng.random() < 0.08
        op = self.rng.random()
        tenant = self.rng.choice(["t1", "t2"])
        orders = [k for k, v in self.rows.items() if v[0] == "orders"]
        if op < 0.35 or not orders:
            oid = str(uuid.uuid4())
            planned.append(Change("orders", "order.create", oid, tenant, 1))
            text, params = ("INSERT INTO orders (id, tenant, version, note) "
                           "VALUES (%s, %s, 1, %s)", (oid, tenant,
                                                      "rollback" if rollback else "ok"))
        elif op < 0.55:
            oid = self.rng.choice(orders)
            _, t, v = self.rows[oid]
            planned.append(Change("orders", "order.update", oid, t, v + 1))
            text, params = ("UPDATE orders SET version = %s WHERE id = %s", (v + 1, oid))
        elif op < 0.65:
            oid = self.rng.choice(orders)
            _, t, v = self.rows[oid]
            planned.append(Change("orders", "order.delete", oid, t, v))
            text, params = ("DELETE FROM orders WHERE id = %s", (oid,))
        elif op < 0.85:
            oid = self.rng.choice(orders)
            lid = str(uuid.uuid4())
            planned.append(Change("order_lines", "line.create", lid, self.rows[oid][1], 1))
            text, params = ("INSERT INTO order_lines (id, order_id, tenant, version) "
                           "VALUES (%s, %s, %s, 1)", (lid, oid, self.rows[oid][1]))
        else:
            ids = [str(uuid.uuid4()) for _ in range(self.rng.choice([1, 20, 100]))]
            planned += [Change("audit", "audit.create", i, tenant, 1) for i in ids]
            text, params = ("INSERT INTO audit (id, tenant, version) "
                           "SELECT unnest(%s::uuid[]), %s, 1", (ids, tenant))
        try:
            cur = await conn.execute(text, params)
            if rollback:
                await conn.rollback()
                self.rolled_back += len(planned)
                return
            await conn.commit()
        except psycopg.OperationalError:
            # The commit may or may not have happened (Postgres restarting): the database
            # decides at the end, and these rows are never touched again, since what the
            # writer believes of them may be wrong.
            for change in planned:
                change.uncertain = True
                self.rows.pop(change.row_id, None)
            self.changes += planned
            raise
        if cur.rowcount == 0:
            return  # nothing changed, nothing captured
        self.changes += planned
        self.apply(planned)

    def apply(self, changes: list[Change]) -> None:
        # Only orders are changed again later; lines and audit rows are insert-only.
        for c in changes:
            if c.event == "order.delete":
                self.rows.pop(c.row_id, None)
            elif c.table == "orders":
                self.rows[c.row_id] = (c.table, c.tenant, c.version)


async def resolve_uncertain(url: str, changes: list[Change]) -> list[Change]:
    """The changes that did commit, deciding the uncertain ones from the database."""
    committed = []
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for c in changes:
            if not c.uncertain:
                committed.append(c)
                continue
            cur = await conn.execute(
                sql.SQL("SELECT version FROM {} WHERE id = %s").format(sql.Identifier(c.table)),
                (c.row_id,))
            row = await cur.fetchone()
            done = (row is None) if c.event.endswith(".delete") else \
                (row is not None and row[0] >= c.version)
            if done:
                committed.append(c)
    return committed


def start_worker(url: str) -> subprocess.Popen[bytes]:
    """A `webhooks worker` process with short timeouts, leases, retries and database
    deadlines."""
    env = {**os.environ, "DATABASE_URL": url, "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true",
           "WEBHOOKS_DELIVERY_TIMEOUT": "1", "WEBHOOKS_LEASE": "4",
           "WEBHOOKS_WORKER_DB_TIMEOUT": "2", "WEBHOOKS_LISTEN_CHECK_INTERVAL": "2",
           # A hung connection of a backfill batch or of maintenance holds what its
           # transaction locked until it is abandoned: short here as the loop's deadline.
           "WEBHOOKS_BACKFILL_DB_TIMEOUT": "5", "WEBHOOKS_MAINTENANCE_DB_TIMEOUT": "10",
           "WEBHOOKS_DB_CONNECT_TIMEOUT": "2", "WEBHOOKS_DB_TCP_TIMEOUT": "6",
           "WEBHOOKS_POLL_INTERVAL": "1", "WEBHOOKS_RETRY_SCHEDULE": "0.5s,1s,1s,2s,2s,3s,5s,5s",
           "WEBHOOKS_LOG_LEVEL": "WARNING", "WEBHOOKS_SHUTDOWN_GRACE": "2"}
    return subprocess.Popen([sys.executable, "-m", "service", "worker"], env=env,
                            start_new_session=True)


def expected_for(changes: list[Change]) -> dict[str, set[tuple[str, str, int | None]]]:
    """The receipts each active subscription must get, keyed like the receivers record."""
    expected: dict[str, set[tuple[str, str, int | None]]] = {}
    for name, _resource, events, tenant, behaviour, active in SUBSCRIPTIONS:
        if not active or behaviour == "gone":
            continue
        keys = set()
        for c in changes:
            if c.event in events and (tenant is None or tenant == c.tenant):
                version = None if c.table == "audit" else c.version
                keys.add((c.event, c.row_id, version))
        expected[name] = keys
    return expected


async def chaos(seconds: float, writers: int, kills: int, seed: int, throttle: float) -> int:
    """Runs the scenario; 0 when nothing was lost."""
    rng = random.Random(seed)
    devdb.stop(DATADIR)
    devdb.start(DATADIR, PORT)
    admin = devdb.private_url(PORT)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS chaos WITH (FORCE)")
        conn.execute("CREATE DATABASE chaos")
    url = admin.rsplit("/", 1)[0] + "/chaos"
    db.migrate(url)
    receipts = Receipts()
    receiver = await receiver_for(receipts, rng, throttle).start(path="")
    base = receiver.url
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute(TABLES_SQL.encode())
        for name, resource, events, tenant, _, active in SUBSCRIPTIONS:
            subscribe(conn, f"{base}/{name}", events=events, resource=resource, tenant=tenant,
                      active=active, owner="chaos")

    proxy = Proxy(PORT)
    through = proxy.url(url)
    workers = [start_worker(through), start_worker(through)]
    deadline = time.monotonic() + seconds
    writer_objs = [Writer(url, seed + i, deadline) for i in range(writers)]
    writing = [asyncio.create_task(w.run()) for w in writer_objs]
    faults: list[str] = []
    plan = sorted(rng.uniform(0.1, 0.9) * seconds for _ in range(kills))
    restart_at = seconds * 0.5
    terminate_at = seconds * 0.3
    hangs = [seconds * 0.2, seconds * 0.7]
    started = time.monotonic()
    done_restart = done_terminate = False
    try:
        while time.monotonic() < deadline:
            elapsed = time.monotonic() - started
            if plan and elapsed >= plan[0]:
                plan.pop(0)
                victim = rng.randrange(len(workers))
                os.killpg(workers[victim].pid, signal.SIGKILL)
                workers[victim].wait()
                workers[victim] = start_worker(through)
                faults.append(f"{elapsed:5.1f}s SIGKILL worker {victim}")
            if not done_terminate and elapsed >= terminate_at:
                done_terminate = True
                with psycopg.connect(url, autocommit=True) as conn:
                    n = conn.execute("SELECT count(pg_terminate_backend(pid)) "
                                     "FROM pg_stat_activity WHERE application_name = "
                                     "'webhooks-listener'").fetchone()
                faults.append(f"{elapsed:5.1f}s terminated {n[0] if n else 0} LISTEN "
                              "connection(s)")
            if hangs and elapsed >= hangs[0]:
                hangs.pop(0)
                held = len(proxy.links)
                proxy.hang()
                faults.append(f"{elapsed:5.1f}s {held} worker connection(s) stop answering")
            if not done_restart and elapsed >= restart_at:
                done_restart = True
                await asyncio.to_thread(devdb.restart, DATADIR, PORT)
                faults.append(f"{elapsed:5.1f}s restarted PostgreSQL")
            await asyncio.sleep(0.1)
        await asyncio.gather(*writing)

        changes = await resolve_uncertain(url, [c for w in writer_objs for c in w.changes])
        expected = expected_for(changes)
        # The backlog drains after the writers stop: wait while deliveries keep arriving,
        # and call what is missing lost only after NO_PROGRESS s without any (10 min at most).
        give_up = time.monotonic() + 600
        last_count, last_progress = -1, time.monotonic()
        while time.monotonic() < give_up:
            if all(keys <= set(receipts.got.get(n, [])) for n, keys in expected.items()):
                break
            count = sum(len(v) for v in receipts.got.values())
            if count != last_count:
                last_count, last_progress = count, time.monotonic()
            elif time.monotonic() - last_progress > NO_PROGRESS:
                break
            await asyncio.sleep(0.5)
        drained_in = time.monotonic() - deadline
    finally:
        for w in workers:
            if w.poll() is None:
                os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
        await receiver.stop()
        proxy.close()

    with psycopg.connect(url, autocommit=True) as conn:
        gone_active = conn.execute("SELECT active FROM webhooks.subscriptions "
                                   "WHERE target LIKE '%/gone'").fetchone()
        # Where the work stands, to tell a stalled queue from a delivery failed for good.
        queue = conn.execute(
            "SELECT split_part(s.target, '/', 4), d.status, count(*),"
            "       max(d.attempts), count(*) FILTER (WHERE d.lease_expires_at > now()),"
            "       round(extract(epoch FROM max(d.next_attempt_at) - now())::numeric, 1)"
            "  FROM webhooks.deliveries d JOIN webhooks.subscriptions s"
            "    ON s.id = d.subscription_id"
            " WHERE d.status <> 'succeeded' GROUP BY 1, 2 ORDER BY 1, 2").fetchall()
        left = conn.execute("SELECT (SELECT count(*) FROM webhooks.outbox),"
                            " (SELECT count(*) FROM webhooks.rejected_changes)").fetchone()
    devdb.stop(DATADIR)

    lost = sum(len(keys - set(receipts.got.get(n, []))) for n, keys in expected.items())
    delivered = sum(len(set(receipts.got.get(n, [])) & keys) for n, keys in expected.items())
    duplicates = sum(len(v) - len(set(v)) for v in receipts.got.values())
    unexpected = sum(len(set(receipts.got.get(n, [])) - keys) for n, keys in expected.items())
    inactive = len(receipts.got.get("inactive", []))
    rows = [
        ("changes committed", len(changes)),
        ("changes rolled back", sum(w.rolled_back for w in writer_objs)),
        ("deliveries expected", sum(len(k) for k in expected.values())),
        ("delivered", delivered),
        ("lost", lost),
        ("duplicates", duplicates),
        ("unexpected (rolled back or wrong tenant)", unexpected),
        ("received by the inactive subscription", inactive),
        ("5xx answered", receipts.statuses[500]),
        ("429 answered", receipts.statuses[429]),
        ("410 answered", receipts.statuses[410]),
        ("writer reconnects", sum(w.errors for w in writer_objs)),
        ("seconds to drain after the writers stopped", round(drained_in, 1)),
    ]
    print("\nfaults injected:")
    for f in faults:
        print(f"  {f}")
    print("\n" + "\n".join(f"  {name:<42} {value:>8}" for name, value in rows))
    ok = lost == 0 and unexpected == 0 and inactive == 0 and gone_active == (False,)
    if not ok:
        print(f"\n  outbox rows left {left[0] if left else '?'}, changes set aside "
              f"{left[1] if left else '?'}; deliveries not succeeded (subscription, status, "
              "count, most attempts, leased, seconds until the latest is due):")
        for row in queue:
            print("    " + " ".join(str(v) for v in row))
    if gone_active != (False,):
        print("  the subscription answering 410 is still active")
    print(f"\nchaos: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main() -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=4)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--throttle", type=float, default=0.2,
                        help="the share of the throttled target's answers that are 429")
    parser.add_argument("--short", action="store_true",
                        help="the CI version: 12 s, 2 writers, 5%% of answers 429")
    args = parser.parse_args()
    if args.short:
        # Each 429 halves what the throttled target is sent at once: at 20%, the drain of
        # its backlog was most of the run.
        args.seconds, args.writers, args.kills, args.throttle = 12, 2, 2, 0.05
    print(f"chaos: {args.seconds:g} s, {args.writers} writers, {args.kills} worker kills, "
          f"seed {args.seed}")
    return asyncio.run(chaos(args.seconds, args.writers, args.kills, args.seed,
                             args.throttle))


if __name__ == "__main__":
    raise SystemExit(main())
