"""A reverse proxy for object-store servers on loopback that adds latency and injects faults.

A real server on loopback answers in a millisecond and never fails; object stores take tens of
milliseconds per request and sometimes throttle, reset or cut a response short. This proxy sits
between a client and a local server (moto, gcp-storage-emulator, Azurite) and makes those
happen, on a seeded schedule, while it counts requests by kind (reads, lists, heads).

Run it as a process (what the tests and benchmarks do, through :func:`start_proxy`)::

    python tests/proxy.py --upstream http://127.0.0.1:9000     # prints its port, then serves

and steer it over HTTP: ``POST /__proxy__/config`` with a JSON body of :class:`Faults` fields,
``GET /__proxy__/stats``, ``POST /__proxy__/reset``. Faults: error statuses (with a
``Retry-After`` or not), resets, bodies cut short mid-stream or truncated with a matching
Content-Length, requests that stall before the first byte, expired tokens, and a listening
socket that refuses connections for a while.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

CONTROL = "/__proxy__"
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
                "proxy-authorization", "proxy-authenticate"}
_EXPIRED_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code>'
                 b"<Message>The provided token has expired.</Message></Error>")
_CODES = {  # status -> (S3 / Azure error code, message)
    403: ("AccessDenied", "Access Denied"),
    404: ("NoSuchKey", "The specified key does not exist."),
    412: ("conditionNotMet", "At least one of the pre-conditions you specified did not hold."),
    429: ("SlowDown", "Please reduce your request rate."),
    500: ("InternalError", "We encountered an internal error. Please try again."),
    503: ("SlowDown", "Please reduce your request rate."),
}


def error_response(flavor: str, status: int) -> tuple[bytes, dict[str, str]]:
    """The body and headers of an error as the store of ``flavor`` ("s3", "gs", "az") writes it."""
    code, message = _CODES.get(status, ("InternalError", "error"))
    if flavor == "gs":
        body = {"error": {"code": status, "message": message, "errors": [{"message": message, "reason": code}]}}
        return json.dumps(body).encode(), {"Content-Type": "application/json"}
    if flavor == "az":
        code = {403: "AuthorizationFailure", 404: "BlobNotFound", 503: "ServerBusy"}.get(status, code)
        xml = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
        return xml.encode(), {"Content-Type": "application/xml", "x-ms-error-code": code}
    xml = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message></Error>'
    return xml.encode(), {"Content-Type": "application/xml"}


@dataclasses.dataclass
class Faults:
    """What the proxy does to requests; rates are probabilities per object read (GET of data)."""

    latency: float = 0.0          # seconds added to every request
    slow_prefix: str = ""         # with slow_latency: requests whose path starts with this ("/bucket/slow/") ...
    slow_latency: float = 0.0     # ... get this many seconds more (one slow prefix of a store)
    error_rate: float = 0.0       # answer with error_status instead of forwarding
    error_status: int = 503
    reset_rate: float = 0.0       # close the connection without an answer
    short_rate: float = 0.0       # send half of the body, then close
    stall_rate: float = 0.0       # read the request, then answer nothing for stall_seconds (then forward it)
    stall_seconds: float = 3600.0
    truncate_rate: float = 0.0    # a complete-looking answer: half of the body, Content-Length saying so
    retry_after: str | None = None  # a Retry-After header on injected error answers
    refuse_seconds: float = 0.0   # accept no connection for this long from the config call on (then recover)
    expired_keys: list[str] = dataclasses.field(default_factory=list)  # S3 access keys answered ExpiredToken
    flavor: str = "s3"            # how error bodies look: "s3", "gs", "az"
    seed: int = 0
    # GCS media reads answered as GCS does and gcp-storage-emulator does not: ifGenerationMatch honoured
    # (412) and the object's generation sent in x-goog-generation (looked up in the emulator's metadata)
    gcs_generations: bool = False


def request_kind(method: str, path: str, query: dict[str, str]) -> str:
    """``list``, ``read`` (a GET of object data), ``head``, ``write`` or ``other``."""
    if method == "GET" and ("list-type" in query or query.get("comp") == "list" or path.rstrip("/").endswith("/o")
                            or ("prefix" in query and path.count("/") <= 1) or "delimiter" in query):
        return "list"
    if method == "GET":
        return "read"
    if method == "HEAD":
        return "head"
    if method in ("PUT", "POST", "DELETE", "PATCH"):
        return "write"
    return "other"


class Proxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = Faults()
        self.random = random.Random(0)
        self.counts: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self._session: Any = None
        self.listener: Listener | None = None

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.path.startswith(CONTROL):
            return await self._control(request, web)
        kind = request_kind(request.method, request.path, dict(request.query))
        self.counts[kind] += 1
        self.counts["total"] += 1
        latency = self.faults.latency
        if self.faults.slow_latency and request.path.startswith(self.faults.slow_prefix):
            latency += self.faults.slow_latency
        if latency:
            await asyncio.sleep(latency)
        if self.faults.expired_keys and any(key in request.headers.get("Authorization", "")
                                            for key in self.faults.expired_keys):
            self.injected["expired"] += 1
            return web.Response(status=400, body=_EXPIRED_BODY, content_type="application/xml")
        draw = self.random.random() if kind == "read" else 1.0
        faults = self.faults
        if draw < faults.error_rate:
            self.injected["error"] += 1
            body, headers = error_response(faults.flavor, faults.error_status)
            if faults.retry_after is not None:
                headers["Retry-After"] = faults.retry_after
            return web.Response(status=faults.error_status, body=body, headers=headers)
        draw -= faults.error_rate
        if draw < faults.reset_rate:
            self.injected["reset"] += 1
            request.transport.close()
            raise ConnectionResetError("injected reset")
        draw -= faults.reset_rate
        generation = await self._generation(request) if faults.gcs_generations and kind == "read" else None
        if generation is not None and request.query.get("ifGenerationMatch", generation) != generation:
            self.injected["precondition"] += 1
            body, headers = error_response("gs", 412)
            return web.Response(status=412, body=body, headers=headers)
        if draw < faults.stall_rate:   # accepted and read, no first byte (the client must cut it)
            self.injected["stall"] += 1
            await request.read()
            await asyncio.sleep(faults.stall_seconds)
        draw -= faults.stall_rate
        status, headers, body = await self._forward(request)
        if generation is not None:
            headers["x-goog-generation"] = generation
        if draw < faults.short_rate and len(body) > 1:
            self.injected["short"] += 1
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = len(body)
            await response.prepare(request)
            await response.write(body[:len(body) // 2])
            request.transport.close()
            return response
        draw -= faults.short_rate
        if draw < faults.truncate_rate and len(body) > 1:   # the length header matches the cut body
            self.injected["truncate"] += 1
            body = body[:len(body) // 2]
        return web.Response(status=status, headers=headers, body=body)

    def _client(self) -> Any:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        return self._session

    async def _generation(self, request: Any) -> str | None:
        """The current generation of the GCS object a media download reads (None: not such a read)."""
        prefix = "/download/storage/v1/b/"
        if not request.raw_path.startswith(prefix):
            return None
        from yarl import URL

        metadata = URL(self.upstream + "/storage/v1/b/" + request.raw_path[len(prefix):].split("?", 1)[0], encoded=True)
        async with self._client().get(metadata) as response:
            return str((await response.json(content_type=None))["generation"]) if response.status == 200 else None

    async def _forward(self, request: Any) -> tuple[int, dict[str, str], bytes]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        data = await request.read()
        async with self._client().request(request.method, self.upstream + request.path_qs, headers=headers,
                                          data=data or None, allow_redirects=False,
                                          skip_auto_headers=("Content-Type", "User-Agent", "Accept",
                                                             "Accept-Encoding")) as response:
            body = await response.read()
            # the body is sent whole (its length set by the response), except for HEAD, which has none
            out = {k: v for k, v in response.headers.items()
                   if k.lower() not in _HOP_HEADERS and (k.lower() != "content-length" or request.method == "HEAD")}
            return response.status, out, body

    async def _control(self, request: Any, web: Any) -> Any:
        action = request.path[len(CONTROL):].strip("/")
        if action == "config" and request.method == "POST":
            self.faults = Faults(**(await request.json()))
            self.random = random.Random(self.faults.seed)
            if self.faults.refuse_seconds > 0 and self.listener is not None:
                asyncio.get_running_loop().call_soon(self.listener.refuse, self.faults.refuse_seconds)
        elif action == "reset" and request.method == "POST":
            self.counts.clear()
            self.injected.clear()
        elif action != "stats":
            return web.Response(status=404)
        return web.json_response({"counts": dict(self.counts), "injected": dict(self.injected),
                                  "faults": dataclasses.asdict(self.faults)})


class Listener:
    """The proxy's listening socket, which can stop accepting for a while (connections are refused)."""

    def __init__(self, runner: Any, port: int) -> None:
        self.runner, self.port, self.site = runner, port, None

    def _socket(self) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        return sock

    async def listen(self) -> None:
        from aiohttp import web

        self.site = web.SockSite(self.runner, self._socket())
        await self.site.start()

    def refuse(self, seconds: float) -> None:
        """Close the listening socket (connections open stay open); listen again after ``seconds``."""
        async def pause() -> None:
            await self.site.stop()
            await asyncio.sleep(seconds)
            await self.listen()
        asyncio.ensure_future(pause())


