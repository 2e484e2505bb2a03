"""The connection layer: one set of urllib3 pool managers per process, proxies as the environment says.

    chute's download thread ──► Pools.manager(url) ──► PoolManager (direct)  ──► server
                                     │                 ProxyManager (per proxy URL: absolute-URI GETs,
                                     │                               CONNECT tunnels for https)
                                     └─ proxy_for(url): HTTP_PROXY / HTTPS_PROXY / ALL_PROXY, NO_PROXY (bypassed)

Every GET chute makes itself (HTTP datasets, presigned and botocore-signed S3
requests) goes through :func:`pools`: the process's one :class:`Pools`, made on
first use (again in a forked child: connections are not fork-safe). Its
managers keep connections alive per host, shared by the download threads and
every dataset of the process. Which manager serves a URL is decided per request
from the environment (``urllib.request.getproxies()``, the variables curl and
requests read; ``NO_PROXY`` with names, domain suffixes, addresses and
networks, as they match it: :func:`bypassed`), or from an explicit ``proxies``
mapping (botocore's ``config_kwargs={"proxies": ...}``).

The connections are urllib3's, with one addition: a connection about to send a
request tells the calling thread's :class:`Watch`, so that a thread cancelling
the download can shut the socket down under a read blocked in another thread
(waiting for the status line or for the body), which closing alone does not wake.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

#: Most kept-alive connections per host (a dataset's download threads times their byte ranges fit).
MAX_PER_HOST = 64
#: Most hosts (and proxies) with kept connections at once.
MAX_HOSTS = 32

#: Environment variables that name a proxy (upper or lower case), as curl and requests read them.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class ProxyError(ValueError):
    """A proxy URL chute cannot use (a scheme urllib3 does not speak without an extra package)."""


def proxy_for(url: str, proxies: Mapping[str, str] | None = None) -> str | None:
    """The proxy a GET of ``url`` goes through, or None (direct).

    ``proxies`` maps a scheme (``http``, ``https``, ``all``) to a proxy URL and may
    hold ``no`` (the hosts reached directly, as ``NO_PROXY``); None reads the
    environment (``urllib.request.getproxies()``: ``HTTP_PROXY``, ``HTTPS_PROXY``,
    ``ALL_PROXY``, ``NO_PROXY``, either case). The scheme's own proxy is taken
    first, then ``all``; a host ``NO_PROXY`` lists (see :func:`bypassed`) is
    reached directly.
    """
    if proxies is None:
        proxies = environment_proxies()
    parts = urllib.parse.urlsplit(url)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or bypassed(parts.hostname or "", parts.port, proxies.get("no", "")):
        return None
    return proxy


#: What :func:`urllib.request.getproxies` reads that :func:`proxy_for` uses (``REQUEST_METHOD``: a CGI
#: script ignores ``HTTP_PROXY``), and its answer for their last values.
_PROXY_ENVIRONMENT = (*PROXY_VARIABLES, *(name.upper() for name in PROXY_VARIABLES), "REQUEST_METHOD")
_last_proxies: tuple[tuple[str | None, ...], dict[str, str]] | None = None


def environment_proxies() -> dict[str, str]:
    """``urllib.request.getproxies()``, asked again only when a variable :func:`proxy_for` reads has changed
    (it walks the whole environment: on every GET that was a cost per request). Where it reads the system's
    settings too (macOS, Windows), it is asked every time."""
    import urllib.request

    global _last_proxies
    key = tuple(map(os.environ.get, _PROXY_ENVIRONMENT))
    last = _last_proxies
    if last is not None and last[0] == key:
        return last[1]
    proxies = urllib.request.getproxies()
    if sys.platform not in ("darwin", "win32"):
        _last_proxies = (key, proxies)
    return proxies


def bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``host`` (and ``port``) is reached directly under ``no_proxy`` (``NO_PROXY``'s value): ``*``
    (every host), or a comma-separated list of names (``example.com`` matches it and its subdomains; a
    leading dot is ignored), addresses or networks (``10.0.0.0/8``), each optionally with ``:port``, as
    curl and requests read it."""
    import ipaddress

    host = host.lower().strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy.lower().split(","):
        entry = entry.strip()
        if entry == "*":
            return True
        name, _, wanted = entry.rpartition(":") if entry.count(":") == 1 or entry.startswith("[") else ("", "", "")
        if not (name and wanted.isdigit()):
            name, wanted = entry, ""
        if wanted and port is not None and int(wanted) != port:
            continue
        name = name.strip("[]").lstrip(".")
        if not name:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


def origin(url: str) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, the default port made explicit: two URLs of one origin
    share credentials, others do not (RFC 6454)."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


