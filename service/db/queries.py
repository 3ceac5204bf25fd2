"""The SQL files of the package and the named queries' text (loaded once, sent without
their comments)."""

from __future__ import annotations

import logging
import re
from functools import cache
from importlib.resources import files
from pathlib import Path


def resource_dir(name: str) -> Path:
    """The directory `name` (sql or migrations) of the installed package, or of the checkout.

    A built wheel carries them inside the package (pyproject.toml maps the checkout's
    top-level sql/ and migrations/ there); an editable install runs from the checkout.
    """
    packaged = files("service") / name
    if packaged.is_dir():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parent.parent.parent / name
    if checkout.is_dir():
        return checkout
    raise RuntimeError(f"the service's {name}/ files are missing from the installed package")


log = logging.getLogger("service.db")

SQL_DIR = resource_dir("sql")
MIGRATIONS_DIR = resource_dir("migrations")

# Taken while migrating, so two processes starting at once apply each migration once.
MIGRATION_LOCK = 0x77686B73  # "whks"

_NAME = re.compile(r"^--\s*name:\s*([a-z_][a-z0-9_]*)\s*--?\s*$", re.MULTILINE)


def parse_queries(text: str) -> dict[str, str]:
    """The queries of a file, keyed by the name in the `-- name: x --` line above each,
    each without its comments and indentation (see compact)."""
    queries: dict[str, str] = {}
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        queries[name] = compact(body)
    return queries


def compact(body: str) -> str:
    """A query as it is sent: its `--` comments (outside string literals) and indentation
    are for the reader of sql/queries. psycopg caches the parsing of a query's placeholders
    only for queries of at most 4 KB; the worker's claim, fan-out and record statements,
    run many times a second, were longer with their comments and were parsed again at
    every execution (the async store now sends them with PostgreSQL's placeholders,
    raw_query; the commands' plain connection still goes through psycopg's parsing)."""
    lines = []
    for line in body.splitlines():
        at = line.find("--")
        while at >= 0 and line.count("'", 0, at) % 2:  # inside a literal: not a comment
            at = line.find("--", at + 2)
        if at >= 0:
            line = line[:at]
        if line := line.strip():
            lines.append(line)
    return "\n".join(lines)


@cache
def queries() -> dict[str, str]:
    """Every named query in sql/queries/*.sql, loaded once."""
    found: dict[str, str] = {}
    for path in sorted((SQL_DIR / "queries").glob("*.sql")):
        for name, body in parse_queries(path.read_text()).items():
            if name in found:
                raise ValueError(f"query {name!r} is defined twice (again in {path.name})")
            found[name] = body
    return found


def query(name: str) -> str:
    """The SQL text of the named query."""
    return queries()[name]


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@cache
def raw_query(name: str) -> tuple[bytes, tuple[str, ...]]:
    """The named query with PostgreSQL's own placeholders ($1, $2, ...) and the parameter
    names they stand for, in order. Sent through a raw cursor, it is not parsed again at
    each execution: psycopg caches the parsing of a `%(name)s` query only up to 4 KB, and
    the fan-out is longer (its conversion took 45 us a statement, 9 us raw; the claim's
    is 13 us either way, mostly its arrays' dumping). A query without named placeholders
    is sent as it is, as psycopg sends it."""
    text = query(name)
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return "%"  # %% stands for a literal %
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    if "%(" in text:
        text = _PLACEHOLDER.sub(number, text)
    return text.encode(), tuple(names)
