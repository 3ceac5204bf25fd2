"""`webhooks status`: what the service is doing, for an operator and a DBA, at a glance."""

from __future__ import annotations

import json
import time
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import psycopg

from service import db
from service.config import Settings
from service.logs import printable, printable_json
from service.store import SyncStore


def collect(conn: psycopg.Connection) -> dict[str, Any]:
    """Every figure `webhooks status` shows, as plain data."""
    store = SyncStore(conn)
    rejected = store.status_rejected()
    return {
        "attachments": store.status_attachments(),
        "subscriptions": store.status_subscriptions(),
        "partitions": store.status_partitions(),
        "deliveries": store.status_deliveries(),
        "last_hour": store.status_attempts(),
        "failing": store.status_failing(),
        "lifecycle": {**store.status_lifecycle_counts(),
                      "subscriptions": store.status_lifecycle()},
        "stopped": store.status_stopped(),
        "outbox": store.status_outbox(),
        "worker_tasks": store.status_worker_tasks(),
        "workers": store.status_workers(),
        "backfills": store.status_backfills(),
        "rejected": {
            "total": rejected[0]["total"] if rejected else 0,
            "latest": [{k: r[k] for k in ("table_name", "event", "reason", "set_aside_at")}
                       for r in rejected if r["table_name"] is not None],
        },
    }


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _ago(unix: float | None) -> str:
    """`2.5s ago` for a Unix time reported by a worker; `none yet` for None."""
    if unix is None:
        return "none yet"
    return f"{_age(max(time.time() - float(unix), 0.0))} ago"


def _count(n: Any, noun: str, plural: str | None = None) -> str:
    """`1 change`, `2 changes`: the number with its noun, singular or plural."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def printable_data(value: Any) -> Any:
    """The figures with every text escaped (service.logs.printable): table names, targets,
    owners and error messages come from the database, and printed raw a control character
    in one would drive the operator's terminal."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_data(v) for v in value]
    return value


