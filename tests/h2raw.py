"""A minimal raw HTTP/2 client for hostile-input tests (no tests here).

Speaks just enough HTTP/2 to send what a well-behaved gRPC client never would: header values that
are not UTF-8, a gRPC length prefix that declares more bytes than are sent, a message body that
stops short and is never finished. Headers are HPACK literals without indexing or Huffman coding.
Every read is bounded by a socket timeout and every loop by a deadline.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack(headers: list[tuple[bytes, bytes]]) -> bytes:
    """Literal header fields without indexing, new names, no Huffman coding."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value
    return bytes(out)


def grpc_headers(port: int, method: str, extra: list[tuple[bytes, bytes]] | None = None) -> bytes:
    return hpack(
        [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", method.encode()),
            (b":authority", f"127.0.0.1:{port}".encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
            *(extra or []),
        ]
    )


class H2Conn:
    """One plaintext HTTP/2 connection. ``pump`` reads frames, answers SETTINGS and PING, and
    keeps the peer's flow-control windows so ``send_data`` never exceeds them."""

    def __init__(self, port: int, timeout_s: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.port = port
        self.buf = b""
        self.conn_window = 65535
        self.stream_windows: dict[int, int] = {}
        self.initial_window = 65535
        self.max_frame = 16384
        self.settings: dict[int, int] = {}
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.closed = False
        self.sock.sendall(PREFACE + frame(SETTINGS, 0, 0))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def _read_frame(self, timeout_s: float) -> tuple[int, int, int, bytes] | None:
        end = time.monotonic() + timeout_s
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    kind, flags = self.buf[3], self.buf[4]
                    stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                    payload = self.buf[9 : 9 + n]
                    self.buf = self.buf[9 + n :]
                    return kind, flags, stream, payload
            left = end - time.monotonic()
            if left <= 0 or self.closed:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            except OSError:
                self.closed = True
                return None
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk

    def pump(self, timeout_s: float) -> list[tuple[int, int, int, bytes]]:
        """Read and handle frames until none arrives for ``timeout_s`` (or the peer closes)."""
        got = []
        while True:
            f = self._read_frame(timeout_s)
            if f is None:
                return got
            kind, flags, stream, payload = f
            got.append(f)
            self.frames.append(f)
            if kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack(">HI", payload[i : i + 6])
                    self.settings[key] = value
                    if key == 0x4:
                        self.initial_window = value
                    elif key == 0x5:
                        self.max_frame = value
                self.sock.sendall(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            elif kind == WINDOW_UPDATE:
                inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                if stream == 0:
                    self.conn_window += inc
                else:
                    self.stream_windows[stream] = self.stream_windows.get(stream, self.initial_window) + inc
            elif kind == GOAWAY:
                self.closed = True

    def open_stream(self, stream: int, headers: bytes) -> None:
        self.stream_windows.setdefault(stream, self.initial_window)
        self.sock.sendall(frame(HEADERS, END_HEADERS, stream, headers))

    def send_data(self, stream: int, data: bytes, end_stream: bool, deadline: float) -> int:
        """Send as much of ``data`` as the windows allow before ``deadline``; returns bytes sent."""
        sent = 0
        while sent < len(data) and time.monotonic() < deadline and not self.closed:
            room = min(self.conn_window, self.stream_windows.get(stream, self.initial_window), self.max_frame)
            if room <= 0:
                self.pump(0.2)
                continue
            chunk = data[sent : sent + room]
            last = end_stream and sent + len(chunk) == len(data)
            try:
                self.sock.sendall(frame(DATA, END_STREAM if last else 0, stream, chunk))
            except OSError:
                self.closed = True
                break
            sent += len(chunk)
            self.conn_window -= len(chunk)
            self.stream_windows[stream] = self.stream_windows.get(stream, self.initial_window) - len(chunk)
        return sent

    def headers_of(self, stream: int) -> list[bytes]:
        """Raw HPACK blocks the server sent on ``stream`` (for substring checks only)."""
        return [p for k, _, s, p in self.frames if k == HEADERS and s == stream]

    def stream_ended(self, stream: int) -> bool:
        return any(
            (k == HEADERS and f & END_STREAM) or k == RST_STREAM for k, f, s, _ in self.frames if s == stream
        )


def grpc_message(body: bytes, declared: int | None = None, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message; ``declared`` overrides the length in the prefix."""
    n = len(body) if declared is None else declared
    return bytes([1 if compressed else 0]) + struct.pack(">I", n) + body
