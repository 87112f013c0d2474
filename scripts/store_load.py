"""A load generator for a c10d store: thousands of simulated ranks in one asyncio loop, each with
one connection that speaks torch 2.x's TCPStore wire protocol (the bytes torch's own client sends
for the same calls: tests/e2e/test_scale.py records torch 2.13's client and compares).

Used by scripts/bench-scale and the scale tests. Each phase is a coroutine over a list of
connected ranks; the caller bounds it in time.
"""
import asyncio
import json
import os
import struct
import time

# torch 2.x's QueryType (TCPStoreBackend.hpp).
VALIDATE, SET, GET, ADD, WAIT, PING = 0, 1, 3, 4, 6, 13
MAGIC = 0x3C85F7CE
STOP_WAITING = 0
VALUE = b"v" * 64



def key_bytes(key):
    """A key on the wire: torch 2.x's client sends every key with a "/" before it."""
    raw = b"/" + key.encode()
    return struct.pack("<Q", len(raw)) + raw


def request_set(key, value):
    return bytes([SET]) + key_bytes(key) + struct.pack("<Q", len(value)) + value


def request_add(key, delta):
    return bytes([ADD]) + key_bytes(key) + struct.pack("<q", delta)


def request_wait(keys):
    return bytes([WAIT]) + struct.pack("<Q", len(keys)) + b"".join(key_bytes(k) for k in keys)


def request_get(key):
    return bytes([GET]) + key_bytes(key)


class Rank(asyncio.Protocol):
    """One simulated rank's connection: writes requests and reads their replies in order."""

    def __init__(self):
        self.transport = None
        self.buffer = bytearray()
        self.pending = []  # (reply size or "bytes", future), oldest first
        self.lost = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buffer += data
        while self.pending:
            size, future = self.pending[0]
            if size == "bytes":
                if len(self.buffer) < 8:
                    return
                length = struct.unpack_from("<Q", self.buffer)[0]
                if len(self.buffer) < 8 + length:
                    return
                reply = bytes(self.buffer[8:8 + length])
                del self.buffer[:8 + length]
            else:
                if len(self.buffer) < size:
                    return
                reply = bytes(self.buffer[:size])
                del self.buffer[:size]
            self.pending.pop(0)
            if not future.done():
                future.set_result(reply)

    def connection_lost(self, exc):
        self.lost = exc or ConnectionResetError("closed by the server")
        for _, future in self.pending:
            if not future.done():
                future.set_exception(self.lost)
        self.pending.clear()

    def ask(self, request, reply_size):
        if self.lost:
            raise self.lost
        future = asyncio.get_running_loop().create_future()
        self.pending.append((reply_size, future))
        self.transport.write(request)
        return future

    def send(self, request):
        if self.lost:
            raise self.lost
        self.transport.write(request)


async def connect_rank(port, errors):
    loop = asyncio.get_running_loop()
    try:
        _, rank = await loop.create_connection(Rank, "127.0.0.1", port)
        rank.send(struct.pack("<BI", VALIDATE, MAGIC))
        nonce = os.getpid() & 0xFFFFFFFF
        if struct.unpack("<I", await rank.ask(struct.pack("<BI", PING, nonce), 4))[0] != nonce:
            raise ConnectionError("PING answered with another nonce")
        return rank
    except OSError as error:
        errors.append(type(error).__name__ if not error.strerror else error.strerror)
        return None


async def barrier(ranks, prefix):
    size = len(ranks)

    async def one(rank):
        count = struct.unpack("<q", await rank.ask(request_add(prefix + "/count", 1), 8))[0]
        if count == size:
            rank.send(request_set(prefix + "/last", b"1"))
        if (await rank.ask(request_wait([prefix + "/last"]), 1))[0] != STOP_WAITING:
            raise ConnectionError("WAIT answered with something else")

    await asyncio.gather(*(one(rank) for rank in ranks))


async def init_pattern(ranks):
    size = len(ranks)

    async def one(index, rank):
        rank.send(request_set(f"init/{index}", VALUE))
        needed = sorted({0, (index + 1) % size, (index - 1) % size})
        keys = [f"init/{each}" for each in needed]
        if (await rank.ask(request_wait(keys), 1))[0] != STOP_WAITING:
            raise ConnectionError("WAIT answered with something else")
        for key in keys:
            if await rank.ask(request_get(key), "bytes") != VALUE:
                raise ConnectionError(f"GET {key} answered another value")

    await asyncio.gather(*(one(index, rank) for index, rank in enumerate(ranks)))


def progress_record(rank, number, pending=None, frames=("train.py:41 in main",), completed=None):
    """A record as the progress reporter (worker_helper/mcprun/_progress.py) writes it; by default a
    healthy loop's, one collective completed per record."""
    return json.dumps({"v": 1, "rank": rank, "pid": 100000 + rank, "n": number,
                       "source": "flight_recorder",
                       "completed": number if completed is None else completed,
                       "pending": pending or [], "cpu_s": 1.0, "frames": list(frames)},
                      separators=(",", ":")).encode()


async def progress_records(ranks, seconds, record=None):
    """Every rank sets mcprun/progress/<rank> once a second, spread over the second;
    record(rank, number) makes each (progress_record by default, a healthy loop)."""
    record = record or progress_record
    size = len(ranks)
    start = time.monotonic()
    for second in range(seconds):
        for index, rank in enumerate(ranks):
            delay = start + second + index / size - time.monotonic()
            if delay > 0.002:
                await asyncio.sleep(delay)
            rank.send(request_set(f"mcprun/progress/{index}", record(index, second + 1)))
    # One round trip per rank: every record sent has been acted on.
    await asyncio.gather(*(rank.ask(struct.pack("<BI", PING, 7), 4) for rank in ranks))


async def connect_ranks(port, size, errors):
    """`size` ranks connected and validated at once; a rank that could not is left out and its
    error appended to `errors` (no connect is retried)."""
    ranks = await asyncio.gather(*(connect_rank(port, errors) for _ in range(size)))
    return [rank for rank in ranks if rank]
