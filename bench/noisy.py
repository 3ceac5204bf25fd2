"""Scenario noisy_neighbour: one owner ("noisy") loads the fan-out, the queue and the API
that every owner shares; another owner's ("quiet") delivery latency and API p99, beside the
same measures without the load, in the same run.

The loads, each from the noisy owner alone:
- filters: 1,000 active subscriptions to the table's creates whose filters never match,
  then 40 single-row inserts; the quiet owner's subscription gets a row committed right
  after them, and its commit-to-receipt time is measured. Two sizes: as large as the API
  admits (WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER spread over the 1,000), and, for reference,
  filters of 20 conditions x 100 `nin` values (about 30 KB compiled each), which the API
  took before filters had a budget and which are inserted here directly, past the API;
- list: 1,000 subscriptions with 8 KB filters (the most a filter may have; 41 KB before
  the budget) and four clients fetching `GET /api/v1/webhooks/?limit=1000` in a loop;
- activation: 12 concurrent re-activations (`PUT {"active": true}`) while an application
  transaction that wrote to the table stays open, so that every one waits for it;
- wide rows: a 300-column row of about 900 KB, attached with include_previous and
  subscribed to by the noisy owner, updated twice; then the quiet row, as for filters;
- backfills: 20 running backfills of a 5,000-row table by the noisy owner (started in SQL,
  past WEBHOOKS_MAX_BACKFILLS_PER_OWNER), then one by the quiet owner: the time to its
  first snapshot;
- subscriptions elsewhere: 20,000 subscriptions of the noisy owner to another table,
  which nobody writes to: the quiet owner's commit-to-receipt p50 over 20 rows, each sent
  alone, against the same with none (every fan-out looks up who wants each change);
- a strict queue: a strict subscription of the noisy owner to another table, whose first
  delivery fails (connection refused) and holds the 20,000 after it (5,000 quick); the
  quiet owner's 2,000 rows in one statement, commit to the last receipt, against the same
  with no strict queue (every claim reads the held deliveries).
The quiet owner's `GET /api/v1/webhooks/` runs one request after another during each load
(and alone, for the limit); its p99 is reported. Subscriptions are inserted directly (no
handshake), with their filters compiled by service/filters.py as the API would.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg

from bench.api import free_port
from bench.common import (
    PYTHON,
    Result,
    ceiling_result,
    connect,
    create_table,
    info_result,
    percentile,
    reset_service_state,
    wait_until,
)
from bench.context import Context
from bench.load import receipt_ms
from service import filters, tokens
from service.api.handshake import new_secret
from service.config import Settings

TABLE = "noisy_rows"
COLUMNS = 20
NOISY = 1000
WRITES = 40
ACTIVATIONS = 12


def _create_table(conn: psycopg.Connection[Any]) -> None:
    conn.execute(f"DROP TABLE IF EXISTS public.{TABLE} CASCADE")
    cols = ", ".join(f"c{i} text DEFAULT 'x'" for i in range(1, COLUMNS + 1))
    conn.execute(f"CREATE TABLE public.{TABLE} (id bigint GENERATED ALWAYS AS IDENTITY"
                 f" PRIMARY KEY, {cols})")
    conn.execute("SELECT webhooks.attach(%s::regclass, resource => %s, noun => 'noisy_row')",
                 (f"public.{TABLE}", TABLE))


def heavy_filter() -> dict[str, Any]:
    """20 x 100 `nin` values; every column holds 'x', which only the last list names, so
    every value is compared and the filter never passes."""
    out: dict[str, Any] = {f"c{i}": {"nin": [f"v{i:02}-{j:03}" for j in range(100)]}
                           for i in range(1, COLUMNS)}
    out[f"c{COLUMNS}"] = {"nin": [f"v-{j:03}" for j in range(99)] + ["x"]}
    return out


def admitted_filter(conn: psycopg.Connection[Any], budget: int, count: int
                    ) -> dict[str, Any]:
    """The largest never-passing filter of this shape whose compiled bytes (as Postgres
    counts them, which the API does), `count` times, stay within the owner's `budget`."""
    best: dict[str, Any] = {"c1": {"nin": ["x"]}}
    for n in range(2, 101):
        candidate = {"c1": {"nin": [f"v-{j:03}" for j in range(n - 1)] + ["x"]}}
        (size,) = conn.execute("SELECT octet_length(%s::jsonpath::text)",
                               (filters.compile_path(candidate),)).fetchone() or (0,)
        if size * count > budget:
            break
        best = candidate
    return best


