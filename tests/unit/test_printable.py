"""What the commands and the logs print: control characters escaped, and no part of
DATABASE_URL's password in any message (service.logs); a DATABASE_URL that does not parse
stops every command with one line."""

from __future__ import annotations

import json
import logging

import pytest

from service import logs
from service.config import ConfigError, Settings
from service.logs import (
    JsonFormatter,
    TextFormatter,
    password_pieces,
    printable,
    printable_json,
    protect_url,
    redact,
    scrub,
    url_passwords,
)

PASSWORD = "Sup3r%zzS3cret"
URL = f"postgresql://app:{PASSWORD}@db.example.com:5432/app"
CONTROLS = "\x00\x07\x08\x1b\x7f\x85\x9b\u2028\u2029\u202a\u202e\u2066\u2069\r\n\t"


def parts(secret: str, shortest: int = 4) -> list[str]:
    """Every run of `shortest` or more characters of `secret`."""
    return [secret[i:j] for i in range(len(secret))
            for j in range(i + shortest, len(secret) + 1)]


def assert_no_part(text: str, secret: str = PASSWORD) -> None:
    for part in parts(secret):
        assert part not in text, (part, text)


@pytest.fixture(autouse=True)
def nothing_protected(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no protected password (protect_url is process-wide)."""
    monkeypatch.setattr(logs, "_PROTECTED", set())


def test_printable_escapes_every_control_character_and_keeps_the_rest() -> None:
    shown = printable(f"inv{CONTROLS}oices é ü 日本 \\ ok")
    assert not any(c in shown for c in CONTROLS)
    assert shown == ("inv\\x00\\x07\\x08\\x1b\\x7f\\x85\\x9b\\u2028\\u2029\\u202a\\u202e"
                     "\\u2066\\u2069\\x0d\\x0a\\x09oices é ü 日本 \\ ok")
    assert printable("invoices") == "invoices"


def test_printable_json_is_the_same_json_without_raw_controls() -> None:
    value = {"name": f"a{CONTROLS}b", "amount": 1}
    # json.dumps leaves DEL raw, msgspec and PostgreSQL also C1 and the direction marks.
    text = json.dumps(value, ensure_ascii=False, indent=2)
    shown = printable_json(text)
    assert json.loads(shown) == value
    assert not any(c in shown for c in CONTROLS if c not in "\n")


@pytest.mark.parametrize("url", [
    URL,
    f"postgres://app:{PASSWORD}@db/app?sslmode=require",
    f"postgresql://db/app?sslmode=require&password={PASSWORD}",
    "postgresql://app:Sup3r@zzS3cret@db/app",  # an unencoded @ in the password
])
def test_url_passwords_finds_the_password_as_written_and_decoded(url: str) -> None:
    found = url_passwords(url)
    assert any(p in url for p in found)
    written = url.split("password=")[-1] if "password=" in url else \
        url.split("://", 1)[1].rsplit("@", 1)[0].split(":", 1)[1]
    assert written in found


def test_a_percent_encoded_password_is_protected_decoded_too() -> None:
    pieces = password_pieces("postgresql://app:p%40ss%2Fw0rd@db/app")
    assert_no_part(scrub("user app, password p@ss/w0rd, as written p%40ss%2Fw0rd", pieces),
                   "p@ss/w0rd")
    assert_no_part(scrub("as written p%40ss%2Fw0rd", pieces), "p%40ss%2Fw0rd")


def test_a_url_without_a_password_protects_nothing() -> None:
    assert password_pieces("postgresql://postgres@127.0.0.1:54329/postgres") == set()
    assert password_pieces("not a url") == set()


def test_scrub_leaves_no_part_of_four_characters_or_more() -> None:
    pieces = password_pieces(URL)
    # Every part of the password, alone and amid other text.
    for part in parts(PASSWORD):
        for text in (part, f"x{part}y", f'invalid percent-encoded token: "{part}"',
                     f"{part} and again {part[::-1]} {part}"):
            assert_no_part(scrub(text, pieces))
    assert scrub("nothing hidden here", pieces) == "nothing hidden here"
    # Shorter runs are not parts of it: other text stays readable.
    assert scrub("Sup zz 3cr", pieces) == "Sup zz 3cr"


def test_a_malformed_database_url_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"DATABASE_URL": URL})
    message = str(refused.value)
    assert "DATABASE_URL is not a valid PostgreSQL URI" in message
    assert "percent-encoded" in message
    assert_no_part(message)


@pytest.mark.parametrize(("url", "says"), [
    ("localhost:5432", "DATABASE_URL is not a PostgreSQL URI"),
    ("postgresql://u:hunter2@[::1", "DATABASE_URL is not a valid PostgreSQL URI"),
])
@pytest.mark.parametrize("command", [["status"], ["migrate"], ["deliveries", "list", "1"],
                                     ["token", "list"]])
def test_a_database_url_that_does_not_parse_stops_every_command_in_one_line(
        monkeypatch: pytest.MonkeyPatch, url: str, says: str, command: list[str]) -> None:
    """Before the command runs: the exit message, which Python prints as it is (run as
    processes, with a database that cannot be reached too: tests/e2e/test_startup.py)."""
    from service.commands import cli

    monkeypatch.setenv("DATABASE_URL", url)
    with pytest.raises(SystemExit) as exited:
        cli.main(command)
    message = exited.value.code
    assert isinstance(message, str) and "\n" not in message, message
    assert message.startswith("webhooks: ") and says in message, message
    assert "hunter2" not in message


def record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    return logging.LogRecord("webhooks.test", logging.ERROR, __file__, 1, message, args,
                             (type(exc), exc, None) if exc else None)


def test_log_lines_hold_no_part_of_a_protected_password() -> None:
    protect_url(URL)
    leak = ValueError(f'invalid percent-encoded token: "{PASSWORD}" (zzS3cret)')
    for formatter in (TextFormatter(), JsonFormatter()):
        line = formatter.format(record("could not connect to %s: %s", URL, "S3cret!",
                                       exc=leak))
        assert_no_part(line)
        assert "could not connect" in line
    assert_no_part(redact(f"error: {PASSWORD}"))


def test_json_log_lines_hold_no_escaped_part_of_the_password() -> None:
    # JSON writes a quote or a letter beyond ASCII escaped, which would hide the raw piece.
    secret = 'Pa"ss\u00e9word'
    protect_url(f"postgresql://app:{secret}@db/app")
    line = JsonFormatter().format(record("password %s", secret))
    assert_no_part(json.loads(line)["message"], secret)
    assert_no_part(line, secret)
    assert_no_part(line, json.dumps(secret)[1:-1])


def test_text_log_lines_escape_control_characters() -> None:
    line = TextFormatter().format(record("table %s not rewritten", "inv\x1b]0;x\x07oices"))
    assert "\x1b" not in line and "\x07" not in line
    assert "inv\\x1b]0;x\\x07oices" in line


def test_unexpected_tracebacks_hold_no_part_of_the_password(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import threading

    from service.commands import cli

    protect_url(URL)
    leak = RuntimeError(f"cannot use {URL}\x1b[2J")
    cli._scrubbed_traceback(RuntimeError, leak, None)
    monkeypatch.setattr(threading, "excepthook", cli._scrubbed_thread_traceback)

    def fail() -> None:
        raise leak

    thread = threading.Thread(target=fail, name="metrics")
    thread.start()
    thread.join()
    err = capsys.readouterr().err
    assert err.count("RuntimeError: cannot use postgresql://app:***@db.example.com") == 2
    assert "Exception in thread metrics" in err
    assert "\x1b" not in err
    assert_no_part(err)
