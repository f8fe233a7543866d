"""A counting HTTP proxy on 127.0.0.1 in front of the real S3 server, for tests that measure the wire.

It records every request it forwards and can inject faults the server cannot produce on demand:
an error status for chosen requests, a stalled response, a corrupted request body, or every
connection severed at once (with or without the proxy going away).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import socketserver
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    range: str | None
    headers: frozenset[str] = frozenset()

    @property
    def is_get(self) -> bool:
        return self.method == "GET"

    def has_param(self, name: str) -> bool:
        return name in self.query

    def has_header(self, name: str) -> bool:
        return name.lower() in self.headers


Predicate = Callable[[RecordedRequest], bool]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: CountingS3Proxy

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # severed connections are the point of some tests, not noise to print


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)
            if self._upstream is not None:
                self._upstream.close()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length", "0") or 0)
        return self.rfile.read(length) if length else b""

    def _relay(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        parsed = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
        names = frozenset(k.lower() for k in self.headers)
        request = RecordedRequest(self.command, parsed.path, query, self.headers.get("Range"), names)
        proxy._record(request)
        fault = proxy._fault_for(request)
        if fault == "corrupt" and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        if fault == "stall":
            proxy._stalled.wait()
            self.close_connection = True
            return
        if isinstance(fault, int) and not isinstance(fault, bool):
            payload = b"<?xml version='1.0'?><Error><Code>InjectedFault</Code></Error>"
            self.send_response(fault)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        if self._upstream is None:
            self._upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        # The Host header is forwarded unchanged: the client signed it (SigV4).
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        self._upstream.request(self.command, self.path, body=body, headers=headers)
        reply = self._upstream.getresponse()
        self.send_response_only(reply.status, reply.reason)
        length = reply.getheader("Content-Length")
        data = None if length is not None else reply.read()
        for name, value in reply.getheaders():
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", length if length is not None else str(len(data or b"")))
        self.end_headers()
        if self.command == "HEAD":
            reply.read()
            return
        if data is not None:
            self.wfile.write(data)
            return
        while chunk := reply.read(64 * 1024):
            self.wfile.write(chunk)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class CountingS3Proxy:
    def __init__(self, upstream_url: str) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        self.upstream_host = parsed.hostname or "127.0.0.1"
        self.upstream_port = parsed.port or 80
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._faults: list[tuple[Predicate, int | str]] = []  # status code, "stall" or "corrupt"
        self._connections: set[socket.socket] = set()
        self._stalled = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        with self._lock:
            self._requests.clear()

    def fail_when(self, predicate: Predicate, status: int = 500) -> None:
        """Answer matching requests with `status` instead of forwarding them."""
        with self._lock:
            self._faults.append((predicate, status))

    def stall_when(self, predicate: Predicate) -> None:
        """Never answer matching requests (until close): the client must give up on its own deadline."""
        with self._lock:
            self._faults.append((predicate, "stall"))

    def corrupt_when(self, predicate: Predicate) -> None:
        """Flip a byte of matching requests' bodies on the way to the server (a corrupting network)."""
        with self._lock:
            self._faults.append((predicate, "corrupt"))

    def sever_connections(self) -> None:
        """Cut every open client connection (as a network blip would) but keep accepting new ones."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def close(self) -> None:
        """Stop listening and sever every open connection, as a crashed server would."""
        if self._closed:
            return
        self._closed = True
        self._stalled.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        self._thread.join(timeout=10)

    def __enter__(self) -> CountingS3Proxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _fault_for(self, request: RecordedRequest) -> int | str | None:
        with self._lock:
            for predicate, fault in self._faults:
                if predicate(request):
                    return fault
        return None

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)


__all__ = ["CountingS3Proxy", "RecordedRequest"]
