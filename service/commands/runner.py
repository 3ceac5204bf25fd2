"""Running the processes: the API server, a worker, or both in one process, until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any, TypeVar

import uvicorn
from prometheus_client import CollectorRegistry

from service.config import Settings

log = logging.getLogger("webhooks.runner")
T = TypeVar("T")


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Runs the coroutine on uvloop where it is installed (measurably faster), else asyncio."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: we stop it through `should_exit`, and it
    must not re-raise the signal after shutdown (the process exits 0 on SIGTERM)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            # uvicorn says where it listens only for an address it bound itself.
            log.info("API listening on http://%s:%d", self.config.host, self.config.port)
        freeze_startup_heap()


def freeze_startup_heap() -> None:
    """Moves what exists once a process has started (modules, the app, its routes and
    schemas, pools) out of the garbage collector's reach. A full collection walks every
    tracked object: 40-50 ms in the API's heap, a pause every request in flight waits out
    (the GET's p99); after this it walks only what was made since."""
    gc.collect()
    gc.freeze()


def stop_on_signals(stop: asyncio.Event) -> None:
    """Sets `stop` on SIGINT or SIGTERM (a second one is left to the default handler)."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        log.info("received %s, shutting down", sig.name)
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle, sig)


def api_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The API's listening socket, bound before anything else starts (the banner of
    `make run`, the worker), so that an address in use stops the command at once with a
    clear message: uvicorn's own bind exited from inside its task, and the process went
    on without an API, and could hang on shutdown. With `reuse_port`, SO_REUSEPORT:
    processes that each bind one share the port, the kernel spreading new connections
    between them (webhooks api --processes)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except OSError as exc:
        raise SystemExit(f"webhooks: cannot listen on {host}:{port}: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        hint = (" (another process is listening there: stop it, or choose another port"
                " with --port)") if exc.errno == errno.EADDRINUSE else ""
        raise SystemExit(f"webhooks: cannot listen on {host}:{port}: "
                         f"{exc.strerror or exc}{hint}") from None
    return sock


async def serve_api(settings: Settings, sock: socket.socket, stop: asyncio.Event,
                    other_metrics: Sequence[CollectorRegistry] = (),
                    liveness: Callable[[], tuple[int, dict[str, Any]]] | None = None) -> None:
    """Serves the REST API on `sock` (api_socket) until `stop` is set, then finishes open
    requests and returns; with `liveness`, a worker's check on /livez beside it."""
    from service.api.app import create_app

    host, port = sock.getsockname()[:2]
    app = create_app(settings, other_metrics=other_metrics, liveness=liveness)
    config = uvicorn.Config(app, host=host,
                            port=port, log_config=None,
                            access_log=False, lifespan="on", timeout_graceful_shutdown=10)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopper.cancel()
    await task
    if server.started is False and not stop.is_set():
        raise SystemExit(f"webhooks: the API could not start on {host}:{port}")


async def run_api(settings: Settings, sock: socket.socket) -> None:
    """`webhooks api`: the API alone, on `sock` (api_socket)."""
    stop = asyncio.Event()
    stop_on_signals(stop)
    await serve_api(settings, sock, stop)


async def run_all(settings: Settings, sock: socket.socket, concurrency: int,
                  stop: asyncio.Event | None = None) -> None:
    """`webhooks run`: the API (on `sock`, api_socket) and a worker in one process; either
    failing stops both."""
    from service.worker.liveness import Liveness
    from service.worker.loop import run_worker
    from service.worker.metrics import WorkerMetrics

    if stop is None:
        stop = asyncio.Event()
        stop_on_signals(stop)
    # One /metrics for the process: the API's series and the worker's.
    # The worker's liveness check on the API's port, /livez.
    worker_metrics = WorkerMetrics()
    liveness = Liveness(settings)
    tasks = [
        asyncio.create_task(serve_api(settings, sock, stop,
                                      other_metrics=[worker_metrics.registry],
                                      liveness=liveness.check), name="api"),
        asyncio.create_task(run_worker(settings, concurrency=concurrency, stop=stop,
                                       metrics=worker_metrics, liveness=liveness),
                            name="worker"),
    ]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            log.error("%s stopped with an error", task.get_name(), exc_info=result)
            raise SystemExit(1)
