"""End-to-end tests of rendezvousd as a systemd service: the notify protocol against a real
datagram socket standing in for systemd, SIGTERM and SIGHUP, and Prometheus metrics over HTTP."""
import os
import re
import select
import signal
import socket
import subprocess
import time
import unittest

from harness import LauncherTestCase, alive, wait_for
from test_rendezvous import RendezvousTestCase

# Systemd's watchdog for these tests: pings every 0.2 s.
WATCHDOG_USEC = 400000
# Waits in the worker until the test creates $MCPRUN_TEST_DIR/go. The worker script has written
# its pid file already (the same shell runs this); writing it again would truncate it, and a test
# reading the pids at that moment would miss one.
HOLD = 'while [ ! -e "$MCPRUN_TEST_DIR/go" ]; do sleep 0.05; done'


class ServiceTestCase(RendezvousTestCase):
    """rendezvousd started as systemd would: with NOTIFY_SOCKET, WATCHDOG_USEC and a config file."""

    def setUp(self):
        LauncherTestCase.setUp(self)  # Not RendezvousTestCase's daemon: each test starts its own.
        self.daemon_log = os.path.join(self.tmp, "rendezvousd.log")
        self.notify_path = os.path.join(self.tmp, "notify.sock")
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(self.notify_path)
        self.config = os.path.join(self.tmp, "rendezvousd.yaml")

    def tearDown(self):
        super().tearDown()
        self.notify.close()

    def start_service(self, config_text="", listen="127.0.0.1:0"):
        with open(self.config, "w") as f:
            f.write(config_text)
        env = dict(self.env, NOTIFY_SOCKET=self.notify_path, WATCHDOG_USEC=str(WATCHDOG_USEC))
        started_at = len(self.read_log()) if os.path.exists(self.daemon_log) else 0
        self.start_daemon(listen, "--config", self.config, "--metrics-listen", "127.0.0.1:0", env=env)
        self.metrics_port = int(wait_for(lambda: re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics",
                                                           self.read_log()[started_at:]), 10).group(1))

    def notifications(self, until, timeout=10, pings=False):
        """Datagrams received until one satisfies `until` (returned last) or `timeout` passes;
        WATCHDOG=1 among them only with `pings`."""
        received = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.notify.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                message = self.notify.recv(4096).decode()
            except socket.timeout:
                break
            if message == "WATCHDOG=1" and not pings:
                continue
            received.append(message)
            if until(message):
                break
        return received

    def scrape(self, path="/metrics"):
        """The daemon's answer to GET `path`: (status code, body)."""
        with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=10) as conn:
            conn.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := conn.recv(65536):
                answer += chunk
        head, _, body = answer.decode().partition("\r\n\r\n")
        return int(head.split()[1]), body

    def metrics(self):
        code, body = self.scrape()
        self.assertEqual(code, 200, body)
        samples = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples, body

    def job(self, job, *args, nnodes="2", **kwargs):
        return [self.agent(f"{job}-n{i}", *args, job=job, nnodes=nnodes, nproc="1", **kwargs)
                for i in range(int(nnodes))]

    @staticmethod
    def stderr_until(proc, text, timeout):
        """What `proc` wrote to stderr until `text` appeared or `timeout` passed. Read from the raw
        descriptor, so a later communicate() returns the rest."""
        seen = b""
        deadline = time.monotonic() + timeout
        while text.encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(proc.stderr.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
        return seen.decode(errors="replace")


class Notify(ServiceTestCase):
    def test_ready_watchdog_status_and_stopping_reach_systemd(self):
        socket_path = os.path.join(self.tmp, "rendezvousd.sock")
        self.start_service(f"unix_socket: {socket_path}\n")
        ready = self.notifications(lambda m: m.startswith("READY=1"))
        self.assertTrue(ready and ready[-1].startswith("READY=1\nSTATUS=jobs: 0 joining"), ready)
        # Ready means listening: both the TCP port and the unix socket take a connection.
        socket.create_connection(("127.0.0.1", int(self.endpoint.split(":")[1])), timeout=5).close()
        with socket.socket(socket.AF_UNIX) as local:
            local.connect(socket_path)

        started = time.monotonic()
        pings = self.notifications(lambda m: False, timeout=1.5, pings=True)
        self.assertGreaterEqual(pings.count("WATCHDOG=1"), 4, pings)
        self.assertLess(time.monotonic() - started, 3)

        agents = self.job("held", extra_env={"BEHAVIOUR_0": HOLD, "BEHAVIOUR_1": HOLD})
        self.assertTrue(wait_for(lambda: len(self.pids()) == 2, 30), self.read_log())
        status = self.notifications(lambda m: "1 running" in m)
        self.assertRegex(status[-1], r"^STATUS=jobs: 0 joining, 1 running, 0 finished; nodes: 2; connections: \d+$")
        open(os.path.join(self.tmp, "go"), "w").close()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)

        self.daemon.send_signal(signal.SIGTERM)
        stopping = self.notifications(lambda m: m == "STOPPING=1")
        self.assertEqual(stopping[-1], "STOPPING=1", stopping)
        self.assertEqual(self.daemon.wait(timeout=10), 0)


