"""The SSRF guard's client refusing at connect time what a receiver on loopback would
answer (the rules themselves: tests/unit/test_ssrf.py)."""

from __future__ import annotations

import httpx
import pytest

from service.http import make_client
from tests.support.receivers import Receiver


async def test_client_refuses_at_connect_time() -> None:
    async with Receiver() as receiver, \
            make_client(allow_private=False, timeout=1.0) as guarded, \
            make_client(allow_private=True, timeout=1.0) as open_client:
        port = receiver.url.split(":")[2].split("/")[0]
        for url in (receiver.url, f"http://localhost:{port}/hook",
                    f"http://[::ffff:127.0.0.1]:{port}/"):
            with pytest.raises(httpx.ConnectError) as info:
                await guarded.post(url)
            assert "loopback" in str(info.value), str(info.value)
        # aiohttp refuses the decimal form of an address outright.
        with pytest.raises(httpx.TransportError):
            await guarded.post(f"http://2130706433:{port}/")
        with pytest.raises(httpx.UnsupportedProtocol):
            await guarded.get("ftp://example.com/")
        assert receiver.received == []
        assert (await open_client.post(receiver.url)).status_code == 200
        assert len(receiver.received) == 1
