"""Which names the dashboard answers to, and which requests may change something.

A page on any site can resolve its own name to 127.0.0.1 (DNS rebinding) and then read
the dashboard as if it were that site: the browser sees one origin throughout. The
only trace is the ``Host`` header, which carries the attacker's name; so the dashboard
answers only the names it is served as. State-changing requests must also come from a
page of the dashboard itself: a browser says where a request comes from in ``Origin``
and ``Sec-Fetch-Site``, and another site cannot forge either.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from pgwork.errors import ConfigurationError

__all__ = ["LOOPBACK_NAMES", "HostPattern", "allowed_host", "parse_hosts", "same_origin"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""What ``create_dashboard`` answers to unless told otherwise: this machine's names."""

_DEFAULT_PORTS = {"http": "80", "https": "443"}


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A name the dashboard is served as, with its port, or any port when None."""

    name: str
    port: str | None

    def matches(self, name: str, port: str | None) -> bool:
        return name == self.name and (self.port is None or port == self.port)


def _split(value: str) -> tuple[str, str | None] | None:
    """``name[:port]`` (``[v6]`` bracketed) lower-cased, or None when malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[: end + 1], value[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] or None
    else:
        name, sep, port_text = value.partition(":")
        port = port_text if sep else None
        if ":" in port_text:
            return None
    if not name or (port is not None and not port.isdigit()):
        return None
    return name, port


def parse_hosts(values: Iterable[str]) -> tuple[HostPattern, ...] | None:
    """Check and normalise the allowed names; None means any (``"*"`` given)."""
    patterns = []
    for value in values:
        if value.strip() == "*":
            return None
        split = _split(value) if isinstance(value, str) else None
        if split is None or any(c in split[0] for c in "/@ \t"):
            raise ConfigurationError(
                f"allowed host {value!r} is not a host name: give a name or address with "
                "an optional port, e.g. 'dash.example.com' or '10.0.0.5:8321' (IPv6 in "
                "brackets), or '*' to answer any name"
            )
        patterns.append(HostPattern(*split))
    if not patterns:
        raise ConfigurationError("allowed_hosts is empty: no request could ever be answered")
    return tuple(patterns)


def allowed_host(host_header: str | None, patterns: tuple[HostPattern, ...], scheme: str) -> bool:
    """Whether the request's ``Host`` names the dashboard. A missing port is the
    scheme's default one, as the browser meant it."""
    if not host_header:
        return False
    split = _split(host_header)
    if split is None:
        return False
    name, port = split
    port = port or _DEFAULT_PORTS.get(scheme)
    return any(p.matches(name, port) for p in patterns)


def same_origin(
    host_header: str | None, origin: str | None, fetch_site: str | None, scheme: str
) -> bool:
    """Whether a state-changing request comes from a page of this dashboard.

    ``Sec-Fetch-Site``, when sent, must say ``same-origin`` (a sibling subdomain is
    ``same-site``: refused). ``Origin``, when sent, must name the host the request was
    sent to, and be https when the dashboard is. A request with neither is not a
    browser's (every browser sends ``Origin`` with a POST): the CSRF token decides.
    """
    if fetch_site is not None and fetch_site.strip().lower() != "same-origin":
        return False
    if origin is None:
        return True
    parts = urlsplit(origin.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc or not host_header:
        return False  # "null" (a sandboxed frame, a data: URL) included
    if scheme == "https" and parts.scheme != "https":
        return False
    given = _split(parts.netloc)
    wanted = _split(host_header)
    if given is None or wanted is None:
        return False
    # A Host without a port (a proxy in front speaking https, the app plain http)
    # means the port the browser used: the default of the Origin's scheme.
    default = _DEFAULT_PORTS[parts.scheme]
    return given[0] == wanted[0] and (given[1] or default) == (wanted[1] or default)
