"""The options of the client's easy handles: what is allowed (http and https only, no
redirects, no proxy from the environment, no compression, HTTP/1.1), TLS (the peer and
its name verified, sessions shared between connections) and the delivery proxy (CONNECT
to the address the guard checked)."""

from __future__ import annotations

import pycurl

from service.http import USER_AGENT

# Sent with every POST: no compressed answer is asked for (it would only be stored as
# bytes, and a small compressed body can inflate hugely), and no 100-continue round trip.
BASE_HEADERS = (f"User-Agent: {USER_AGENT}", "Accept-Encoding: identity", "Expect:")

# How long a name's addresses are reused before it is looked up again, in seconds.
DNS_TTL = 10.0


def easy_handle(*, connect_ms: int, ca: str | None, share: pycurl.CurlShare,
                proxy: str | None) -> pycurl.Curl:
    """A new easy handle with the options every transfer keeps."""
    curl = pycurl.Curl()
    for option, value in (
            (pycurl.NOSIGNAL, 1),
            (pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS),
            (pycurl.REDIR_PROTOCOLS, 0),
            (pycurl.FOLLOWLOCATION, 0),
            (pycurl.PROXY, ""),  # none, whatever the environment says
            (pycurl.HTTP_CONTENT_DECODING, 0),
            (pycurl.HTTP_TRANSFER_DECODING, 1),
            (pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1),
            (pycurl.CONNECTTIMEOUT_MS, connect_ms),
            (pycurl.DNS_CACHE_TIMEOUT, int(DNS_TTL)),
            (pycurl.POST, 1),
            (pycurl.NOPROGRESS, 1),
            (pycurl.TCP_NODELAY, 1),
            # Small buffers: at most BODY_LIMIT bytes of an answer's body are kept, and
            # thousands of transfers may be under way (their buffers are the worker's
            # memory per delivery in flight).
            (pycurl.BUFFERSIZE, 4096),
            (pycurl.UPLOAD_BUFFERSIZE, 16384),
            (pycurl.SSL_VERIFYPEER, 1),
            (pycurl.SSL_VERIFYHOST, 2),
    ):
        curl.setopt(option, value)
    if ca is not None:
        curl.setopt(pycurl.CAINFO, ca)
    curl.setopt(pycurl.SHARE, share)
    if proxy is not None:
        curl.setopt(pycurl.PROXY, proxy)
        curl.setopt(pycurl.PROXYTYPE, pycurl.PROXYTYPE_HTTP)
        curl.setopt(pycurl.HTTPPROXYTUNNEL, 1)
        curl.setopt(pycurl.NOPROXY, "")
        # The proxy's answer to CONNECT reaches the header callback first; the target's
        # own status line starts its answer over (Transfer.header).
    return curl


def connect_to(host: str, port: int, resolve: list[str]) -> list[str]:
    """The CURLOPT_CONNECT_TO entry that sends `host:port` to one of its checked addresses
    (from the CURLOPT_RESOLVE entry `+host:port:addr,...`), IPv4 first (a proxy tries the
    one address it is given); none for an IP literal, which was checked before."""
    if not resolve:
        return []
    addresses = resolve[0].split(f"{host}:{port}:", 1)[1].split(",")
    chosen = next((a for a in addresses if not a.startswith("[")), addresses[0])
    return [f"{host}:{port}:{chosen}:{port}"]
