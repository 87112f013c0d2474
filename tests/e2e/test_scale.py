"""The job store and rendezvousd at a size this box runs in seconds (4,096 connections), driven by
the load generator of scripts/bench-scale; rendezvousd's jobs and idle agents through the load
generator of scripts/bench-rendezvous; and the one-line warnings where the host's limits
(descriptors, listen backlog) cannot hold the configured size."""
import asyncio
import json
import os
import re
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading

from harness import MCPRUN, REPO, LauncherTestCase, wait_for

sys.path.insert(0, os.path.join(REPO, "scripts"))
import store_load  # noqa: E402  (scripts/ is not a package)

RENDEZVOUSD = os.environ.get("RENDEZVOUSD", os.path.join(os.path.dirname(MCPRUN), "../rendezvousd/rendezvousd"))
# The C++ load generator (benchmarks/store_load), built beside mcprun.
STORE_LOAD = os.environ.get("STORE_LOAD", os.path.join(os.path.dirname(MCPRUN),
                                                       "../benchmarks/store_load/store_load"))
# The C++ agent simulator (benchmarks/rendezvous_load), built beside mcprun.
RENDEZVOUS_LOAD = os.environ.get("RENDEZVOUS_LOAD", os.path.join(
    os.path.dirname(MCPRUN), "../benchmarks/rendezvous_load/rendezvous_load"))
TORCH2_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
RANKS = 4096
PHASE_TIMEOUT = 60  # Seconds any one phase may take on a loaded box; a few on an idle one.
WARNING = "needs more than this host allows"