def list_filter(budgeted: bool) -> dict[str, Any]:
    """A filter of about 8 KB as JSON, the most a filter may have; 41 KB (which the API
    took before filters had a budget) when `budgeted` is false."""
    pad = 68 if budgeted else 400
    return {"c1": {"nin": [f"{j:03}-" + "y" * pad for j in range(100)]}}


def _subscribe(conn: psycopg.Connection[Any], owner: str, count: int, target: str,
               events: list[str], filter_: dict[str, Any] | None, active: bool = True,
               resource: str = TABLE) -> list[int]:
    path = filters.compile_path(filter_) if filter_ else None
    rows = conn.execute(
        "INSERT INTO webhooks.subscriptions (owner, resource, events, target, secret, active,"
        " filter, filter_path) SELECT %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonpath"
        " FROM generate_series(1, %s) RETURNING id",
        (owner, resource, events, target, new_secret(), active,
         json.dumps(filter_) if filter_ else None, path, count)).fetchall()
    return [r[0] for r in rows]


WIDE_COLUMNS = 300
WIDE_BYTES = 3000
BACKFILLS = 20
BACKFILL_ROWS = 5000
ELSEWHERE = 20_000
ELSEWHERE_ROWS = 20
STRICT_QUEUE = 20_000
QUIET_ROWS = 2_000


def _wide_table(conn: psycopg.Connection[Any]) -> str:
    """A 300-column table of one ~900 KB row, attached with include_previous; returns the
    UPDATE that changes every other column."""
    conn.execute("DROP TABLE IF EXISTS public.wide_rows")
    cols = ", ".join(f"c{i} text" for i in range(1, WIDE_COLUMNS + 1))
    conn.execute(f"CREATE TABLE public.wide_rows (id int PRIMARY KEY, {cols})")
    conn.execute("SELECT webhooks.attach('public.wide_rows', 'wide_rows', 'wide_row',"
                 " include_previous => true)")
    values = ", ".join(f"repeat('{chr(97 + i % 26)}', {WIDE_BYTES})"
                       for i in range(1, WIDE_COLUMNS + 1))
    conn.execute(f"INSERT INTO public.wide_rows VALUES (1, {values})")
    sets = ", ".join(f"c{i} = c{i} || 'x'" for i in range(1, WIDE_COLUMNS + 1, 2))
    return f"UPDATE public.wide_rows SET {sets}"


def _backfills(ctx: Context, conn: psycopg.Connection[Any]) -> Result:
    """Seconds from the start of the quiet owner's backfill to its first snapshot, while
    the noisy owner's BACKFILLS run, beside the same alone."""
    conn.execute(f"INSERT INTO public.{TABLE} SELECT FROM generate_series(1, %s)",
                 (BACKFILL_ROWS,))
    quiet = _subscribe(conn, "quiet-backfill", 1, ctx.target("lat"), ["noisy_row.create"],
                       None)[0]

    def first_snapshot() -> float | None:
        wait_until(lambda: _idle(conn), 300, interval=0.1)
        ctx.reset_receiver()
        conn.execute("SELECT webhooks.start_backfill(%s)", (quiet,))
        started = time.time()
        if not wait_until(lambda: bool(ctx.times()), 120, interval=0.02):
            return None
        first = min(t for _, t in ctx.times()) - started
        conn.execute("UPDATE webhooks.backfills SET status = 'done' WHERE status = 'running'")
        return first

    alone = first_snapshot()
    noisy = _subscribe(conn, "noisy", BACKFILLS, ctx.target("noisy"), ["noisy_row.create"],
                       None)
    for sid in noisy:
        conn.execute("SELECT webhooks.start_backfill(%s)", (sid,))
    loaded = first_snapshot()
    conn.execute("DELETE FROM webhooks.subscriptions WHERE owner = 'quiet-backfill'")
    return ceiling_result(
        "noisy_neighbour: quiet backfill's first snapshot", loaded, alone, "s", 2.0,
        f"{BACKFILLS} noisy backfills of a {BACKFILL_ROWS:,}-row table running (started in "
        "SQL, past WEBHOOKS_MAX_BACKFILLS_PER_OWNER); limit = the quiet backfill alone")


