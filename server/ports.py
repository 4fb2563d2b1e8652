"""Port ownership: only the processes of one ``netgain serve`` share its port.

The frontends listen with SO_REUSEPORT so that the kernel spreads connections over them;
a second server doing the same would silently take half of the traffic. So before
listening, a socket without SO_REUSEPORT is bound to the address: it fails while any
socket, of another server or ours, listens there.

That check alone races: two servers started at the same moment both pass it before either
listens. So the check is made under a per-port claim, held until the server's own sockets
listen (``release_claims``): on Linux an abstract Unix socket named after the port (scoped,
like the port, to the network namespace; freed by the kernel when its holder dies). A second
start waits for the claim, then fails the check.

A port the kernel chooses (``--port 0``) is held by a socket bound with SO_REUSEPORT and never
listening, until the frontends listen: otherwise any connect() on the host may take it as its
ephemeral source port in between, and every frontend fails to bind. A port given (``--port
50051``, inside Linux's default ephemeral range) is held the same way once its check passes,
where the sockets that will listen on it bind with SO_REUSEPORT (``hold``).
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Collection

CLAIM_WAIT_S = 120.0
_HELD: list[socket.socket] = []


def _check(host: str, port: int, flag: str = "--port") -> int:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT is not a server
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"{flag} {port}: {host}:{port} is already in use, by another netgain serve or another "
                    f"program; stop it or choose another {flag}"
                ) from None
            raise ValueError(f"--host {host} {flag} {port}: cannot bind ({exc.strerror})") from None
        return int(s.getsockname()[1])


def reserve(host: str, checked: bool = False, port: int = 0, flag: str = "--port") -> socket.socket:
    """``port`` (0: one the kernel chooses), kept bound (never listening) until closed: SO_REUSEPORT
    sockets (the frontends') may join it, a connect() may not take it as its source port.
    ``checked``: a server's bind check passes on it too (SO_REUSEADDR, which a socket that is not
    listening shares; as in the check, a closed server's TIME_WAIT is no owner)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        if checked:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host, port))
    except OSError as exc:
        s.close()
        where = f"--host {host} {flag} {port}" if port else f"--host {host}"
        raise ValueError(f"{where}: cannot bind ({exc.strerror})") from None
    return s


def _take_claim(
    port: int, wait_s: float, clock: Callable[[], float], sleep: Callable[[float], None], flag: str = "--port"
) -> socket.socket | None:
    """The port's claim (any host: 0.0.0.0 and 127.0.0.1 share a port), waiting for another
    start-up holding it; None where abstract Unix sockets do not exist."""
    if not sys.platform.startswith("linux"):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    end = clock() + wait_s
    while True:
        try:
            s.bind(f"\0netgain-serve-port-{port}")
            return s
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or clock() > end:
                s.close()
                raise ValueError(
                    f"{flag} {port}: another netgain serve has been starting on port {port} for "
                    f"{wait_s:.0f} s; stop it or choose another {flag}"
                ) from None
        sleep(0.05)


def claim_port(
    host: str,
    port: int,
    wait_s: float = CLAIM_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    flag: str = "--port",
    taken: Collection[int] = (),
    hold: bool = True,
) -> int:
    """The port to serve on (a free one for 0, none of ``taken``: ports this server claimed
    already), claimed until ``release_claims``; ValueError naming ``flag`` and the port when it is
    served already. ``hold``: a given port is also kept bound until then (its listeners must bind
    with SO_REUSEPORT)."""
    if port == 0 and hasattr(socket, "SO_REUSEPORT"):
        reserved, passed = reserve(host), []
        while reserved.getsockname()[1] in taken:  # claimed by this server, not bound until it listens
            passed.append(reserved)  # kept bound until a port is found, so the kernel offers another
            reserved = reserve(host)
        for s in passed:
            s.close()
        port = int(reserved.getsockname()[1])
        try:
            claim = _take_claim(port, wait_s, clock, sleep, flag)
        except ValueError:
            reserved.close()
            raise
        _HELD.extend(s for s in (claim, reserved) if s is not None)
        return port
    if port == 0:
        port = _check(host, 0, flag)
        while port in taken:  # the kernel may offer a port claimed but not yet listened on
            port = _check(host, 0, flag)
    claim = _take_claim(port, wait_s, clock, sleep, flag)
    held = None
    try:
        _check(host, port, flag)
        if hold and hasattr(socket, "SO_REUSEPORT"):
            held = reserve(host, checked=True, port=port, flag=flag)
    except ValueError:
        if claim is not None:
            claim.close()
        raise
    _HELD.extend(s for s in (claim, held) if s is not None)
    return port


def release_claims() -> None:
    """Once this server's sockets listen: the check alone now refuses the port to others."""
    for s in _HELD:
        s.close()
    _HELD.clear()


# A forked child holds no claim: the claim is the parent's, which releases it alone.
os.register_at_fork(after_in_child=release_claims)
