"""A loopback stand-in for mooncake's ``TransferEngine`` (test only): one-sided writes between processes
of one host over TCP, the surface SGLang's ``MooncakeTransferEngine`` calls
(sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py:143-284).

Each engine serves its registered memory on an RPC port (``get_rpc_port``; the session id is
``host:port``). ``batch_transfer_sync_write`` sends ``(peer address, length, bytes)`` items read from the
local buffers; the peer ``memmove``s each into its memory only if it lies inside a registered range, and
answers 1 (all written) or 0 (an item outside, refused: the write returns -1). SGLang's mooncake
connector (bootstrap, ZMQ handshake, page / state indices) is unchanged; only the data plane is this.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading

_HDR = struct.Struct("!I")
_ITEM = struct.Struct("!QQ")


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


class TransferEngine:
    def __init__(self) -> None:
        self._regions: dict[int, int] = {}
        self._lock = threading.Lock()
        self._port = 0

    def initialize(self, hostname: str, metadata: str, protocol: str, device: str) -> int:
        host = hostname.split(":")[0]
        self._srv = socket.create_server((host, 0))
        self._port = self._srv.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()
        return 0

    def get_rpc_port(self) -> int:
        return self._port

    def register_memory(self, ptr: int, length: int) -> int:
        with self._lock:
            self._regions[int(ptr)] = int(length)
        return 0

    def unregister_memory(self, ptr: int) -> int:
        with self._lock:
            self._regions.pop(int(ptr), None)
        return 0

    def batch_register_memory(self, ptrs, lengths) -> int:
        for p, n in zip(ptrs, lengths):
            self.register_memory(p, n)
        return 0

    def batch_unregister_memory(self, ptrs) -> int:
        for p in ptrs:
            self.unregister_memory(p)
        return 0

    def _inside(self, addr: int, n: int) -> bool:
        with self._lock:
            return any(base <= addr and addr + n <= base + size for base, size in self._regions.items())

    def _serve(self) -> None:
        while True:
            conn, _ = self._srv.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    (count,) = _HDR.unpack(_recv(conn, _HDR.size))
                    ok = 1
                    for _ in range(count):
                        addr, n = _ITEM.unpack(_recv(conn, _ITEM.size))
                        data = _recv(conn, n)
                        if self._inside(addr, n):
                            ctypes.memmove(addr, data, n)
                        else:
                            ok = 0
                    conn.sendall(_HDR.pack(ok))
            except ConnectionError:
                return

    def batch_transfer_sync_write(self, session_id: str, buffers, peer_addresses, lengths) -> int:
        host, port = session_id.rsplit(":", 1)
        with socket.create_connection((host.strip("[]"), int(port))) as sock:
            parts = [_HDR.pack(len(buffers))]
            for src, dst, n in zip(buffers, peer_addresses, lengths):
                parts.append(_ITEM.pack(int(dst), int(n)))
                parts.append(ctypes.string_at(int(src), int(n)))
            sock.sendall(b"".join(parts))
            (ok,) = _HDR.unpack(_recv(sock, _HDR.size))
        return 0 if ok else -1

    def transfer_sync_write(self, session_id: str, buffer: int, peer_address: int, length: int) -> int:
        return self.batch_transfer_sync_write(session_id, [buffer], [peer_address], [length])

    def send_probe(self, peer_session_id: str) -> int:
        return 0

    def get_engine(self):
        return self