def _one_by_one(ctx: Context, conn: psycopg.Connection[Any], rows: int) -> list[float]:
    """Commit-to-receipt ms of `rows` quiet rows, each committed once the one before it
    arrived."""
    out: list[float] = []
    for _ in range(rows):
        ctx.reset_receiver()
        out.append(receipt_ms(ctx, conn, f"INSERT INTO public.{TABLE} DEFAULT VALUES "
                              "RETURNING id", (), "a quiet row"))
    return out


def _elsewhere(ctx: Context, conn: psycopg.Connection[Any]) -> Result:
    """The quiet owner's latency beside ELSEWHERE subscriptions to another table."""
    wait_until(lambda: _idle(conn), 120, interval=0.1)
    alone = _one_by_one(ctx, conn, ELSEWHERE_ROWS)
    create_table(conn, "elsewhere_rows", attach="elsewhere_rows")
    _subscribe(conn, "noisy", ELSEWHERE, ctx.target("noisy"), ["elsewhere_row.create"],
               None, resource="elsewhere_rows")
    conn.execute("ANALYZE webhooks.subscription_events")  # as autovacuum would, soon
    crowded = _one_by_one(ctx, conn, ELSEWHERE_ROWS)
    _drop_owner(conn, "noisy")
    conn.execute("DROP TABLE public.elsewhere_rows")
    p50, limit = percentile(crowded, 50), percentile(alone, 50)
    ratio = p50 / limit if limit else None
    return Result(
        "noisy_neighbour: quiet latency p50 beside 20,000 subscriptions elsewhere", p50,
        limit, "ms", "ratio ≤ 1.5", None if ratio is None else ratio <= 1.5, ratio,
        f"{ELSEWHERE:,} subscriptions of the noisy owner to another table (no writes), "
        f"{ELSEWHERE_ROWS} quiet rows committed one at a time; p90 "
        f"{percentile(crowded, 90):.1f} ms; limit = the same rows with none "
        f"(p90 {percentile(alone, 90):.1f} ms)")


def _quiet_drain(ctx: Context, conn: psycopg.Connection[Any], rows: int) -> float | None:
    """Seconds from the commit of `rows` quiet rows (one statement) to the last one's
    receipt (None: not within two minutes)."""
    ctx.reset_receiver()
    ids = {r[0] for r in conn.execute(
        f"INSERT INTO public.{TABLE} SELECT FROM generate_series(1, %s) RETURNING id",
        (rows,)).fetchall()}
    committed = time.time()
    got: dict[int, float] = {}

    def arrived() -> bool:
        got.update((i, t) for i, t in ctx.times() if i in ids)
        return len(got) == len(ids)

    if not wait_until(arrived, 120, interval=0.02):
        return None
    return max(got.values()) - committed


