"""The worker's capacity: how many deliveries it may have in flight, adapted to the machine.

A fixed count bounds slow targets, not the machine: 64 in flight to targets that answer in
200 ms make at most 320 deliveries/s (Little's law), whatever the process could do. So the
capacity starts at FLOOR (or the ceiling, when lower) and, every TICK seconds:

- doubles (grows by at least GROW_MIN) when the worker's slots were all in use during the
  tick (demand for more) and the process has CPU to spare (its CPU time over the tick's
  wall time below CPU_GROW, and the event loop late by less than LAG_GROW, averaged over
  a few ticks), memory (its
  RSS, plus DELIVERY_BYTES for each slot added, within WEBHOOKS_MEMORY_BUDGET) and file
  descriptors (one socket per delivery in flight, within the soft RLIMIT_NOFILE less
  RESERVED_FDS);
- shrinks by a fifth, never below FLOOR, under CPU pressure (CPU_HIGH of a core, or the
  loop late by LAG_HIGH while the process uses CPU_GROW of a core: its own work queues
  up) or past the memory budget; late while using little CPU, the machine is busy with
  other processes: the capacity holds (fewer slow deliveries in flight would not free
  the CPU their answers take, only make them wait);
- never exceeds the ceiling (WEBHOOKS_CONCURRENCY, by default derived from the budget).

The per-owner share and the per-target windows apply within the capacity (slots.py):
the share is half of the current capacity, so one owner's slow targets never take every
slot from the others, however large the capacity grows. `bound` says what holds the
capacity where it is: one of BOUNDS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.config import DELIVERY_BYTES

log = logging.getLogger("webhooks.worker")

# Where the capacity starts and the least it shrinks to (the ceiling, when lower).
FLOOR = 64
# Seconds between decisions.
TICK = 0.25
# Growth per tick: doubling, at least GROW_MIN slots. Shrinking: by SHRINK.
GROW = 2.0
GROW_MIN = 16
SHRINK = 0.8
# CPU is spare below CPU_GROW of a core and the loop's lateness below LAG_GROW; pressure
# at CPU_HIGH or LAG_HIGH (one worker process uses one core at most).
CPU_GROW = 0.7
CPU_HIGH = 0.9
LAG_GROW = 0.03
LAG_HIGH = 0.1
# The lateness is averaged over about 1 / LAG_WEIGHT ticks.
LAG_WEIGHT = 0.3
# Descriptors kept for what is not a delivery (pools, LISTEN, name lookups, logs).
RESERVED_FDS = 128
# The most the soft limit is raised to when the hard one is unlimited.
NOFILE_MAX = 1 << 20

# What may hold the capacity where it is: `demand` (the slots were not all in use),
# `owner_share` (they were not, but owners at their share had deliveries waiting),
# `cpu`, `memory`, `descriptors`, `ceiling` (WEBHOOKS_CONCURRENCY).
BOUNDS = ("demand", "owner_share", "cpu", "memory", "descriptors", "ceiling")


def raise_nofile() -> tuple[int, int]:
    """Raises the soft limit of open files to the hard one; returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_MAX if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, target,
                    exc)
        return soft, hard
    return target, hard


def connections(ceiling: int) -> int:
    """The most connections the worker's HTTP client may open: its ceiling, or what the
    open-files limit (raised first) leaves for them."""
    soft, _ = raise_nofile()
    if soft == resource.RLIM_INFINITY:
        return max(1, ceiling)
    return max(1, min(ceiling, soft - RESERVED_FDS))


def for_worker(ceiling: int, memory_budget: int) -> Capacity:
    """The capacity of a worker whose ceiling is `ceiling` (WEBHOOKS_CONCURRENCY), with
    the open-files limit raised; says at start when that limit bounds it."""
    soft, hard = raise_nofile()
    capacity = Capacity(ceiling, memory_budget=memory_budget,
                        nofile=None if soft == resource.RLIM_INFINITY else soft)
    if capacity.static_bound() == "descriptors":
        log.warning("the open-files limit (%d, hard limit %s) bounds this worker to %d "
                    "deliveries in flight, below its ceiling of %d (WEBHOOKS_CONCURRENCY): "
                    "raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker run "
                    "--ulimit nofile=) for more", soft,
                    "unlimited" if hard == resource.RLIM_INFINITY else hard,
                    capacity.most, capacity.ceiling)
    return capacity


