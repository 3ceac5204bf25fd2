"""`python -m bench.profile FILE...`: a text summary of py-spy collapsed stacks
(`bench.run --profile DIR` writes them): where the process spent its CPU, by package, by
function (self time), and by function including callees."""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*)\)$")


def parse(text: str) -> Counter[tuple[str, ...]]:
    """Stacks (outermost frame first) and their sample counts."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[tuple(stack.split(";"))] += int(count)
    return stacks


def package(frame: str) -> str:
    """The package a frame's file belongs to (`service`, `psycopg`, `asyncio`, ...)."""
    m = _FRAME.match(frame)
    path = m.group("file") if m else frame
    # py-spy shortens files to their package path: `aiohttp/client.py`, `asyncio/...`.
    return path.split("/", 1)[0].removesuffix(".py") or "?"


def summarise(stacks: Counter[tuple[str, ...]], top: int = 15) -> str:
    """The text report of one profile."""
    total = sum(stacks.values())
    if not total:
        return "no samples (the process was idle or py-spy could not attach)"
    by_package: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for stack, n in stacks.items():
        by_package[package(stack[-1])] += n
        self_time[stack[-1]] += n
        for frame in set(stack):
            inclusive[frame] += n

    def block(title: str, counts: Counter[str]) -> list[str]:
        lines = [title]
        for name, n in counts.most_common(top):
            lines.append(f"  {100.0 * n / total:5.1f}%  {name}")
        return lines

    lines = [f"{total} samples (100/s while on CPU)"]
    lines += block("by package (self time)", by_package)
    lines += block("by function (self time)", self_time)
    # Frames every stack has (the event loop's run) say nothing: keep the ones below 95%.
    lines += block("by function, including callees (service code)",
                   Counter({f: n for f, n in inclusive.items()
                            if "service/" in f and n < 0.95 * total}))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the summary of every file given."""
    paths = list(argv if argv is not None else sys.argv[1:])
    if not paths:
        print("usage: python -m bench.profile FILE...", file=sys.stderr)
        return 2
    for path in paths:
        print(f"== {path}")
        print(summarise(parse(Path(path).read_text(errors="replace"))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
