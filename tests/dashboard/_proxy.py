"""A TCP relay in front of PostgreSQL that a test can cut, so a dashboard loses its
database the way a network does: open connections go silent and new ones are accepted
but never answered (no reset, nothing for the client to notice but time)."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class Relay:
    def __init__(self, target: tuple[str, int] | str) -> None:
        """``target``: the server's (host, port), or the path of its Unix socket."""
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.cut_off = threading.Event()
        self.closing = threading.Event()
        self.held: list[socket.socket] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self._spawn(self._accept)

    def cut(self) -> None:
        """From now on nothing passes either way, and nothing is closed."""
        self.cut_off.set()

    def close(self) -> None:
        self.closing.set()
        self.listener.close()
        for sock in self.held:
            sock.close()
        for thread in self.threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self.threads.append(thread)

    def _accept(self) -> None:
        self.listener.settimeout(0.2)  # so close() is seen; accept() ignores it
        while not self.closing.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            self.held.append(client)
            if self.cut_off.is_set():
                continue  # accepted, never answered
            if isinstance(self.target, str):
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.connect(self.target)
            else:
                server = socket.create_connection(self.target)
            self.held.append(server)
            self._spawn(self._pump, client, server)

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self.closing.is_set():
            try:
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                if self.cut_off.is_set():
                    return  # both ends stay open and silent
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
            except OSError:
                return


@contextmanager
def relayed(dsn: str) -> Iterator[tuple[str, Relay]]:
    """``dsn`` rewritten to go through a new relay, and the relay. A server reached by
    its Unix socket (``?host=/dir``, as the embedded one is) is relayed to that socket."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.pop("host", None) or parts.hostname or "127.0.0.1"
    port = int(query.pop("port", None) or parts.port or 5432)
    target: tuple[str, int] | str = (
        f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)
    )
    relay = Relay(target)
    relay.start()
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0] + "@" if len(netloc) == 2 else ""
    relayed_parts = parts._replace(netloc=f"{user}127.0.0.1:{relay.port}", query=urlencode(query))
    try:
        yield urlunsplit(relayed_parts), relay
    finally:
        relay.close()