def serve(upstream: str, port: int) -> None:
    from aiohttp import web

    async def main() -> None:
        proxy = Proxy(upstream)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", proxy.handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        proxy.listener = Listener(runner, port)
        await proxy.listener.listen()
        print(proxy.listener.port, flush=True)
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


class ProxyProcess:
    """A running proxy: its ``endpoint`` and control calls."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.endpoint = f"http://127.0.0.1:{port}"

    def _call(self, action: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.endpoint}{CONTROL}/{action}", data=data,
                                         method="GET" if body is None else "POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def configure(self, **faults: Any) -> None:
        self._call("config", dataclasses.asdict(Faults(**faults)))

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def reset(self) -> None:
        self._call("reset", {})

    def refuse(self, seconds: float, **faults: Any) -> None:
        """Refuse new connections for ``seconds`` from now (connections already open are still served)."""
        self.configure(refuse_seconds=seconds, **faults)
        time.sleep(0.1)   # the listening socket is closed just after the answer

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def start_proxy(upstream: str) -> Iterator[ProxyProcess]:
    """Run a proxy in front of ``upstream`` for the duration of the block."""
    process = subprocess.Popen([sys.executable, __file__, "--upstream", upstream], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert process.stdout is not None
    port = int(process.stdout.readline())
    proxy = ProxyProcess(process, port)
    deadline = time.monotonic() + 20
    while True:
        try:
            proxy.stats()
            break
        except OSError:
            if time.monotonic() > deadline:
                proxy.stop()
                raise
            time.sleep(0.05)
    try:
        yield proxy
    finally:
        proxy.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    serve(args.upstream, args.port)
