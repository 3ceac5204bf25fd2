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

_SECRETS = re.compile(r"(whsec_|wht_)[A-Za-z0-9+/=_-]+")
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "color_message"}


def redact(text: str) -> str:
    """The text with webhook secrets and API tokens masked."""
    # Most lines hold neither prefix: two substring tests are far cheaper than the regex,
    # and this runs once per delivery attempt.
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
        return redact(line)


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
        return redact(json.dumps(data, default=str))


def setup_logging(fmt: str = "text", level: str = "INFO") -> None:
    """Configures the root logger for the chosen format, once per process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "uvicorn.access", "yoyo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
