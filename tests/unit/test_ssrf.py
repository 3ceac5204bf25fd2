"""The SSRF guard: URL rules, forbidden addresses in every form they are written in, the
resolver and the client's refusals (tests/e2e/test_ssrf_client.py sends to a receiver;
tests/e2e/test_api_create.py shows that the API refuses such targets and stores nothing)."""

from __future__ import annotations

import ipaddress

import httpx
import pytest

from service.http import make_client
from service.ssrf import (
    GuardedResolver,
    TargetRejected,
    check_target,
    check_url,
    forbidden_reason,
)


@pytest.mark.parametrize(("url", "fragment"), [
    ("ftp://example.com/", "http"),
    ("file:///etc/passwd", "http"),
    ("gopher://example.com/", "http"),
    ("example.com/hook", "http"),
    ("http://", "no host"),
    ("http://user@example.com/", "user name"),
    ("http://user:pass@example.com/", "user name"),
    ("http://:pass@example.com/", "user name"),
    ("http://example.com:0/", "port 0"),
    ("http://example.com:70000/", "valid URL"),
    ("http://[::1/", "valid URL"),
    ("http://exa mple.com/", "spaces"),
    ("http://example.com/\r\nX: y", "control"),
    ("http://example.com/" + "a" * 3000, "longer"),
    ("not a url", "spaces"),
    ("http:///nohost", "no host"),
    ("//example.com/hook", "http"),
    ("http://user@127.0.0.1:8080/hook", "user name"),  # before whatever the host is
    # The API refuses it earlier, saying NUL (tests/e2e/test_api_create.py): a request
    # body's text may hold no NUL character, since PostgreSQL's text cannot.
    ("http://exa\x00mple.com/", "control"),
])
def test_check_url_refuses(url: str, fragment: str) -> None:
    with pytest.raises(TargetRejected) as info:
        check_url(url)
    assert fragment in str(info.value)


@pytest.mark.parametrize("url", ["http://example.com/hook", "https://example.com:8443/a?b=c",
                                 "HTTPS://EXAMPLE.COM/", "http://[2001:db8::1]:80/"])
def test_check_url_accepts(url: str) -> None:
    assert check_url(url).hostname


@pytest.mark.parametrize(("address", "reason"), [
    ("127.0.0.1", "loopback"), ("127.255.0.9", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"),
    ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("192.168.0.1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "non-public"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("240.0.0.1", "reserved"),
    ("255.255.255.255", "private"), ("fc00::1", "private"), ("fd12::1", "private"),
    ("64:ff9b::7f00:1", "loopback"), ("192.0.0.8", "private"), ("198.18.0.1", "private"),
    ("2002:7f00:1::", "6to4"),
])
def test_forbidden_addresses(address: str, reason: str) -> None:
    found = forbidden_reason(ipaddress.ip_address(address))
    # Python versions differ on which flag a range sets first; any refusal will do there.
    assert found == reason or (found is not None and reason in ("private", "reserved"))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111",
                                     "::ffff:8.8.8.8"])
