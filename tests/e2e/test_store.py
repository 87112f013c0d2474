"""End-to-end tests of `mcprun store` with torch's own TCPStore client (torch 1.13 or 2.13, as the
suite runs), and byte-for-byte comparisons with torch's own TCPStore servers for what that
client's Python API cannot send (check, watch_key, malformed requests), in both dialects."""
import datetime
import os
import re
import select
import signal
import socket
import struct
import subprocess
import time

import torch.distributed as dist

from harness import MCPRUN, PYTHON, TORCH2, LauncherTestCase, wait_for

CLIENT_TIMEOUT = datetime.timedelta(seconds=30)

# Prelude of every client subprocess: argv[1] is the store's port.
CLIENT = r'''
import datetime, os, sys, time
import torch.distributed as dist
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), None, False,
                      datetime.timedelta(seconds=30), wait_for_workers=False)
'''

# Waits for the keys in argv[2] (comma-separated), then prints the last one's value.
WAITER = CLIENT + r'''
keys = sys.argv[2].split(",")
store.wait(keys)
print(store.get(keys[-1]).decode(), flush=True)
'''

# One of many ranks: counts, publishes its key, waits for everyone's and reads them all.
RANK = CLIENT + r'''
rank, world, adds = map(int, sys.argv[2:5])
totals = [store.add("counter", 1) for _ in range(adds)]
store.add("sum", rank - 7)
store.set(f"rank{rank}", f"hello from {rank}")
store.wait([f"rank{r}" for r in range(world)])
seen = [store.get(f"rank{r}").decode() for r in range(world)]
assert seen == [f"hello from {r}" for r in range(world)], seen
print(" ".join(map(str, totals)), flush=True)
'''

# A real process group over the store: argv[1] port, argv[2] rank; prints the all_reduce result.
PROCESS_GROUP = r'''
import datetime, os, sys
import torch, torch.distributed as dist
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank,
                        world_size=2, timeout=datetime.timedelta(seconds=30))
value = torch.tensor([rank + 1.0])
dist.all_reduce(value)
print(value.item(), flush=True)
dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
dist.destroy_process_group()
'''

# torch's own TCPStore server, for comparison: prints its port, serves until stdin closes. Run by
# Debian's torch 1.13 it speaks the 1.x dialect; by torch 2.13, the 2.x one (its libuv server).
TORCH1_PYTHON = "/usr/bin/python3"
TORCH_SERVER = r'''
import datetime, sys
import torch.distributed as dist
server = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                       wait_for_workers=False)
print(server.port, flush=True)
sys.stdin.read()
'''

# torch 1.x query numbers, and the fields as its tcputil writes them (host order: little endian).
SET, COMPARE_SET, GET, ADD, CHECK, WAIT, NUM_KEYS, WATCH_KEY, DELETE_KEY = (bytes([n]) for n in range(9))
# torch 2.x: VALIDATE opens the connection; SET..GETNUMKEYS moved up by one.
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
(V2_SET, V2_COMPARE_SET, V2_GET, V2_ADD, V2_CHECK, V2_WAIT, V2_NUM_KEYS, V2_DELETE_KEY, V2_APPEND,
 V2_PING, V2_QUEUE_PUSH, V2_QUEUE_POP, V2_BARRIER) = (
    bytes([n]) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 14, 15, 18))


def u64(n):
    return struct.pack("<Q", n)


def i64(n):
    return struct.pack("<q", n)


def s(text):
    data = text.encode() if isinstance(text, str) else text
    return u64(len(data)) + data


def notice(kind, key, old, new):
    """torch 1.x's watch_key message: WatchResponseType, key, old value, new value."""
    return bytes([kind]) + s(key) + s(old) + s(new)


def read_line(stream, timeout):
    """The next line of a child's stdout, or "" when none comes within `timeout` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


class RawClient:
    """A bare connection that speaks the wire format by hand."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data, one_byte_at_a_time=False):
        if one_byte_at_a_time:
            for i in range(len(data)):
                self.sock.sendall(data[i:i + 1])
        else:
            self.sock.sendall(data)

    def recv(self, n):
        """Exactly `n` bytes, or fewer if the server closes or goes quiet for 10 s."""
        data = b""
        try:
            while len(data) < n:
                chunk = self.sock.recv(n - len(data))
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
        return data

    def close(self):
        self.sock.close()

    def ask(self, data, reply_size):
        self.send(data)
        return self.recv(reply_size)

    def closed_by_server(self):
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False


