"""Hooks a training script can call when launched by mcprun; no dependencies, no-ops elsewhere.

    import mcprun
    for step, batch in enumerate(loader):
        ...
        mcprun.heartbeat()                      # under --heartbeat-timeout: silence is a stall
    mcprun.barrier("checkpoint", timeout=300)   # all ranks on all nodes, or a stall report

They talk to the local mcprun agent over the unix socket named by MCPRUN_AGENT_SOCKET, with the
agent's frames: a 4-byte big-endian length, then a JSON object.
"""

import json
import os
import socket
import struct
import threading

__all__ = ["heartbeat", "barrier", "BarrierError"]

_PROTOCOL_VERSION = 1
_MAX_FRAME_BYTES = 64 * 1024
# Bounds the connect to the agent's socket: an agent that never accepts costs this, not a hang.
_CONNECT_TIMEOUT_S = 10.0
_lock = threading.Lock()
_channel = None  # (pid, socket): a forked child must not share its parent's connection.


class BarrierError(RuntimeError):
    """The barrier did not complete: mcprun declared the job stalled and is stopping it."""


def _connect():
    global _channel
    path = os.environ.get("MCPRUN_AGENT_SOCKET")
    if not path:
        return None
    if _channel is not None and _channel[0] == os.getpid():
        return _channel[1]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    sock.connect(path)
    sock.settimeout(None)  # A barrier waits as long as the agent lets it.
    _channel = (os.getpid(), sock)
    _send(sock, {"type": "hello", "rank": int(os.environ.get("RANK", "0")), "pid": os.getpid()})
    return sock


def _send(sock, message):
    message = dict(message, v=_PROTOCOL_VERSION)
    payload = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def _receive(sock):
    def exactly(count):
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise BarrierError("the mcprun agent closed the connection")
            data += chunk
        return data

    (length,) = struct.unpack(">I", exactly(4))
    if length > _MAX_FRAME_BYTES:
        raise BarrierError(f"the mcprun agent sent an oversized frame ({length} bytes)")
    return json.loads(exactly(length))


def heartbeat():
    """Tells mcprun this rank is making progress. Once a rank has called it, going longer than
    --heartbeat-timeout without another call is a stall."""
    with _lock:
        sock = _connect()
        if sock is not None:
            _send(sock, {"type": "heartbeat"})


def barrier(name, timeout):
    """Waits until every rank of the job (all nodes) has called barrier(name, ...).

    If the barrier is not complete within `timeout` seconds, mcprun declares the job stalled,
    reports the ranks that never arrived, dumps stacks and stops the job; this call then raises
    BarrierError. Outside mcprun, a single-process job passes straight through."""
    with _lock:
        sock = _connect()
        if sock is None:
            if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
                return
            raise BarrierError("mcprun.barrier() needs a job launched by mcprun")
        _send(sock, {"type": "barrier", "name": str(name), "timeout_s": float(timeout)})
        reply = _receive(sock)
        if reply.get("type") != "barrier_done" or reply.get("name") != str(name):
            raise BarrierError(reply.get("reason", f"barrier {name!r} failed: {reply}"))