def test_public_addresses(address: str) -> None:
    assert forbidden_reason(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(("url", "fragment"), [
    ("http://127.0.0.1/", "loopback"), ("http://localhost:8080/", "loopback"),
    ("http://[::1]/", "loopback"), ("http://[::ffff:127.0.0.1]/", "loopback"),
    ("http://2130706433/", "loopback"), ("http://0x7f000001/", "loopback"),
    ("http://127.1/", "loopback"), ("http://10.0.0.1/", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://100.64.0.1/", "non-public"), ("http://0.0.0.0/", "unspecified"),
    ("http://[fe80::1]/", "link-local"),
    ("http://192.168.1.1/hook", "private"), ("http://[fc00::1]/hook", "private"),
    ("http://224.0.0.1/hook", "multicast"),
])
async def test_check_target_refuses_private_hosts(url: str, fragment: str) -> None:
    with pytest.raises(TargetRejected) as info:
        await check_target(url, allow_private=False)
    assert fragment in str(info.value)
    assert "WEBHOOKS_ALLOW_PRIVATE_TARGETS" in str(info.value)


# The other forms of an address, each refused before any request: octal, hexadecimal and
# decimal IPv4, IPv4 inside IPv6, NAT64, names in another case or with a trailing dot.
@pytest.mark.parametrize(("host", "fragment"), [
    ("0177.0.0.1", "loopback"),           # octal
    ("0x7f.0.0.1", "loopback"),           # hexadecimal
    ("0x7f000001", "loopback"),           # one hexadecimal number
    ("017700000001", "loopback"),         # one octal number
    ("127.1", "loopback"),                # short form
    ("012.0.0.1", "private"),             # octal 10.0.0.1
    ("3232235777", "private"),            # decimal 192.168.1.1
    ("2852039166", "link-local"),         # decimal 169.254.169.254
    ("0", "unspecified"),                 # 0.0.0.0
    ("[::ffff:7f00:1]", "loopback"),      # IPv4-mapped, hexadecimal
    ("[::ffff:a9fe:a9fe]", "link-local"),  # IPv4-mapped metadata address
    ("[0:0:0:0:0:ffff:10.0.0.1]", "private"),
    ("[::]", "unspecified"),
    ("[64:ff9b::a9fe:a9fe]", "link-local"),  # NAT64 of the metadata address
    ("[fd00:ec2::254]", "private"),       # the metadata address over IPv6
    ("[ff02::1]", "multicast"),
    ("localhost.", ""),                   # trailing dot: loopback, or does not resolve
    ("LOCALHOST", "loopback"),
])
async def test_ssrf_address_forms_are_refused(host: str, fragment: str) -> None:
    with pytest.raises(TargetRejected) as info:
        await check_target(f"http://{host}:8080/hook", allow_private=False)
    assert fragment in str(info.value)


async def test_check_target_allows_private_hosts_when_configured() -> None:
    await check_target("http://127.0.0.1:9/", allow_private=True)
    await check_target("http://localhost:9/", allow_private=True)


async def test_check_target_public_literal_and_unresolvable() -> None:
    await check_target("http://93.184.216.34/", allow_private=False)
    with pytest.raises(TargetRejected, match="does not resolve"):
        await check_target("http://no-such-host.invalid/", allow_private=False)


async def test_resolver_refuses_forbidden_answers() -> None:
    resolver = GuardedResolver(allow_private=False)
    try:
        with pytest.raises(OSError, match="loopback"):
            await resolver.resolve("localhost", 80)
    finally:
        await resolver.close()


async def test_refused_connection_is_a_connect_error_not_a_timeout() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = make_client(allow_private=True, timeout=1.0)
    try:
        with pytest.raises(httpx.ConnectError, match="refused") as info:
            await client.post(f"http://127.0.0.1:{port}/")
        assert not isinstance(info.value, httpx.TimeoutException)
    finally:
        await client.aclose()


def assert_no_address(message: str) -> None:
    """Refusals name the host and the kind of address, never what the name resolved to."""
    for address in ("127.0.0.1", "::1", "127.0.1.1"):
        assert address not in message, message


async def test_refusals_do_not_name_the_resolved_address() -> None:
    with pytest.raises(TargetRejected) as info:
        await check_target("http://localhost:8080/", allow_private=False)
    message = str(info.value)
    assert "localhost resolves to a loopback address" in message
    assert_no_address(message)
    resolver = GuardedResolver(allow_private=False)
    try:
        with pytest.raises(OSError) as raised:
            await resolver.resolve("localhost", 80)
        assert "loopback" in str(raised.value)
        assert_no_address(str(raised.value))
    finally:
        await resolver.close()
    # A literal is its own address: naming it tells nothing new.
    with pytest.raises(TargetRejected) as literal:
        await check_target("http://10.1.2.3/", allow_private=False)
    assert "target 10.1.2.3 is a private address" in str(literal.value)


async def test_client_refusal_does_not_name_the_resolved_address() -> None:
    client = make_client(allow_private=False, timeout=1.0)
    try:
        with pytest.raises(httpx.ConnectError) as info:
            await client.post("http://localhost:9/")
        assert "loopback" in str(info.value)
        assert_no_address(str(info.value))
    finally:
        await client.aclose()
