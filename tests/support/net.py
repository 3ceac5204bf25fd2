"""Loopback ports for the processes a test starts."""

from __future__ import annotations

import random
import socket

# Below the kernel's range of ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range,
# 32768-60999 by default): a port handed out by binding port 0 and closed again was given
# again by the kernel, to another test process's receiver or connection, before the
# process it was meant for bound it (a worker's metrics then answered another test's
# receiver). Ports chosen here are never handed out that way.
LOW, HIGH = 20000, 32000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, outside the ephemeral range."""
    for _ in range(200):
        port = random.randint(LOW, HIGH)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 between {LOW} and {HIGH}")