def rss_bytes() -> int:
    """The process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True, slots=True)
class Sample:
    """What a tick measured: CPU time over wall time, how late the loop ran the tick's
    timer (seconds), the RSS (bytes), and the worker's use of its slots: the most sending
    at once during the tick, and whether owners at their share held deliveries back."""

    cpu: float
    lag: float
    rss: int
    peak: int
    owners_held: bool = False


class Capacity:
    """The capacity's decisions, from samples (no I/O: run() measures)."""

    def __init__(self, ceiling: int, *, memory_budget: int, nofile: int | None = None,
                 floor: int = FLOOR) -> None:
        self.ceiling = max(1, ceiling)
        self.memory_budget = memory_budget
        self.fd_cap = None if nofile is None else max(1, nofile - RESERVED_FDS)
        # The hard bound: the ceiling or the descriptors, whichever is lower.
        self.most = min(self.ceiling, self.fd_cap or self.ceiling)
        self.floor = max(1, min(floor, self.most))
        self.limit = self.floor
        self.bound = "demand"

    def static_bound(self) -> str:
        """What bounds the capacity's growth whatever the load: `descriptors` when the
        open-files limit is below the ceiling, else `ceiling`."""
        return "descriptors" if self.fd_cap is not None and self.fd_cap < self.ceiling \
            else "ceiling"

    def decide(self, s: Sample) -> int:
        """The capacity after a tick that measured `s` (also sets `bound`)."""
        limit = self.limit
        if s.rss > self.memory_budget:
            self.bound = "memory"
            self.limit = max(self.floor, int(limit * SHRINK))
        elif s.cpu >= CPU_HIGH or (s.lag >= LAG_HIGH and s.cpu >= CPU_GROW):
            self.bound = "cpu"
            self.limit = max(self.floor, int(limit * SHRINK))
        elif s.peak < limit:
            self.bound = "owner_share" if s.owners_held else "demand"
        elif limit >= self.most:
            self.bound = self.static_bound()
        elif s.cpu >= CPU_GROW or s.lag >= LAG_GROW:
            self.bound = "cpu"
        else:
            room = (self.memory_budget - s.rss) // DELIVERY_BYTES
            if room <= 0:
                self.bound = "memory"
                return limit
            grown = min(self.most, max(int(limit * GROW), limit + GROW_MIN))
            self.bound = "demand"
            if grown >= self.most:
                self.bound = self.static_bound()
            if limit + room < grown:
                grown, self.bound = limit + room, "memory"
            self.limit = grown
        return self.limit


class CapacityLoop:
    """Measures every TICK and applies the capacity's decisions through `apply` (the new
    limit, its bound)."""

    def __init__(self, capacity: Capacity, sample: Callable[[], tuple[int, bool]],
                 apply: Callable[[int, str], None]) -> None:
        self.capacity = capacity
        self._sample = sample  # (the most sending at once since the last call, owners held)
        self._apply = apply

    async def run(self) -> None:
        """Decides every TICK until cancelled."""
        loop = asyncio.get_running_loop()
        lag = 0.0
        while True:
            started, cpu = loop.time(), time.process_time()
            await asyncio.sleep(TICK)
            now = loop.time()
            peak, owners_held = self._sample()
            elapsed = max(now - started, 1e-6)
            # Smoothed: the answers of slow targets come in bursts (a second's worth at
            # once), each a spike of lateness that is no shortage of CPU.
            lag += LAG_WEIGHT * (max(0.0, elapsed - TICK) - lag)
            sample = Sample(cpu=(time.process_time() - cpu) / elapsed,
                            lag=lag, rss=rss_bytes(), peak=peak,
                            owners_held=owners_held)
            before = self.capacity.limit
            after = self.capacity.decide(sample)
            if after != before:
                log.debug("capacity %d -> %d (%s; CPU %.2f, loop %.3f s late, peak %d)",
                          before, after, self.capacity.bound, sample.cpu, sample.lag,
                          sample.peak)
            self._apply(self.capacity.limit, self.capacity.bound)