class Lifecycle(ServiceTestCase):
    def test_sigterm_exits_0_in_time_and_running_jobs_keep_their_workers(self):
        self.start_service("stop_timeout_s: 3\n")
        agents = self.job("kept", extra_env={"BEHAVIOUR_0": HOLD, "BEHAVIOUR_1": HOLD})
        forming = self.agent("alone", job="forming", nnodes="2", nproc="1")
        self.assertTrue(wait_for(lambda: len(self.pids()) == 2 and "job forming: alone" in self.read_log(), 30),
                        self.read_log())
        workers = self.pids()
        started = time.monotonic()
        self.daemon.send_signal(signal.SIGTERM)
        self.assertEqual(self.daemon.wait(timeout=10), 0, self.read_log())
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(forming.wait(timeout=10), 75)  # A round that never formed has nothing to keep.
        # Each agent has handled the lost connection, where it would have stopped its workers.
        kept = "the workers keep running while this node reconnects"
        early = [self.stderr_until(proc, kept, timeout=10) for proc in agents]
        for text in early:
            self.assertIn(kept, text)
        self.assertTrue(all(alive(pid) for pid in workers), "a worker was stopped by the daemon's exit")
        self.assertTrue(all(proc.poll() is None for proc in agents))

        self.start_service("stop_timeout_s: 3\n", listen=self.endpoint)
        self.assertTrue(wait_for(lambda: "(2 of 2 node(s))" in self.read_log(), 30), self.read_log())
        open(os.path.join(self.tmp, "go"), "w").close()
        for (code, _, err), text in zip(self.finish(agents), early):
            self.assertEqual(code, 0, text + err)
        self.assertEqual(sorted(self.pids()), sorted(workers), "a worker was restarted")

    def test_sighup_keeps_the_old_config_when_the_new_one_is_bad_and_applies_a_good_one(self):
        old, new = self.script("old.token", "old-token\n"), self.script("new.token", "new-token\n")
        self.start_service(f"token_file: {old}\n")
        self.notifications(lambda m: m.startswith("READY=1"))

        def join(token_file):
            """One node of an elastic job (a single-node job would not use the rendezvous)."""
            return self.finish([self.agent("solo", "--rdzv-token-file", token_file, "--rdzv-conf",
                                           "last_call_timeout=0.1", job=f"j{time.monotonic_ns()}",
                                           nnodes="1:2", nproc="1")])[0]

        def reload(text):
            with open(self.config, "w") as f:
                f.write(text)
            self.daemon.send_signal(signal.SIGHUP)
            return self.notifications(lambda m: m.startswith("READY=1"))

        answers = reload(f"token_file: {new}\nlease_s: [\n")
        self.assertTrue(answers[0].startswith("RELOADING=1\nMONOTONIC_USEC="), answers)
        self.assertTrue(answers[-1].startswith("READY=1"), answers)
        refused = [line for line in self.read_log().splitlines() if "reload refused" in line]
        self.assertEqual(len(refused), 1, self.read_log())
        self.assertIn(self.config, refused[0])
        code, _, err = join(old)
        self.assertEqual(code, 0, err)

        moved = os.path.join(self.tmp, "moved.sock")
        reload(f"token_file: {new}\nunix_socket: {moved}\nlog_level: debug\n")
        log = self.read_log()
        self.assertIn("reloaded the configuration from " + self.config, log)
        self.assertIn(f"unix_socket changed from '' to '{moved}'; that needs a restart", log)
        self.assertFalse(os.path.exists(moved))
        code, _, err = join(old)
        self.assertEqual(code, 75, err + self.read_log())
        self.assertIn("authentication failed", err)
        code, _, err = join(new)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.scrape("/nothing HTTP")[0], 400)  # Logged at debug level only.
        self.assertTrue(wait_for(lambda: "debug: metrics: bad request" in self.read_log(), 5), self.read_log())