class Watch:
    """The connection of the calling thread's request in flight, for :meth:`shut` from another thread."""

    def __init__(self) -> None:
        self.conn: Any = None
        self.reused = False  # the connection had served a request before (kept alive)
        self.cancelled = False

    def attach(self, conn: Any) -> None:
        self.conn = conn
        self.reused = conn.chute_requests > 0
        conn.chute_requests += 1

    def shut(self) -> None:
        """Wake a read blocked on the connection's socket (closing alone does not)."""
        self.cancelled = True
        sock = getattr(self.conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _pool_classes(local: threading.local) -> dict[str, type]:
    """urllib3's pool classes, with connections that report to the calling thread's :class:`Watch`."""
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    def watched(base: type) -> type:
        class Watched(base):  # type: ignore[valid-type,misc]
            chute_requests = 0

            def request(self, *args: Any, **kwargs: Any) -> None:
                watch = getattr(local, "watch", None)
                if watch is not None:
                    watch.attach(self)
                super().request(*args, **kwargs)
                if watch is not None and watch.cancelled:  # cancelled while it connected: no socket to shut then
                    watch.shut()

        Watched.__name__ = Watched.__qualname__ = f"Watched{base.__name__}"
        return Watched

    class Pool(HTTPConnectionPool):
        ConnectionCls = watched(HTTPConnection)

    class TLSPool(HTTPSConnectionPool):
        ConnectionCls = watched(HTTPSConnection)

    return {"http": Pool, "https": TLSPool}


def _tls(verify: bool | str) -> dict[str, Any]:
    """urllib3's TLS arguments for ``verify``: True (the system's certificates), False (none), a CA bundle."""
    if verify is False:
        return {"cert_reqs": "CERT_NONE", "assert_hostname": False}
    if isinstance(verify, str):
        return {"cert_reqs": "CERT_REQUIRED", "ca_certs": verify}
    return {"cert_reqs": "CERT_REQUIRED"}


class Pools:
    """This process's urllib3 managers: one direct, one per proxy, each per HTTPS setting. Thread-safe."""

    def __init__(self) -> None:
        import urllib3

        if not hasattr(urllib3.HTTPResponse, "read1"):  # urllib3 1.x, or 2.0-2.1
            raise ImportError(f"chute's downloads need urllib3>=2.2 (installed: {urllib3.__version__}): "
                              "pip install -U 'urllib3>=2.2'")
        self._lock = threading.Lock()
        self._managers: dict[tuple[str | None, bool | str], Any] = {}
        self._local = threading.local()
        self._classes = _pool_classes(self._local)
        self._users = 0  # the remotes of this process that use the pools (see join)

    def manager(self, url: str, verify: bool | str = True, proxies: Mapping[str, str] | None = None) -> Any:
        """The manager a GET of ``url`` goes through (a ProxyManager when a proxy applies, see :func:`proxy_for`)."""
        proxy = proxy_for(url, proxies)
        key = (proxy, verify)
        found = self._managers.get(key)
        if found is None:
            with self._lock:
                found = self._managers.get(key)
                if found is None:
                    found = self._managers[key] = self._make(proxy, verify)
        return found

    def _make(self, proxy: str | None, verify: bool | str) -> Any:
        import urllib3

        options: dict[str, Any] = dict(num_pools=MAX_HOSTS, maxsize=MAX_PER_HOST, block=False, **_tls(verify))
        if proxy is None:
            made = urllib3.PoolManager(**options)
        else:
            parts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
            if parts.scheme.startswith("socks"):
                try:
                    from urllib3.contrib.socks import SOCKSProxyManager
                except ImportError:
                    raise ProxyError(f"the proxy {parts.scheme}://{parts.hostname}:{parts.port} needs PySocks: "
                                     "pip install 'urllib3[socks]'") from None
                made = SOCKSProxyManager(proxy, **options)
            elif parts.scheme not in ("http", "https"):
                raise ProxyError(f"cannot use the proxy {proxy!r}: chute speaks to http://, https:// and socks proxies")
            else:
                headers = None
                if parts.username is not None:  # credentials go to the proxy only, as Proxy-Authorization
                    auth = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
                    headers = urllib3.make_headers(proxy_basic_auth=auth)
                netloc = parts.hostname or ""
                if ":" in netloc:
                    netloc = f"[{netloc}]"
                if parts.port is not None:
                    netloc += f":{parts.port}"
                made = urllib3.ProxyManager(f"{parts.scheme}://{netloc}", proxy_headers=headers, **options)
        made.pool_classes_by_scheme = self._classes
        return made

    @contextmanager
    def watching(self) -> Iterator[Watch]:
        """Within this block, the connection each request of this thread uses is recorded in the yielded Watch."""
        watch = Watch()
        previous = getattr(self._local, "watch", None)
        self._local.watch = watch
        try:
            yield watch
        finally:
            self._local.watch = previous

    def join(self, user: object) -> Callable[[], Any]:
        """``user`` (a dataset's :class:`~chute.storage.net.remote.Remote`) uses the pools from now on, until
        it is collected or the returned function is called (once: later calls do nothing). Once no user is
        left, the kept connections are closed: a process done with its remote datasets keeps no socket open."""
        with self._lock:
            self._users += 1
        return weakref.finalize(user, self._leave)

    def _leave(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users == 0
        if last:
            self.clear()

    def clear(self) -> None:
        """Close every kept connection (in use ones close when their response is done)."""
        with self._lock:
            managers = list(self._managers.values())
            self._managers.clear()
        for manager in managers:
            manager.clear()


class _Process:
    """The one :class:`Pools` of this process (made again after a fork)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = 0
        self._pools: Pools | None = None

    def __call__(self) -> Pools:
        pools = self._pools
        if pools is None or self._pid != os.getpid():
            with self._lock:
                if self._pools is None or self._pid != os.getpid():
                    self._pools, self._pid = Pools(), os.getpid()
                pools = self._pools
        return pools


#: This process's pools: ``pools().manager(url)``.
pools: Callable[[], Pools] = _Process()

__all__ = ["Pools", "ProxyError", "Watch", "bypassed", "environment_proxies", "origin", "pools", "proxy_for"]