def render(data: dict[str, Any]) -> str:
    """The figures as a short text report, every text from the database escaped."""
    data = printable_data(data)
    out: list[str] = ["Attached tables"]
    if not data["attachments"]:
        out.append("  none: attach one with SELECT webhooks.attach(...)")
    for a in data["attachments"]:
        nested = f" under {a['hook_resource']}" if a["hook_resource"] != a["resource"] else ""
        flags = [f for f, on in (("no row", not a["include_row"]), ("private", not a["public"]),
                                 (f"tenant={a['tenant_column']}", a["tenant_column"]),
                                 ("previous", a["include_previous"])) if on]
        out.append(f"  {a['table']:<24} {a['noun']}.create/update/delete/truncate{nested}"
                   f"  ({_count(a['subscriptions'], 'active subscription')}"
                   f"{', ' + ', '.join(flags) if flags else ''})")
    s, d, h, o = data["subscriptions"], data["deliveries"], data["last_hour"], data["outbox"]
    out += [
        "",
        f"Subscriptions   {s['active']} active, {s['inactive']} inactive, "
        f"{s['failing']} failing now; {s['filtered']} with a filter, {s['strict']} strict",
        f"Deliveries      {d['due']} due, {d['pending']} pending ({d['retrying']} retrying), "
        f"{d['failed']} failed for good",
        f"Oldest pending  {_age(d['oldest_pending_seconds'])}",
        f"Last hour       {_count(h['attempts'], 'attempt')}, "
        f"{_count(h['failures'], 'failure')}",
        f"Outbox backlog  {_count(o['events'], 'change')} in "
        f"{_count(o['statements'], 'statement')}, "
        f"oldest {_age(o['oldest_seconds'])}",
    ]
    parts = data.get("partitions")
    if parts:
        out.append("Partitions      " + ", ".join(
            f"{p['parent']} {p['partitions']} (from {p['oldest'][:10]}, made until "
            f"{p['ahead_until'][:10]})" for p in parts))
    if data["failing"]:
        out += ["", "Failing most (last hour)"]
        for f in data["failing"]:
            out.append(f"  #{f['id']:<6} {f['failures']:>5} "
                       f"{'failure ' if f['failures'] == 1 else 'failures'}  last status "
                       f"{f['last_status']}  {f['target']}  {f['last_failure'] or ''}")
    lifecycle = data.get("lifecycle")
    if lifecycle is not None:
        out += ["", f"Failure lifecycle  {lifecycle['failing']} failing since their last "
                    f"success ({lifecycle['notified']} past WEBHOOKS_FAILING_AFTER), "
                    f"{lifecycle['disabled']} disabled automatically"]
        for x in lifecycle["subscriptions"]:
            if x["disabled_at"] is not None:
                state = f"disabled {x['disabled_at']:%Y-%m-%d %H:%M:%S}"
            else:
                state = (f"failing for {_age(x['failing_seconds'])}"
                         + (" (webhook.failing sent)" if x["notified"] else ""))
            out.append(f"  #{x['id']:<6} {x['owner']}  {state}  {x['target']}  "
                       f"{x['last_failure'] or ''}")
    stopped = data.get("stopped")
    if stopped:
        out += ["", "Stopped by the service  (inactive until their events are sent again)"]
        for x in stopped:
            out.append(f"  #{x['id']:<6} {x['owner']}  {x['resource']}  {x['target']}  "
                       f"{x['inactive_reason']}")
    rejected = data.get("rejected")
    if rejected is not None:
        out += ["", f"Set-aside changes  {rejected['total']}"
                    + ("  (rows that could not become events; latest first)"
                       if rejected["total"] else "")]
        for r in rejected["latest"]:
            out.append(f"  {r['set_aside_at']:%Y-%m-%d %H:%M:%S}  {r['table_name']}  "
                       f"{r['event']}  {r['reason']}")
    backfills = data.get("backfills")
    if backfills:
        out += ["", "Backfills       running, and failed in the last day"]
        for b in backfills:
            state = (f"running, last batch {_age(b['idle_seconds'])} ago"
                     if b["status"] == "running" else f"failed: {b['error'] or ''}")
            out.append(f"  #{b['id']:<6} webhook #{b['subscription_id']}  "
                       f"{_count(b['rows'], 'row')} queued  {state}  [{b['progress'] or ''}]")
    workers = data.get("workers")
    if workers is not None:
        out += ["", "Workers         " + ("none running (no LISTEN connection)" if not workers
                                       else "last completed round, last LISTEN proof")]
        for w in workers:
            out.append(f"  {w['worker'] or 'pid ' + str(w['pid'])}  round "
                       f"{_ago(w['last_round'])}, proof {_age(w['proved_seconds_ago'])} ago")
    tasks = data.get("worker_tasks")
    if tasks is not None:
        if not tasks:
            out += ["", "Worker tasks    no crash in the last day"]
        else:
            out += ["", "Worker tasks    crashed and restarted (last day)"]
            for t in tasks:
                out.append(f"  {t['worker']}  {t['task']:<9} "
                           f"{_count(t['restarts'], 'restart')}, last "
                           f"{_age(t['seconds_ago'])} ago: {t['last_error'] or ''}")
    return "\n".join(out)


def _json_value(value: Any) -> Any:
    """Numbers as JSON numbers (PostgreSQL's numeric arrives as Decimal), times as ISO
    text, anything else as its text."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return str(value)


def print_status(settings: Settings, as_json: bool = False) -> int:
    """Prints the report (or JSON) for the configured database."""
    with db.connect(settings.database_url) as conn:
        data = collect(conn)
    # JSON escapes every control character but DEL; printable_json that one too.
    print(printable_json(json.dumps(data, default=_json_value, indent=2)) if as_json
          else render(data))
    return 0
