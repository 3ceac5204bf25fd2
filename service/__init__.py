"""Postgres-centric webhook subscription service."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pg-webhooks")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