def _strict_queue(ctx: Context, conn: psycopg.Connection[Any]) -> Result:
    """The quiet owner's burst beside a strict subscription whose queue waits behind a
    failing first delivery."""
    queue = STRICT_QUEUE // 4 if ctx.quick else STRICT_QUEUE
    wait_until(lambda: _idle(conn), 120, interval=0.1)
    alone = _quiet_drain(ctx, conn, QUIET_ROWS)
    create_table(conn, "strict_rows", attach="strict_rows")
    # Port 9 refuses connections: the first delivery fails and waits for its retry, and
    # strict order holds every later one behind it.
    try:
        (sid,) = _subscribe(conn, "noisy", 1, "http://127.0.0.1:9/strict",
                            ["strict_row.create"], None, resource="strict_rows")
        conn.execute("UPDATE webhooks.subscriptions SET ordering = 'strict' WHERE id = %s",
                     (sid,))
        conn.execute("INSERT INTO public.strict_rows (a)"
                     " SELECT g FROM generate_series(1, %s) g", (queue,))

        def held() -> bool:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM webhooks.outbox),"
                " (SELECT count(*) FROM webhooks.deliveries WHERE subscription_id = %s"
                "   AND status = 'pending' AND attempts > 0 AND next_attempt_at > now()),"
                " (SELECT count(*) FROM webhooks.deliveries WHERE subscription_id = %s"
                "   AND status = 'pending')", (sid, sid)).fetchone()
            return row is not None and row[0] == 0 and row[1] == 1 and row[2] == queue

        if not wait_until(held, 120, interval=0.1):
            raise RuntimeError("the strict queue was not fanned out and held within 120 s")
        beside = _quiet_drain(ctx, conn, QUIET_ROWS)
        (pending,) = conn.execute("SELECT count(*) FROM webhooks.deliveries"
                                  " WHERE subscription_id = %s AND status = 'pending'",
                                  (sid,)).fetchone() or (0,)
    finally:
        _drop_owner(conn, "noisy")
        conn.execute("DROP TABLE public.strict_rows")
    ratio = beside / alone if beside is not None and alone else None
    return Result(
        "noisy_neighbour: quiet burst beside a strict queue held by its first delivery",
        beside, alone, "s", "ratio ≤ 1.5", None if ratio is None else ratio <= 1.5, ratio,
        f"{QUIET_ROWS:,} quiet rows in one statement, commit to the last receipt, while "
        f"the noisy owner's strict subscription holds {queue:,} deliveries behind a first "
        f"one that fails (connection refused, retried later; {pending:,} still pending at "
        "the end): every claim reads them; limit = the same rows with no strict queue")


def _drop_owner(conn: psycopg.Connection[Any], owner: str) -> None:
    conn.execute("DELETE FROM webhooks.subscriptions WHERE owner = %s", (owner,))


def _idle(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT (SELECT count(*) FROM webhooks.outbox)"
                       " + (SELECT count(*) FROM webhooks.deliveries"
                       "    WHERE status = 'pending')").fetchone()
    return row is not None and row[0] == 0


def _late(ctx: Context, conn: psycopg.Connection[Any], timeout: float,
          noisy: Callable[[], None] | None = None) -> float | None:
    """Seconds from the commit of a quiet row written right after the noisy owner's writes
    (default: WRITES inserts its subscriptions match) to its receipt (None: not within
    `timeout`)."""
    wait_until(lambda: _idle(conn), 120, interval=0.1)
    ctx.reset_receiver()
    if noisy is not None:
        noisy()
    for _ in range(WRITES if noisy is None else 0):
        conn.execute(f"INSERT INTO public.{TABLE} DEFAULT VALUES")
    row = conn.execute(f"INSERT INTO public.{TABLE} DEFAULT VALUES RETURNING id").fetchone()
    committed = time.time()
    assert row is not None
    last = row[0]
    got: dict[int, float] = {}

    def arrived() -> bool:
        got.update(dict(ctx.times()))
        return last in got

    if not wait_until(arrived, timeout, interval=0.02):
        return None
    return got[last] - committed


@contextlib.contextmanager
def _api(ctx: Context) -> Iterator[str]:
    port = free_port()
    env = {"DATABASE_URL": ctx.url, "WEBHOOKS_RATE_LIMIT": "0",
           "WEBHOOKS_ALLOW_PRIVATE_TARGETS": "true"}
    with ctx.procs.running_proc("api", [PYTHON, "-m", "service", "api", "--host",
                                        "127.0.0.1", "--port", str(port)], env=env,
                                profile=ctx.profile_path("api")) as api:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        if not wait_until(lambda: not api.alive() or healthy(), 30) or not api.alive():
            raise RuntimeError(f"the API did not start: {api.tail()}")
        yield base