class Metrics(ServiceTestCase):
    def test_a_real_job_shows_in_the_metrics(self):
        self.start_service()
        samples, body = self.metrics()
        self.assertEqual(samples["mcprun_rendezvous_rounds_total"], 0)
        for family in ("mcprun_jobs", "mcprun_nodes", "mcprun_connections", "mcprun_rendezvous_rounds_total",
                       "mcprun_rendezvous_round_duration_seconds", "mcprun_failures_total", "mcprun_stalls_total",
                       "mcprun_restarts_total", "mcprun_gpu_leases", "mcprun_port_leases", "process_resident_memory_bytes"):
            self.assertIn(f"# HELP {family} ", body)
            self.assertIn(f"# TYPE {family} ", body)

        for code, _, err in self.finish(self.job("ok")):
            self.assertEqual(code, 0, err)
        samples, _ = self.metrics()
        self.assertGreaterEqual(samples["mcprun_rendezvous_rounds_total"], 1)
        histogram = "mcprun_rendezvous_round_duration_seconds"
        self.assertEqual(samples[histogram + "_count"], samples["mcprun_rendezvous_rounds_total"])
        self.assertEqual(samples[histogram + '_bucket{le="+Inf"}'], samples[histogram + "_count"])
        self.assertEqual(samples['mcprun_jobs{state="finished"}'], 1)
        self.assertEqual(samples['mcprun_jobs{state="running"}'], 0)
        self.assertEqual(samples["mcprun_failures_total"], 0)
        self.assertGreater(samples["process_resident_memory_bytes"], 0)

        # One worker fails once, while the other waits; with a restart left the job re-forms and
        # then succeeds.
        flaky = {"BEHAVIOUR_0": '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] || exec sleep 60',
                 "BEHAVIOUR_1": '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] || exit 4'}
        for code, _, err in self.finish(self.job("flaky", "--max-restarts", "1", extra_env=flaky)):
            self.assertEqual(code, 0, err)
        samples, _ = self.metrics()
        self.assertEqual(samples["mcprun_failures_total"], 1)
        self.assertEqual(samples["mcprun_restarts_total"], 1)
        self.assertEqual(samples["mcprun_rendezvous_rounds_total"], 3)
        self.assertEqual(samples['mcprun_jobs{state="finished"}'], 2)

    def test_bad_requests_cost_only_their_connection(self):
        self.start_service()
        self.assertEqual(self.scrape("/")[0], 404)
        for request in (b"\x16\x03\x01\x02\x00garbage\r\n\r\n",
                        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=10) as conn:
                try:
                    conn.sendall(request)
                    answer = conn.recv(65536)
                except (BrokenPipeError, ConnectionResetError):
                    answer = b""
                self.assertTrue(answer == b"" or re.match(rb"HTTP/1\.1 4\d\d ", answer), answer[:100])
        # A scraper that says nothing is cut off by the deadline, and never blocks the others.
        silent = socket.create_connection(("127.0.0.1", self.metrics_port))
        self.assertEqual(self.scrape()[0], 200)
        for code, _, err in self.finish(self.job("after")):
            self.assertEqual(code, 0, err)
        silent.close()


if __name__ == "__main__":
    unittest.main()