class StoreTestCase(LauncherTestCase):
    """Starts `mcprun store -v` on a free loopback port for each test."""

    def setUp(self):
        super().setUp()
        self.store, self.port, self.store_log = self.start_store("-v")

    def tearDown(self):
        if self.store.poll() is None:
            self.store.send_signal(signal.SIGTERM)
            self.store.wait(timeout=10)
        super().tearDown()

    def start_store(self, *flags):
        log_path = os.path.join(self.tmp, f"store{len(self.procs)}.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([MCPRUN, "store", "--host", "127.0.0.1", "--port", "0", *flags],
                                    stdout=subprocess.PIPE, stderr=log, text=True,
                                    start_new_session=True)
        self.procs.append(proc)
        line = read_line(proc.stdout, 10)
        match = re.fullmatch(r"mcprun store: listening on 127\.0\.0\.1:(\d+)\n", line)
        if not match:
            with open(log_path) as log:
                self.fail(f"first line {line!r}; log: {log.read()}")
        return proc, int(match.group(1)), log_path

    def log(self):
        with open(self.store_log) as f:
            return f.read()

    def wait_for_log(self, pattern, timeout=10):
        if not wait_for(lambda: re.search(pattern, self.log()), timeout):
            self.fail(f"no {pattern!r} in the store's log:\n{self.log()}")

    def raw(self, port=None):
        client = RawClient(port or self.port)
        self.addCleanup(client.close)
        return client

    def client(self, port=None, timeout=CLIENT_TIMEOUT):
        return dist.TCPStore("127.0.0.1", port or self.port, None, False, timeout,
                             wait_for_workers=False)

    def spawn(self, script, *args, env=None):
        proc = subprocess.Popen([PYTHON, "-c", script, str(self.port), *map(str, args)],
                                env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        return proc


class Store(StoreTestCase):
    def test_values_round_trip_byte_for_byte(self):
        writer, reader = self.client(), self.client()
        values = {"empty": b"", "binary": bytes(range(256)) * 4, "large": os.urandom(1 << 20),
                  "text": "ünïcode".encode()}
        for key, value in values.items():
            writer.set(key, value)
        for key, value in values.items():
            self.assertEqual(reader.get(key), value, key)
        writer.set("text", b"replaced")
        self.assertEqual(reader.get("text"), b"replaced")

    def test_add_keeps_a_decimal_counter(self):
        store = self.client()
        self.assertEqual(store.add("n", 5), 5)
        self.assertEqual(store.add("n", -8), -3)
        self.assertEqual(store.add("n", 0), -3)
        self.assertEqual(store.get("n"), b"-3")
        self.assertEqual(store.add("fresh", 0), 0)  # Creates the key.
        self.assertEqual(store.get("fresh"), b"0")
        store.set("preset", "40")
        self.assertEqual(store.add("preset", 2), 42)

    def test_many_processes_add_exactly_and_see_each_others_keys(self):
        world, adds = 32, 50
        ranks = [self.spawn(RANK, rank, world, adds) for rank in range(world)]
        totals = []
        for rank, proc in enumerate(ranks):
            out, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, f"rank {rank}: {err}")
            totals += [int(t) for t in out.split()]
        # Every add returned a distinct running total: none was lost or applied twice.
        self.assertEqual(sorted(totals), list(range(1, world * adds + 1)))
        store = self.client()
        self.assertEqual(store.get("counter"), str(world * adds).encode())
        self.assertEqual(store.get("sum"), str(sum(r - 7 for r in range(world))).encode())
        self.assertEqual(store.num_keys(), world + 2)

    def test_hundreds_of_connections_wait_and_are_woken_by_one_set(self):
        waiters = [self.raw() for _ in range(500)]
        for i, waiter in enumerate(waiters):
            waiter.send(WAIT + u64(2) + s("/go") + s(f"/own{i}") + SET + s(f"/own{i}") + s("x"))
        # Each connection's own key exists once its wait has been read.
        self.assertTrue(wait_for(lambda: waiters[-1].ask(NUM_KEYS, 8) == i64(500), 10))
        self.client().set("go", "now")
        self.assertEqual([waiter.recv(1) for waiter in waiters], [b"\x00"] * 500)

    def test_compare_set_follows_torch(self):
        store = self.client()
        self.assertEqual(store.compare_set("k", "", "first"), b"first")  # Missing, empty expected.
        self.assertEqual(store.get("k"), b"first")
        self.assertEqual(store.compare_set("other", "x", "y"), b"x")  # Missing: torch answers x.
        self.assertEqual(store.num_keys(), 1)
        self.assertEqual(store.compare_set("k", "first", "second"), b"second")  # Match.
        self.assertEqual(store.compare_set("k", "stale", "third"), b"second")  # Mismatch.
        self.assertEqual(store.get("k"), b"second")

    def test_wait_returns_once_another_client_sets_every_key(self):
        waiter = self.spawn(WAITER, "x,y")
        self.wait_for_log(r"WAIT /x")
        setter = self.client()
        setter.set("x", "1")
        with self.assertRaises(subprocess.TimeoutExpired):  # y is still missing.
            waiter.wait(timeout=1)
        setter.set("y", "done")
        out, err = waiter.communicate(timeout=10)
        self.assertEqual((waiter.returncode, out), (0, "done\n"), err)

    def test_wait_that_times_out_raises_in_about_its_timeout(self):
        store = self.client()
        start = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "(?i)timeout"):  # 1.13: "Timeout", 2.13: "wait timeout"
            store.wait(["never"], datetime.timedelta(seconds=1))
        self.assertGreater(time.monotonic() - start, 0.9)
        self.assertLess(time.monotonic() - start, 3)
        self.assertEqual(self.client().num_keys(), 0)

    def test_delete_key_and_num_keys(self):
        store = self.client()
        for key in ("a", "b", "c"):
            store.set(key, key)
        self.assertEqual(store.num_keys(), 3)
        self.assertTrue(store.delete_key("b"))
        self.assertFalse(store.delete_key("b"))
        self.assertEqual(store.num_keys(), 2)
        short = self.client(timeout=datetime.timedelta(seconds=1))
        with self.assertRaisesRegex(RuntimeError, "(?i)timeout"):
            short.get("b")  # get waits for the key, which is gone.
        self.assertEqual(store.get("a"), b"a")

    def test_prefix_store_over_mcprun_store(self):
        store = self.client()
        job = dist.PrefixStore("job7", store)
        job.set("a", "1")
        self.assertEqual(job.add("n", 3), 3)
        job.wait(["a", "n"])
        self.assertEqual(store.get("job7/a"), b"1")
        self.assertEqual(dist.PrefixStore("job7", self.client()).get("n"), b"3")
        nested = dist.PrefixStore("inner", job)
        nested.set("b", "2")
        self.assertEqual(store.get("job7/inner/b"), b"2")

    def test_a_client_killed_mid_wait_does_not_disturb_the_others(self):
        waiter = self.spawn(WAITER, "never")
        self.wait_for_log(r"WAIT /never")
        os.kill(waiter.pid, signal.SIGKILL)
        waiter.wait(timeout=10)
        self.wait_for_log(r"closed by the client")
        store = self.client()
        store.set("never", "now")  # Whom it would have woken is gone.
        survivor = self.spawn(WAITER, "never")
        out, err = survivor.communicate(timeout=30)
        self.assertEqual((survivor.returncode, out), (0, "now\n"), err)
        self.assertIsNone(self.store.poll())
        self.assertNotRegex(self.log(), r"warning|error")

    def test_ranks_init_a_process_group_through_the_store(self):
        env = dict(self.env, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                   GLOO_SOCKET_IFNAME="lo")
        ranks = [self.spawn(PROCESS_GROUP, rank, env=env) for rank in range(2)]
        for proc in ranks:
            out, err = proc.communicate(timeout=120)
            self.assertEqual((proc.returncode, out), (0, "3.0\n"), err)
        # As captured from real clients (launcher/store/torch_keys.hpp): 2.x has no attempt prefix.
        self.assertRegex(self.log(), r"SET /default_pg/" if TORCH2 else r"SET //worker/attempt_0/default_pg/")

    def test_sigterm_stops_the_store_and_releases_blocked_clients(self):
        waiter = self.spawn(WAITER, "never")
        self.wait_for_log(r"WAIT /never")
        self.store.send_signal(signal.SIGTERM)
        self.assertEqual(self.store.wait(timeout=10), 0)
        self.assertRegex(self.log(), r"received signal 15")
        _, err = waiter.communicate(timeout=20)  # Its wait fails now, well before its timeout.
        self.assertNotEqual(waiter.returncode, 0)
        with self.assertRaises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", self.port), timeout=5)

    def test_speaks_the_torch2_dialect(self):
        # No torch 2.x here: a connection that opens as torch 2.x clients do, by hand.
        a, b = self.raw(), self.raw()
        self.assertEqual(a.ask(VALIDATE + V2_PING + struct.pack("<I", 12345), 4),
                         struct.pack("<I", 12345))
        b.send(VALIDATE)
        a.send(V2_SET + s("/k") + s("v2"))
        self.assertEqual(a.ask(V2_ADD + s("/n") + i64(2), 8), i64(2))
        self.assertEqual(b.ask(V2_GET + s("/k") + V2_GET + s("/absent"), 18), s("v2") + s(""))
        a.send(V2_QUEUE_PUSH + s("/q") + s("item"))
        a.ask(V2_PING + struct.pack("<I", 1), 4)  # The push has been read.
        self.assertEqual(b.ask(V2_QUEUE_POP + s("/q"), 20), i64(1) + s("item"))
        a.send(V2_BARRIER + s("/b") + i64(2))
        self.assertEqual(b.ask(V2_BARRIER + s("/b") + i64(2), 1), b"\x00")
        self.assertEqual(a.recv(1), b"\x00")
        self.assertEqual(self.client().get("k"), b"v2")  # And torch 1.x clients see it.