def first_line(stream, timeout):
    """The next line of `stream` (bytes when it is unbuffered), or empty past `timeout`."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return stream.readline() if ready else ""


def torch_calls_bytes(nonce):
    """What torch 2.x's client sends for VALIDATE, PING, a size-1 barrier and a size-1 init pattern:
    add, set, wait, then set and get (torch's get is a WAIT and a GET)."""
    return (struct.pack("<BI", store_load.VALIDATE, store_load.MAGIC) +
            struct.pack("<BI", store_load.PING, nonce) +
            store_load.request_add("b/count", 1) + store_load.request_set("b/last", b"1") +
            store_load.request_wait(["b/last"]) +
            store_load.request_set("init/0", store_load.VALUE) +
            store_load.request_wait(["init/0"]) + store_load.request_get("init/0"))


def descriptors_for(count):
    """Raises this process's open-file limit for `count` connections; False when it cannot."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count + 64:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return True


class RecordingProxy:
    """Forwards one client's connection to `port`, keeping what the client sent."""

    def __init__(self, port):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = bytearray()
        self.thread = threading.Thread(target=self.serve, args=(port,), daemon=True)
        self.thread.start()

    def serve(self, port):
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", port))
        with client, upstream:
            while True:
                ready, _, _ = select.select([client, upstream], [], [], 30)
                if not ready:
                    return
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client:
                        self.sent += data
                        upstream.sendall(data)
                    else:
                        client.sendall(data)

    def close(self):
        self.listener.close()
        self.thread.join(timeout=30)


class StoreAtScaleTest(LauncherTestCase):
    def start_store(self, *flags, prefix=()):
        proc = subprocess.Popen([*prefix, MCPRUN, "store", "--host", "127.0.0.1", "--port", "0", *flags],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        line = first_line(proc.stdout, 30)
        match = re.fullmatch(r"mcprun store: listening on 127\.0\.0\.1:(\d+)\n", line)
        self.assertTrue(match, f"no port line: {line!r}")
        return proc, int(match.group(1))

    def stop(self, proc):
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        return err

    def test_4096_ranks_connect_and_pass_a_barrier_without_a_reset(self):
        if not descriptors_for(RANKS):
            self.skipTest(f"the hard open-file limit cannot hold {RANKS} connections")
        proc, port = self.start_store("--ranks", str(RANKS))

        async def drive():
            errors = []
            ranks = await asyncio.wait_for(store_load.connect_ranks(port, RANKS, errors), PHASE_TIMEOUT)
            self.assertEqual(errors, [])
            self.assertEqual(len(ranks), RANKS)
            await asyncio.wait_for(store_load.barrier(ranks, "barrier"), PHASE_TIMEOUT)
            await asyncio.wait_for(store_load.init_pattern(ranks), PHASE_TIMEOUT)
            self.assertEqual([rank for rank in ranks if rank.lost], [])
            for rank in ranks:
                rank.transport.close()

        asyncio.run(drive())
        self.assertIsNone(proc.poll())
        self.stop(proc)

    def test_store_warns_in_one_line_when_the_descriptor_limit_is_short(self):
        proc, _ = self.start_store("--ranks", str(RANKS), prefix=("prlimit", "--nofile=1024:1024", "--"))
        err = self.stop(proc)
        warnings = [line for line in err.splitlines() if WARNING in line]
        self.assertEqual(len(warnings), 1, err)
        self.assertIn(f"the store for {RANKS} ranks", warnings[0])
        self.assertIn("ulimit -n is 1024", warnings[0])

    def test_store_is_quiet_when_the_limits_hold_the_ranks(self):
        proc, _ = self.start_store("--ranks", "100")
        self.assertNotIn(WARNING, self.stop(proc))

    def test_rendezvousd_warns_in_one_line_of_a_short_descriptor_limit_and_backlog(self):
        config = self.script("rendezvousd.yaml", f"listen: 127.0.0.1:0\nmetrics_listen: ''\n"
                                                 f"max_connections: {RANKS}\nlisten_backlog: 1024\n")
        # Unbuffered, so that select() sees every line that has not been read yet.
        proc = subprocess.Popen(["prlimit", "--nofile=1024:1024", "--", RENDEZVOUSD, "--config", config],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                                start_new_session=True)
        self.procs.append(proc)
        log = []
        while not any("listening on" in line for line in log):
            line = first_line(proc.stderr, 30).decode()
            self.assertTrue(line, f"rendezvousd did not start: {log}")
            log.append(line)
        self.stop(proc)
        warnings = [line for line in log if WARNING in line]
        self.assertEqual(len(warnings), 1, log)
        self.assertIn(f"max_connections {RANKS}", warnings[0])
        self.assertIn("ulimit -n is 1024", warnings[0])
        self.assertIn("the listen backlog asked for is 1024", warnings[0])

    def run_cpp_load(self, port, commands, timeout=PHASE_TIMEOUT):
        """Runs the C++ generator's commands against `port`; returns (its pid, its answers)."""
        load = subprocess.run([STORE_LOAD, "--port", str(port), "--timeout", str(timeout)],
                              input="".join(command + "\n" for command in commands),
                              capture_output=True, text=True, timeout=timeout * len(commands) + 30)
        self.assertEqual(load.returncode, 0, load.stderr)
        return [json.loads(line) for line in load.stdout.splitlines()]

    def torch_client_bytes(self, port):
        """The bytes torch 2.13's own client sends for torch_calls_bytes' calls, and its pid."""
        proxy = RecordingProxy(port)
        client = subprocess.run([TORCH2_PYTHON, "-c", f'''
import datetime, os, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", {proxy.port}, None, False, datetime.timedelta(seconds=30),
                      wait_for_workers=False)
assert store.add("b/count", 1) == 1
store.set("b/last", b"1")
store.wait(["b/last"])
store.set("init/0", b"v" * 64)
assert store.get("init/0") == b"v" * 64
print(os.getpid())
'''], capture_output=True, text=True, timeout=120)
        self.assertEqual(client.returncode, 0, client.stderr)
        proxy.close()
        return bytes(proxy.sent), int(client.stdout.split()[-1]) & 0xFFFFFFFF

    def test_both_load_generators_send_the_bytes_torch_2_client_sends(self):
        if not os.path.exists(TORCH2_PYTHON):
            self.skipTest("no torch 2.13 (.venv)")
        # The Python generator's encoding (bench-scale's watchdog phase) is torch_calls_bytes'.
        proc, port = self.start_store()
        torch_sent, torch_pid = self.torch_client_bytes(port)
        self.assertEqual(torch_sent.hex(), torch_calls_bytes(torch_pid).hex())
        self.stop(proc)
        if not os.path.exists(STORE_LOAD):
            self.skipTest(f"no load generator at {STORE_LOAD} (built with mcprun)")
        proc, port = self.start_store()  # Fresh: the barrier's count starts at 0 again.
        proxy = RecordingProxy(port)
        load = subprocess.Popen([STORE_LOAD, "--port", str(proxy.port), "--timeout", "30"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(load)
        out, _ = load.communicate("connect 1\nbarrier b\ninit\n", timeout=120)
        proxy.close()
        answers = [json.loads(line) for line in out.splitlines()]
        self.assertEqual([(a["phase"], a["completed"], a["errors"]) for a in answers],
                         [("connect", 1, 0), ("barrier", 1, 0), ("init", 1, 0)])
        # The same calls, the same bytes: only PING's nonce differs, each client's pid.
        self.assertEqual(bytes(proxy.sent).hex(), torch_calls_bytes(load.pid).hex())
        self.stop(proc)

    def test_4096_ranks_through_the_cpp_load_generator_without_a_reset(self):
        if not descriptors_for(RANKS):
            self.skipTest(f"the hard open-file limit cannot hold {RANKS} connections")
        if not os.path.exists(STORE_LOAD):
            self.skipTest(f"no load generator at {STORE_LOAD} (built with mcprun)")
        proc, port = self.start_store("--ranks", str(RANKS))
        answers = self.run_cpp_load(port, [f"connect {RANKS}", "barrier b", "init"])
        for answer in answers:
            self.assertIsNotNone(answer["seconds"], answer)
            self.assertEqual((answer["completed"], answer["errors"], answer["lost"]), (RANKS, 0, 0),
                             answer)
        self.assertIsNone(proc.poll())
        self.stop(proc)


class RendezvousAtScaleTest(LauncherTestCase):
    AGENTS, JOBS, IDLE_SECONDS = 512, 2, 2

    def start_daemon(self):
        """rendezvousd with its defaults, as bench-rendezvous starts it; its log goes to a file,
        which a line per join cannot fill as an unread pipe would."""
        log_path = os.path.join(self.tmp, "rendezvousd.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen([RENDEZVOUSD, "--listen", "127.0.0.1:0"], stdout=log, stderr=log,
                                    start_new_session=True)
        self.procs.append(proc)

        def listening():
            with open(log_path) as log:
                return re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read())

        found = wait_for(listening, 30)
        self.assertTrue(found, f"rendezvousd did not start (exit {proc.poll()})")
        return proc, int(found.group(1))

    def test_512_agents_in_2_jobs_get_exact_ranks_and_idle_without_a_lost_connection(self):
        if not descriptors_for(self.AGENTS):
            self.skipTest(f"the hard open-file limit cannot hold {self.AGENTS} connections")
        if not os.path.exists(RENDEZVOUS_LOAD):
            self.skipTest(f"no load generator at {RENDEZVOUS_LOAD} (built with mcprun)")
        proc, port = self.start_daemon()
        load = subprocess.run([RENDEZVOUS_LOAD, "--port", str(port), "--timeout", str(PHASE_TIMEOUT)],
                              input=f"connect {self.AGENTS}\njoin {self.JOBS}\nidle {self.IDLE_SECONDS}\n",
                              capture_output=True, text=True, timeout=3 * PHASE_TIMEOUT + 30)
        self.assertEqual(load.returncode, 0, load.stderr)
        connect, join, idle = [json.loads(line) for line in load.stdout.splitlines()]
        self.assertEqual((connect["connected"], connect["errors"]), (self.AGENTS, 0), connect)

        size = self.AGENTS // self.JOBS
        self.assertEqual(len(join["jobs"]), self.JOBS, join)
        self.assertEqual(len({job["job"] for job in join["jobs"]}), self.JOBS, join)
        for job in join["jobs"]:
            # ok: every agent assigned, group ranks exactly 0..n-1, world size n.
            self.assertTrue(job["ok"], job)
            self.assertEqual((job["agents"], job["assigned"], job["errors"]), (size, size, 0), job)
            self.assertIsNotNone(job["seconds"], job)
        # The pace the daemon told: a third of its 15 s lease while it holds under 5,000 agents.
        interval_ms = join["jobs"][0]["heartbeat_interval_ms"]
        self.assertEqual({job["heartbeat_interval_ms"] for job in join["jobs"]}, {interval_ms})
        self.assertEqual(interval_ms, 5000, join)

        self.assertEqual((idle["agents"], idle["lost"]), (self.AGENTS, 0), idle)
        # Spread evenly over the interval: the share of the agents whose first one fell in the idle.
        spread = self.AGENTS * self.IDLE_SECONDS * 1000 / interval_ms
        self.assertGreaterEqual(idle["heartbeats"], 0.8 * spread, idle)
        self.assertLessEqual(idle["heartbeats"], spread + 1, idle)
        self.assertIsNone(proc.poll())
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


if __name__ == "__main__":
    import unittest
    unittest.main()
