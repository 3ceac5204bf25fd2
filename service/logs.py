"""Logging: readable lines by default, one JSON object per line with WEBHOOKS_LOG_FORMAT=json.

Every record passes a redaction step, so a secret or token that slips into a message is
masked before it is written.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from urllib.parse import unquote

_SECRETS = re.compile(r"(whsec_|wht_)[A-Za-z0-9+/=_-]+")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "color_message"}


# The pieces of the database passwords no message may show (protect_url).
_PROTECTED: set[str] = set()

# Control characters (C0, DEL, C1), and the Unicode marks that end a line or reorder what
# follows them on screen: printed raw, a value from the database could move the cursor,
# retitle or recolour the operator's terminal, or hide the rest of a line.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The same inside JSON text, whose own whitespace (tab, newline, return) is kept: raw, the
# others can only stand inside its strings, where \uXXXX means the same character.
_JSON_CONTROLS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029"
                            "\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with its control characters escaped (`\\x1b`, `\\u202e`), for a terminal:
    what the commands print that came from the database or from a request."""
    return _CONTROLS.sub(_escaped, text)


def printable_json(text: str) -> str:
    """JSON text with the control characters inside its strings written as `\\u00XX`
    (the same JSON), for a terminal."""
    return _JSON_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def url_passwords(url: str) -> set[str]:
    """What may be the password of a connection URI, as written and percent-decoded: the
    user information's part after its first `:` (up to the last `@` before the query, so a
    password holding an unencoded `@` or `/` is covered whole) and a `password` parameter."""
    _, sep, rest = url.partition("://")
    if not sep:
        return set()
    found: list[str] = []
    head, _, query = rest.partition("?")
    userinfo, at, _ = head.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    for pair in query.split("&"):
        key, eq, value = pair.partition("=")
        if eq and unquote(key).strip() == "password":
            found.append(value)
    return {form for p in found for form in (p, unquote(p)) if form}


def password_pieces(url: str) -> set[str]:
    """Every run of four characters of the URI's password (the whole of a shorter one, of
    at least three): a message that holds none of them holds no part of the password of
    four characters or more."""
    pieces: set[str] = set()
    for password in url_passwords(url):
        if len(password) < 3:
            continue  # masking every such pair of letters would garble every message
        width = min(4, len(password))
        pieces.update(password[i:i + width] for i in range(len(password) - width + 1))
    return pieces


def protect_url(url: str) -> None:
    """From now on every log line and every message passed through redact() or scrub()
    masks any part of `url`'s password (DATABASE_URL's)."""
    _PROTECTED.update(password_pieces(url))


def scrub(text: str, pieces: set[str] | None = None) -> str:
    """`text` with every run of it that holds a piece of a protected password (or of
    `pieces`) replaced by `***`."""
    pieces = _PROTECTED if pieces is None else pieces
    if not pieces:
        return text
    for _ in range(8):  # masking can make a new piece next to the mask only when `*` is one
        spans = sorted((at, at + len(piece)) for piece in pieces
                       for at in _occurrences(text, piece))
        if not spans:
            break
        merged = [list(spans[0])]
        for start, end in spans[1:]:
            if start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        parts, kept = [], 0
        for start, end in merged:
            parts += [text[kept:start], "***"]
            kept = end
        text = "".join(parts) + text[kept:]
    return text


def _occurrences(text: str, piece: str) -> list[int]:
    found, at = [], text.find(piece)
    while at >= 0:
        found.append(at)
        at = text.find(piece, at + 1)
    return found


def redact(text: str) -> str:
    """The text with webhook secrets, API tokens and the database password masked."""
    # Most lines hold neither prefix: two substring tests are far cheaper than the regex,
    # and this runs once per delivery attempt.
    if _PROTECTED:
        text = scrub(text)
    if "whsec_" not in text and "wht_" not in text:
        return text
    return _SECRETS.sub(lambda m: m.group(1) + "***", text)


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """`time level logger message key=value ...`"""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%H:%M:%S", time.gmtime(record.created)) + \
            f".{int(record.msecs):03d}"
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        # One record, one line: libpq's messages carry hints on lines of their own.
        message = " | ".join(part.strip() for part in record.getMessage().splitlines())
        line = f"{when} {record.levelname:<7} {record.name}: {message}"
        if extra:
            line += " " + extra
        if record.exc_info and record.levelno >= logging.ERROR:
            # The exception's type and message, never a stack trace with locals in it.
            line += f" error={record.exc_info[0].__name__ if record.exc_info[0] else ''}: " \
                    f"{record.exc_info[1]}"
        # Control characters escaped: a table's name or a target in a message must not
        # drive the terminal the log is read on.
        return printable(redact(line))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extras."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        data.update(_fields(record))
        if record.exc_info and record.exc_info[0] is not None:
            data["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        # Masked before encoding too: JSON escapes a password's quotes, backslashes and
        # letters beyond ASCII, which the pieces would then no longer match.
        for key in ("message", "error"):
            if isinstance(data.get(key), str):
                data[key] = redact(str(data[key]))
        # JSON escapes every control character but DEL (printable_json).
        return printable_json(redact(json.dumps(data, default=str)))


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    """Configures the root logger for the chosen format, once per process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "uvicorn.access", "yoyo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
