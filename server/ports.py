"""Port ownership: only the processes of one ``netgain serve`` share its port.

The frontends listen with SO_REUSEPORT so that the kernel spreads connections over them;
a second server doing the same would silently take half of the traffic. So before
listening, a socket without SO_REUSEPORT is bound to the address: it fails while any
socket, of another server or ours, listens there.
"""

from __future__ import annotations

import errno
import socket


def claim_port(host: str, port: int) -> int:
    """The port to serve on (a free one for 0); ValueError naming the port when it is served already."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT is not a server
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ValueError(
                    f"--port {port}: {host}:{port} is already in use, by another netgain serve or another "
                    "program; stop it or choose another --port"
                ) from None
            raise ValueError(f"--host {host} --port {port}: cannot bind ({exc.strerror})") from None
        return int(s.getsockname()[1])