def _p99(base: str, token: str, seconds: float) -> tuple[float, float, str]:
    """The quiet owner's list, one request after another: p99 and max (ms, every answer
    counted), and how many requests, and how many were not 200."""
    took: list[float] = []
    failed = 0
    with httpx.Client(base_url=base, timeout=60,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            response = client.get("/api/v1/webhooks/")
            took.append((time.monotonic() - t0) * 1000)
            failed += response.status_code != 200
    return percentile(took, 99), max(took), f"{len(took)} requests, {failed} not 200"


@contextlib.contextmanager
def _looping(work: Callable[[], None], threads: int) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            work()

    started = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for t in started:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in started:
            t.join(60)


def scenario(ctx: Context) -> list[Result]:
    """The quiet owner's delivery lateness (≤ 2 s) and API p99 (≤ 500 ms) beside one noisy
    owner's filters, list pages and waiting activations."""
    seconds = 3.0 if ctx.quick else 8.0
    settings = Settings.from_env({})
    budget = getattr(settings, "max_filter_bytes_per_owner", None)
    results: list[Result] = []
    with connect(ctx.url) as conn:
        reset_service_state(conn)
        _create_table(conn)
        create = ["noisy_row.create"]
        _subscribe(conn, "quiet", 1, ctx.target("lat"), create, None)
        quiet = tokens.create(conn, "quiet")[1]
        noisy = tokens.create(conn, "noisy")[1]

        # -- filters: the quiet owner's next delivery --------------------------------
        with ctx.worker():
            alone = _late(ctx, conn, 120)
            rows: list[tuple[str, dict[str, Any], str]] = []
            if budget is not None:
                rows.append(("admitted", admitted_filter(conn, budget, NOISY),
                             f"the most WEBHOOKS_MAX_FILTER_BYTES_PER_OWNER ({budget:,}) "
                             "admits"))
            rows.append(("20x100 nin, past the API", heavy_filter(),
                         "inserted directly: the API refuses such filters now"
                         if budget is not None else "what the API admitted"))
            for label, filter_, why in rows:
                _drop_owner(conn, "noisy")
                _subscribe(conn, "noisy", NOISY, ctx.target("noisy"), create, filter_)
                (compiled,) = conn.execute(
                    "SELECT sum(octet_length(filter_path::text)) FROM webhooks.subscriptions"
                    " WHERE owner = 'noisy'").fetchone() or (0,)
                late = _late(ctx, conn, 180)
                notes = (f"{NOISY:,} noisy subscriptions, filters {why}: "
                         f"{filters.literals(filter_) if hasattr(filters, 'literals') else '?'}"
                         f" values, {int(compiled or 0):,} compiled bytes in all; "
                         f"{WRITES} noisy inserts, then the quiet row; "
                         f"limit = the same with no noisy subscription")
                name = f"noisy_neighbour: quiet delivery late, {label}"
                results.append(ceiling_result(name, late, alone, "s", 2.0, notes)
                               if label == "admitted" else
                               info_result(name, late, alone, "s", notes))
            _drop_owner(conn, "noisy")

            # -- wide rows: the quiet owner's next delivery --------------------------------
            wide = _wide_table(conn)
            _subscribe(conn, "noisy", 1, ctx.target("noisy"), ["wide_row.update"], None,
                       resource="wide_rows")

            def update_twice() -> None:
                for _ in range(2):
                    conn.execute(wide)

            late = _late(ctx, conn, 180, update_twice)
            results.append(ceiling_result(
                "noisy_neighbour: quiet delivery late, 900 KB rows updated", late, alone,
                "s", 2.0, f"a {WIDE_COLUMNS}-column row of about "
                f"{WIDE_COLUMNS * WIDE_BYTES // 1000:,} KB attached with include_previous, "
                "updated twice (every other column) by the noisy owner's subscription's "
                "table, then the quiet row; limit = the quiet row alone"))
            _drop_owner(conn, "noisy")
            conn.execute("DROP TABLE public.wide_rows")

            # -- backfills: the quiet owner's first snapshot -------------------------------
            results.append(_backfills(ctx, conn))
            _drop_owner(conn, "noisy")

            # -- subscriptions elsewhere: the quiet owner's latency ------------------------
            results.append(_elsewhere(ctx, conn))

            # -- a strict queue held by its first delivery: the quiet owner's burst -------
            results.append(_strict_queue(ctx, conn))

        with _api(ctx) as base:
            p99_alone, max_alone, count_alone = _p99(base, quiet, seconds)

            # -- list: 1,000 large subscriptions, pages of 1,000 -------------------------
            _subscribe(conn, "noisy", NOISY, ctx.target("noisy"),
                       ["noisy_row.create", "noisy_row.update", "noisy_row.delete"],
                       list_filter(budget is not None))
            (registry,) = conn.execute(
                "SELECT pg_total_relation_size('webhooks.subscription_events')"
            ).fetchone() or (0,)
            sizes: list[int] = []
            with httpx.Client(base_url=base, timeout=120,
                              headers={"Authorization": f"Bearer {noisy}"}) as client:
                def fetch() -> None:
                    sizes.append(len(client.get("/api/v1/webhooks/?limit=1000").content))

                fetch()
                with _looping(fetch, 4):
                    p99_list, max_list, count_list = _p99(base, quiet, seconds)
            results.append(ceiling_result(
                "noisy_neighbour: quiet API p99, beside 1,000-row list pages", p99_list,
                p99_alone, "ms", 500,
                f"4 noisy clients fetching ?limit=1000 ({max(sizes):,} bytes a page, "
                f"{len(sizes)} pages); quiet max {max_list:.0f} ms, {count_list}; "
                f"limit = quiet alone (p99 {p99_alone:.1f} ms, max {max_alone:.0f} ms, "
                f"{count_alone})"))
            results.append(info_result(
                "noisy_neighbour: subscription_events size, 1,000 x 3 events, filters of "
                f"{len(json.dumps(list_filter(budget is not None))) // 1000} KB",
                registry / 1e6, None, "MB", "pg_total_relation_size"))
            _drop_owner(conn, "noisy")

            # -- activation: 12 re-activations wait for an open writer ---------------------
            paused = _subscribe(conn, "noisy", ACTIVATIONS, ctx.target("noisy"), create,
                                None, active=False)
            answers: list[int] = []
            with psycopg.connect(ctx.url) as writer:
                writer.execute(f"INSERT INTO public.{TABLE} DEFAULT VALUES")

                def activate(sid: int) -> None:
                    answers.append(httpx.put(
                        f"{base}/api/v1/webhooks/{sid}", json={"active": True}, timeout=120,
                        headers={"Authorization": f"Bearer {noisy}"}).status_code)

                threads = [threading.Thread(target=activate, args=(sid,), daemon=True)
                           for sid in paused]
                for t in threads:
                    t.start()
                wait_until(lambda: (conn.execute(
                    "SELECT count(*) FROM webhooks.subscriptions WHERE owner = 'noisy'"
                    " AND active").fetchone() or (0,))[0] == ACTIVATIONS, 30)
                p99_act, max_act, count_act = _p99(base, quiet, min(seconds, 5.0))
                waiting = sum(t.is_alive() for t in threads)
                writer.commit()
            for t in threads:
                t.join(120)
            results.append(ceiling_result(
                "noisy_neighbour: quiet API p99, beside 12 waiting activations", p99_act,
                p99_alone, "ms", 500,
                f"{waiting} of {ACTIVATIONS} activations still waiting at the end of the "
                f"window (WEBHOOKS_VERIFY_TIMEOUT 10 s, pool 10); quiet max {max_act:.0f} ms, "
                f"{count_act};"
                f" answers {sorted(set(answers))}; limit = quiet alone"))
            _drop_owner(conn, "noisy")
    return results