class CommandLine(StoreTestCase):
    def test_help_explains_the_store(self):
        code, out, err = self.run_mcprun("store", "--help", timeout=10)
        self.assertEqual(code, 0, err)
        self.assertIn("Usage: mcprun store", out)
        self.assertIn("TORCHELASTIC_USE_AGENT_STORE", out)
        self.assertIn("--port", out)

    def test_bad_flags_exit_2_with_one_line(self):
        for args in (["--port", "70000"], ["--port", "x"], ["--frobnicate"]):
            code, out, err = self.run_mcprun("store", *args, timeout=10)
            self.assertEqual(code, 2, args)
            self.assertRegex(err, r"^mcprun: error: [^\n]+\n$", args)
            self.assertEqual(out, "")

    def test_a_port_in_use_exits_1_with_one_line(self):
        code, out, err = self.run_mcprun("store", "--host", "127.0.0.1", "--port", str(self.port),
                                         timeout=10)
        self.assertEqual(code, 1)
        self.assertEqual(err, f"mcprun: error: cannot listen on 127.0.0.1:{self.port}: "
                              "Address already in use\n")
        self.assertEqual(out, "")


class SameBytesAsTorchsServer(StoreTestCase):
    """Runs one raw torch 1.x conversation against torch's server and against mcprun store."""

    def conversation(self, port):
        a, b, w = self.raw(port), self.raw(port), self.raw(port)
        steps = {"watch /w": w.ask(WATCH_KEY + s("/w"), 1), "watch /c": w.ask(WATCH_KEY + s("/c"), 1)}
        a.send(SET + s("/w") + s("one"))
        steps["check /w /nope"] = a.ask(CHECK + u64(2) + s("/w") + s("/nope"), 1)
        steps["check /w"] = a.ask(CHECK + u64(1) + s("/w"), 1)
        steps["add 5"] = a.ask(ADD + s("/c") + i64(5), 8)
        steps["add -2"] = a.ask(ADD + s("/c") + i64(-2), 8)
        a.send(SET + s("/w") + s("two"), one_byte_at_a_time=True)
        steps["sync"] = a.ask(NUM_KEYS, 8)
        steps["delete"] = b.ask(DELETE_KEY + s("/w"), 8)
        steps["delete again"] = b.ask(DELETE_KEY + s("/w"), 8)
        steps["compare_set"] = b.ask(COMPARE_SET + s("/c") + s("3") + s("9"), 9)
        steps["notices"] = w.recv(30 + 28 + 29 + 33 + 30 + 29)
        # A wait on two keys, registered (the NUM_KEYS answer proves it was read), then completed.
        steps["wait pending"] = b.ask(WAIT + u64(2) + s("/p") + s("/q") + NUM_KEYS, 8)
        a.send(SET + s("/p") + s("1"))
        steps["half set"] = a.ask(NUM_KEYS, 8)
        a.send(SET + s("/q") + s("2"))
        steps["woken"] = b.recv(1)
        steps["pipelined"] = a.ask(SET + s("/r") + s("x" * 100) + GET + s("/r") + NUM_KEYS, 116)
        for name, bad in (("huge length", SET + u64(1 << 60)), ("unknown query", b"\xc8"),
                          ("get of a missing key", GET + s("/missing"))):
            c = self.raw(port)
            c.send(bad)
            steps[name + " closes"] = c.closed_by_server()
        steps["still serving"] = a.ask(NUM_KEYS, 8)
        return steps

    def torch_server(self, python):
        server = subprocess.Popen([python, "-c", TORCH_SERVER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(server)
        return server, int(read_line(server.stdout, 30))

    def test_conversation_matches_torch_byte_for_byte(self):
        torch_server, torch_port = self.torch_server(TORCH1_PYTHON)  # The 1.x dialect's reference.
        expected = self.conversation(torch_port)
        torch_server.stdin.close()
        got = self.conversation(self.port)
        for step in expected:
            self.assertEqual(got[step], expected[step], step)
        # And what those bytes mean, so that a change in both would not pass unnoticed.
        self.assertEqual(got["watch /w"], b"\x03")  # KEY_CALLBACK_REGISTERED
        self.assertEqual((got["check /w /nope"], got["check /w"]), (b"\x01", b"\x00"))
        self.assertEqual(got["notices"],
                         notice(1, "/w", "", "one") + notice(1, "/c", "", "5") +
                         notice(0, "/c", "5", "3") + notice(0, "/w", "one", "two") +
                         notice(2, "/w", "two", "") + notice(0, "/c", "3", "9"))
        self.assertEqual(got["woken"], b"\x00")
        self.assertEqual(got["pipelined"], s("x" * 100) + i64(4))
        self.assertTrue(got["huge length closes"] and got["unknown query closes"])

    def conversation_v2(self, port):
        """The same ground in torch 2.x's dialect: every connection opens with VALIDATE."""
        def client():
            c = self.raw(port)
            c.send(VALIDATE)
            return c
        a, b = client(), client()
        steps = {"ping": a.ask(V2_PING + struct.pack("<I", 77), 4)}
        a.send(V2_SET + s("/w") + s("one"))
        steps["check /w /nope"] = a.ask(V2_CHECK + u64(2) + s("/w") + s("/nope"), 1)
        steps["check /w"] = a.ask(V2_CHECK + u64(1) + s("/w"), 1)
        steps["add 5"] = a.ask(V2_ADD + s("/c") + i64(5), 8)
        steps["add -2"] = a.ask(V2_ADD + s("/c") + i64(-2), 8)
        a.send(V2_SET + s("/w") + s("two"), one_byte_at_a_time=True)
        steps["get"] = a.ask(V2_GET + s("/w"), 8 + 3)
        steps["append"] = a.ask(V2_APPEND + s("/w") + s("+") + V2_GET + s("/w"), 8 + 4)
        steps["num keys"] = a.ask(V2_NUM_KEYS, 8)
        steps["delete"] = b.ask(V2_DELETE_KEY + s("/w"), 8)
        steps["delete again"] = b.ask(V2_DELETE_KEY + s("/w"), 8)
        steps["compare_set"] = b.ask(V2_COMPARE_SET + s("/c") + s("3") + s("9"), 9)
        steps["compare_set missing"] = b.ask(V2_COMPARE_SET + s("/m") + s("") + s("new"), 11)
        steps["wait pending"] = b.ask(V2_WAIT + u64(2) + s("/p") + s("/q") + V2_NUM_KEYS, 8)
        a.send(V2_SET + s("/p") + s("1"))
        steps["half set"] = a.ask(V2_NUM_KEYS, 8)
        a.send(V2_SET + s("/q") + s("2"))
        steps["woken"] = b.recv(1)
        steps["pipelined"] = a.ask(V2_SET + s("/r") + s("x" * 100) + V2_GET + s("/r") + V2_NUM_KEYS, 116)
        for name, bad in (("huge length", V2_SET + u64(1 << 60)), ("unknown query", b"\xc8")):
            c = client()
            c.send(bad)
            steps[name + " closes"] = c.closed_by_server()
        steps["still serving"] = a.ask(V2_NUM_KEYS, 8)
        return steps

    def test_torch2_conversation_matches_torch2s_server_byte_for_byte(self):
        if not TORCH2:
            self.skipTest("needs torch 2.x's own server: runs in the torch2.13 suite")
        torch_server, torch_port = self.torch_server(PYTHON)
        expected = self.conversation_v2(torch_port)
        torch_server.stdin.close()
        got = self.conversation_v2(self.port)
        for step in expected:
            self.assertEqual(got[step], expected[step], step)
        self.assertEqual(got["ping"], struct.pack("<I", 77))
        self.assertEqual(got["append"], s("two+"))
        self.assertEqual(got["woken"], b"\x00")


if __name__ == "__main__":
    import unittest
    unittest.main()
