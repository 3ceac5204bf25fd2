"""`webhooks deliveries list|show|redeliver` and `webhooks recover`: the delivery log and
recovery for operators. Redeliver and recover call the same SQL functions
as the REST API, webhooks.redeliver and webhooks.recover (sql/recovery.sql); an operator
sees every owner's subscriptions."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from service import db
from service.config import Settings
from service.logs import printable, printable_json
from service.store import StoreRejected, SyncStore

STATUSES = ("pending", "succeeded", "failed")
UNKNOWN, INACTIVE = "P0002", "55000"


def _time(text: str) -> datetime:
    """An ISO 8601 / RFC 3339 timestamp with a time zone, for argparse."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a timestamp: {text!r} (use RFC 3339, e.g. 2026-11-20T08:00:00Z)") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} has no time zone; add one, e.g. Z or +01:00")
    return value


def _fail(command: str, exc: StoreRejected) -> int:
    if exc.sqlstate in (UNKNOWN, INACTIVE):
        message = printable(str(exc).splitlines()[0])
        print(f"webhooks {command}: {message}", file=sys.stderr)
        return 1
    raise exc


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    with db.connect(settings.database_url) as conn:
        store = SyncStore(conn)
        if not store.subscription_exists(id=args.subscription_id):
            print(f"webhooks deliveries list: no subscription with id {args.subscription_id}",
                  file=sys.stderr)
            return 1
        rows = store.list_deliveries(
            subscription_id=args.subscription_id, status=args.status, event=args.event,
            since=args.since, until=args.until, before=args.before, limit=args.limit)
    print(f"{'id':>10}  {'event':<24} {'status':<10} {'tries':>5} {'last':>4}  "
          f"{'created':<19}  next attempt / finished")
    for r in rows:
        then = r["next_attempt_at"] if r["status"] == "pending" else r["finished_at"]
        last = "-" if r["last_status"] is None else str(r["last_status"])
        # A pending delivery with no next attempt waits behind an earlier one (strict).
        shown = "behind an earlier one" if r["status"] == "pending" and then is None \
            else _when(then)
        print(f"{r['id']:>10}  {printable(r['event']):<24} {r['status']:<10} {r['attempts']:>5} "
              f"{last:>4}  {_when(r['created_at']):<19}  {shown}")
    if len(rows) == args.limit:
        print(f"(more may remain: --before {rows[-1]['id']})")
    return 0


def _detail(conn: Any, delivery_id: int) -> dict[str, Any] | None:
    from service.api.deliveries import to_detail

    store = SyncStore(conn)
    row = store.get_delivery(id=delivery_id)
    if row is None:
        return None
    attempts = store.delivery_attempts(id=delivery_id)
    detail = to_detail(row, attempts)
    fields = {f: getattr(detail, f) for f in detail.__struct_fields__}
    return {"subscription_id": row["subscription_id"], **fields}


def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    with db.connect(settings.database_url) as conn:
        detail = _detail(conn, args.delivery_id)
    if detail is None:
        print(f"webhooks deliveries show: no delivery with id {args.delivery_id}",
              file=sys.stderr)
        return 1
    # msgspec keeps the payload's text as sent (json would turn 42.00 into 42.0); control
    # characters inside its strings are written as \u00XX (PostgreSQL's JSON leaves DEL,
    # C1 and the Unicode direction marks raw), the same JSON.
    print(printable_json(msgspec.json.format(msgspec.json.encode(detail), indent=2).decode()))
    return 0


def cmd_redeliver(args: argparse.Namespace, settings: Settings) -> int:
    with db.connect(settings.database_url) as conn:
        try:
            SyncStore(conn).redeliver(id=args.delivery_id)
        except StoreRejected as exc:
            return _fail("deliveries redeliver", exc)
    print(f"delivery {args.delivery_id} is pending again, due now")
    return 0


def cmd_recover(args: argparse.Namespace, settings: Settings) -> int:
    if args.until is not None and args.until <= args.since:
        print("webhooks recover: --until must be later than --since", file=sys.stderr)
        return 2
    with db.connect(settings.database_url) as conn:
        try:
            count = SyncStore(conn).recover(subscription_id=args.subscription_id,
                                            since=args.since, until=args.until)
        except StoreRejected as exc:
            return _fail("recover", exc)
    print(f"requeued {count} failed deliver{'y' if count == 1 else 'ies'} of subscription "
          f"{args.subscription_id}, in event order")
    return 0


def register(sub: Any, settings: Callable[[], Settings]) -> None:
    """Adds `deliveries` and `recover` to the `webhooks` command's subparsers."""
    def bind(command: Callable[[argparse.Namespace, Settings], int]
             ) -> Callable[[argparse.Namespace], int]:
        return lambda args: command(args, settings())

    p = sub.add_parser("deliveries", help="a subscription's deliveries: list, show, redeliver",
                       description="The delivery log: what was sent to a subscription, "
                                   "every attempt and its outcome; queue one again.")
    dsub = p.add_subparsers(dest="deliveries_command", required=True, metavar="ACTION")
    d = dsub.add_parser("list", help="deliveries of a subscription, newest first",
                        description="List a subscription's deliveries, newest first.")
    d.add_argument("subscription_id", type=int, help="subscription id")
    d.add_argument("--status", choices=STATUSES, help="only deliveries in this state")
    d.add_argument("--event", help="only this event name, e.g. invoice.create")
    d.add_argument("--since", type=_time, help="created at or after (RFC 3339)")
    d.add_argument("--until", type=_time, help="created before (RFC 3339)")
    d.add_argument("--before", type=int, help="only ids below this (the next page)")
    d.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    d.set_defaults(func=bind(cmd_list))
    d = dsub.add_parser("show", help="one delivery as JSON: payload and attempt log",
                        description="Print a delivery as JSON, as the REST API shows it: its "
                                    "payload as sent and every attempt, oldest first.")
    d.add_argument("delivery_id", type=int, help="delivery id (webhook-id msg_<id>)")
    d.set_defaults(func=bind(cmd_show))
    d = dsub.add_parser("redeliver", help="queue a delivery again, same id, due now",
                        description="Make a delivery, whatever its status, pending and due "
                                    "now, keeping its id, with a fresh retry schedule "
                                    "(SELECT webhooks.redeliver(id)). Fails while its "
                                    "subscription is inactive.")
    d.add_argument("delivery_id", type=int, help="delivery id")
    d.set_defaults(func=bind(cmd_redeliver))

    p = sub.add_parser("recover", help="queue a subscription's failed deliveries again",
                       description="Every failed delivery of the subscription created in "
                                   "[--since, --until) becomes pending and due now, keeping "
                                   "its id, and is sent again in event order "
                                   "(SELECT webhooks.recover(id, since, until)). Fails while "
                                   "the subscription is inactive.")
    p.add_argument("subscription_id", type=int, help="subscription id")
    p.add_argument("--since", type=_time, required=True,
                   help="start of the window, e.g. when the outage began (RFC 3339)")
    p.add_argument("--until", type=_time, default=None, help="end of the window (default: now)")
    p.set_defaults(func=bind(cmd_recover))
