"""End-to-end tests of rendezvousd with real mcprun agents on loopback."""
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

from fake_sysfs import make_tree
from harness import MCPRUN, PYTHON, REPO, LauncherTestCase, alive, port_open, reserve_port, wait_for

RENDEZVOUSD = os.environ.get("RENDEZVOUSD", os.path.join(os.path.dirname(MCPRUN), "../rendezvousd/rendezvousd"))

# Records pid and rank assignment, then behaves as $BEHAVIOUR_<RANK> says (default: exit 0).
WORKER = r'''
echo $$ > "$MCPRUN_TEST_DIR/pid.$RANK"
echo "$RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT" > "$MCPRUN_TEST_DIR/rank.$RANK"
eval "behaviour=\${BEHAVIOUR_$RANK:-exit 0}"
eval "$behaviour"
'''


class RendezvousTestCase(LauncherTestCase):
    def setUp(self):
        super().setUp()
        self.daemon_log = os.path.join(self.tmp, "rendezvousd.log")
        self.start_daemon("127.0.0.1:0")

    def start_daemon(self, listen, *flags, env=None, lease="2"):
        """Starts rendezvousd (appending to its log) and waits until it listens."""
        log = open(self.daemon_log, "a")
        started_at = log.tell()
        self.daemon = subprocess.Popen([RENDEZVOUSD, "--listen", listen, "--lease", lease, *flags],
                                       stderr=log, stdout=log, start_new_session=True, env=env)
        log.close()
        port = wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)",
                                          self.read_log()[started_at:]), 10)
        self.assertTrue(port, "rendezvousd did not start: " + self.read_log())
        self.endpoint = "127.0.0.1:" + port.group(1)

    def tearDown(self):
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait()
            self.fail("rendezvousd ignored SIGTERM")
        super().tearDown()

    def read_log(self):
        with open(self.daemon_log) as f:
            return f.read()

    def agent(self, name, *args, job="job1", nnodes="3", nproc="2", extra_env=None, script=None):
        env = dict(self.env, **(extra_env or {}))
        command = ["--nnodes", nnodes, "-n", nproc, "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   self.endpoint, "--rdzv-id", job, "--node-name", name, *args]
        command += [script] if script else ["--no-python", "/bin/sh", "-c", WORKER]
        return self.start(*command, env=env)

    def finish(self, agents, timeout=60):
        """Waits for every agent; one still running after `timeout` fails the test with all logs."""
        results = []
        deadline = time.monotonic() + timeout
        for index, proc in enumerate(agents):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logs = [f"--- agent {i} (exit {code}):\n{err}" for i, (code, _, err) in enumerate(results)]
                for i, rest in enumerate(agents[index:], start=index):
                    state = "hung, killed" if rest.poll() is None else f"exit {rest.returncode}"
                    if rest.poll() is None:
                        os.killpg(rest.pid, signal.SIGKILL)
                    logs.append(f"--- agent {i} ({state}):\n" + rest.communicate()[1])
                self.fail(f"an agent was still running after {timeout} s\n" + "\n".join(logs) +
                          "\n--- rendezvousd:\n" + self.read_log())
            results.append((proc.returncode, out, err))
        return results

    def ranks(self):
        found = {}
        for name in self.files("rank."):
            with open(os.path.join(self.tmp, name)) as f:
                rank, local, group, world, addr, port = f.read().split()
                found[int(rank)] = (int(local), int(group), int(world), addr, int(port))
        return found


class Rendezvous(RendezvousTestCase):
    def test_three_nodes_run_real_ddp_across_six_ranks(self):
        agents = [self.agent(f"node{i}", script=os.path.join(REPO, "examples/ddp_train.py"))
                  for i in range(3)]
        results = self.finish(agents, timeout=120)
        logs = "\n".join(f"--- node{i} (exit {code}):\n{out}{err}" for i, (code, out, err) in enumerate(results))
        self.assertEqual([code for code, _, _ in results], [0, 0, 0], logs)
        out = "".join(r[1] for r in results)
        for rank in range(6):
            self.assertIn(f"[rank{rank}]:rank {rank}/6 local_rank {rank % 2}: done, replicas in sync", out)

    def test_ranks_follow_topology_labels(self):
        labels = {"a": "rack=r2,switch=s1", "b": "rack=r1,switch=s2", "c": "rack=r1,switch=s1"}
        agents = [self.agent(name, "--topology-labels", value) for name, value in labels.items()]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        ranks = self.ranks()
        self.assertEqual(sorted(ranks), list(range(6)))
        # c (r1/s1) is node rank 0, b (r1/s2) 1, a (r2) 2; ranks are contiguous per node.
        self.assertEqual([ranks[r][1] for r in range(6)], [0, 0, 1, 1, 2, 2])
        self.assertEqual({ranks[r][2] for r in range(6)}, {6})
        self.assertEqual(len({(ranks[r][3], ranks[r][4]) for r in range(6)}), 1)
        self.assertIn("job job1: c (127.0.0.1, 2 worker(s), 0 GPU(s)) joined", self.read_log())

    def test_join_timeout_names_who_joined(self):
        agents = [self.agent(f"n{i}", "--rdzv-conf", "join_timeout=2") for i in range(2)]
        started = time.monotonic()
        for code, _, err in self.finish(agents, timeout=30):
            self.assertEqual(code, 75, err)
            self.assertIn("2 of 3 nodes joined: n0 (127.0.0.1), n1 (127.0.0.1)", err)
        self.assertLess(time.monotonic() - started, 10)

    def test_worker_failure_on_one_node_stops_every_node(self):
        sleeper = {f"BEHAVIOUR_{r}": "exec sleep 60" for r in range(6)}
        sleeper["BEHAVIOUR_3"] = 'while [ $(ls "$MCPRUN_TEST_DIR" | grep -c "^pid\\.") -lt 6 ]; do sleep 0.05; done; exit 7'
        agents = [self.agent(f"n{i}", extra_env=sleeper) for i in range(3)]
        started = time.monotonic()
        results = self.finish(agents)
        self.assertLess(time.monotonic() - started, 20)
        for code, _, err in results:
            self.assertEqual(code, 7, err)
        failing = [err for _, _, err in results if "rank:       3 (local rank 1)" in err]
        self.assertEqual(len(failing), 1)
        others = [err for _, _, err in results if "rank 3 on" in err and "failed with exit code 7" in err]
        self.assertEqual(len(others), 2)
        self.assertEqual([p for p in self.pids() if alive(p)], [])

    def test_sigkill_of_one_agent_stops_the_others_and_names_it(self):
        sleeper = {f"BEHAVIOUR_{r}": "exec sleep 60" for r in range(6)}
        agents = [self.agent(f"n{i}", extra_env=sleeper) for i in range(3)]
        self.assertTrue(wait_for(lambda: len(self.pids()) == 6, 30))
        victim = agents[1]
        os.kill(victim.pid, signal.SIGKILL)
        started = time.monotonic()
        results = self.finish([agents[0], agents[2]], timeout=30)
        self.assertLess(time.monotonic() - started, 5)
        for code, _, err in results:
            self.assertEqual(code, 75, err)
            self.assertIn("n1 was lost", err)
        victim.wait()
        self.assertTrue(wait_for(lambda: not any(alive(p) for p in self.pids()), 5))

    def test_two_jobs_side_by_side_one_failing(self):
        good = [self.agent(f"g{i}", job="good", nnodes="2", nproc="1",
                           extra_env={"BEHAVIOUR_0": "sleep 1", "BEHAVIOUR_1": "sleep 1"})
                for i in range(2)]
        bad = [self.agent(f"b{i}", job="bad", nnodes="2", nproc="1",
                          extra_env={"BEHAVIOUR_1": "exit 9", "BEHAVIOUR_0": "exec sleep 60"})
               for i in range(2)]
        self.assertEqual([r[0] for r in self.finish(bad)], [9, 9])
        for code, _, err in self.finish(good):
            self.assertEqual(code, 0, err)

    def test_hostile_peers_cost_only_their_connection(self):
        host, port = self.endpoint.split(":")
        garbage = socket.create_connection((host, int(port)))
        garbage.sendall(struct.pack(">I", 20) + b"GET / HTTP/1.1\r\n\r\n..")
        oversized = socket.create_connection((host, int(port)))
        oversized.sendall(struct.pack(">I", 1 << 30))
        half = socket.create_connection((host, int(port)))
        half.sendall(struct.pack(">I", 100) + b'{"v":1,')
        idle = [socket.create_connection((host, int(port))) for _ in range(200)]
        for sock in (garbage, oversized):
            sock.settimeout(10)
            self.assertEqual(sock.recv(1), b"", "the daemon should close a bad peer")
        agents = [self.agent(f"n{i}", nnodes="2", nproc="1") for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        log = self.read_log()
        self.assertIn("payload is not JSON", log)
        self.assertIn("exceeds the 65536-byte limit", log)
        for sock in [garbage, oversized, half, *idle]:
            sock.close()

    def test_wrong_endpoint_fails_fast_with_one_line(self):
        self.endpoint = f"127.0.0.1:{reserve_port(self)}"
        code, _, err = self.finish([self.agent("n0", "--rdzv-conf", "is_host=false")])[0]
        self.assertEqual(code, 75)
        self.assertIn("cannot reach rendezvous", err)

    def test_c10d_without_a_daemon_hosts_the_rendezvous_in_the_first_agent(self):
        port = reserve_port(self)
        self.endpoint = f"127.0.0.1:{port}"
        # The node at the endpoint hosts it; the others arrive a moment later as its clients.
        host = self.agent("n0", extra_env={"BEHAVIOUR_0": "sleep 1"})
        self.assertTrue(wait_for(lambda: host.poll() is not None or port_open(port), 10))
        others = [self.agent(f"n{i}", "--rdzv-conf", "is_host=false") for i in (1, 2)]
        for code, _, err in self.finish([host, *others]):
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(self.ranks()), list(range(6)))

    def test_token_is_required_when_the_daemon_has_one(self):
        token_file = self.script("token", "s3cret-token\n")
        log = open(os.path.join(self.tmp, "auth.log"), "w")
        daemon = subprocess.Popen([RENDEZVOUSD, "--listen", "127.0.0.1:0", "--token-file", token_file],
                                  stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.procs.append(daemon)
        def auth_log():
            with open(os.path.join(self.tmp, "auth.log")) as f:
                return f.read()
        port = wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", auth_log()), 10)
        self.assertTrue(port, auth_log())
        self.endpoint = "127.0.0.1:" + port.group(1)
        code, _, err = self.finish([self.agent("n0", nnodes="1:2")])[0]
        self.assertEqual(code, 75)
        self.assertIn("authentication failed", err)
        self.assertIn("authentication failed", auth_log())
        agents = [self.agent(f"n{i}", "--rdzv-token-file", token_file, nnodes="2", nproc="1")
                  for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)

    def test_a_failure_restarts_every_node_in_a_new_round(self):
        # Fails in attempt 0, once rank 0 has recorded its start (so the stop cannot overtake it).
        flaky = ('echo "$GROUP_RANK $TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/attempts"; '
                 '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] || { for i in $(seq 400); do '
                 'grep -q "^0 0" "$MCPRUN_TEST_DIR/attempts" && break; sleep 0.05; done; exit 4; }')
        agents = [self.agent(f"n{i}", "--max-restarts", "1", nnodes="2", nproc="1",
                             extra_env={"BEHAVIOUR_1": flaky,
                                        "BEHAVIOUR_0": 'echo "$GROUP_RANK $TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/attempts"; '
                                                       '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] || exec sleep 60'})
                  for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err + self.read_log())
        with open(os.path.join(self.tmp, "attempts")) as f:
            attempts = sorted(f.read().split("\n")[:-1])
        self.assertEqual(attempts, ["0 0", "0 1", "1 0", "1 1"])

    # Rank 0 exits 0 once $MCPRUN_TEST_DIR/release0 exists, rank 1 exits 7 once .../go does; each
    # records its agent's pid and its attempt first.
    FINISH_OR_FAIL = {
        "BEHAVIOUR_0": 'echo $PPID > "$MCPRUN_TEST_DIR/agent.0"; '
                       'while [ ! -e "$MCPRUN_TEST_DIR/release0" ]; do sleep 0.02; done; exit 0',
        "BEHAVIOUR_1": 'echo $PPID > "$MCPRUN_TEST_DIR/agent.1"; '
                       'echo "$TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/attempts.1"; '
                       'while [ ! -e "$MCPRUN_TEST_DIR/go" ]; do sleep 0.02; done; exit 7'}

    def touch(self, name):
        open(os.path.join(self.tmp, name), "w").close()

    def agent_pid(self, rank):
        def recorded():
            try:
                with open(os.path.join(self.tmp, f"agent.{rank}")) as f:
                    return int(f.read())
            except (FileNotFoundError, ValueError):
                return None
        pid = wait_for(recorded, 30)
        self.assertTrue(pid, f"rank {rank} never started")
        return pid

    def test_a_failure_after_the_other_node_finished_ends_the_job_without_a_restart(self):
        # A restart needs every node, and one has finished: waiting out the round would only end
        # in a rendezvous timeout. The failing node exits at once with its worker's code.
        agents = [self.agent(f"n{i}", "--max-restarts", "1", nnodes="2", nproc="1",
                             extra_env=self.FINISH_OR_FAIL) for i in range(2)]
        by_pid = {proc.pid: proc for proc in agents}
        finished, failing = by_pid[self.agent_pid(0)], by_pid[self.agent_pid(1)]
        self.touch("release0")
        self.assertEqual(self.finish([finished])[0][0], 0)
        self.touch("go")
        started = time.monotonic()
        code, _, err = self.finish([failing], timeout=30)[0]
        self.assertEqual(code, 7, err + self.read_log())
        self.assertLess(time.monotonic() - started, 15)
        self.assertRegex(err, r"job job1 cannot restart: node\(s\) n\d finished with every worker's success")
        with open(os.path.join(self.tmp, "attempts.1")) as f:
            self.assertEqual(f.read(), "0\n", "a worker was restarted")

    def test_a_success_reported_after_the_restart_round_opened_ends_that_round(self):
        # The finished node's agent is stopped while its worker exits 0 and the other node fails
        # and re-joins; resumed, it reports its success (or restarts, had it read the failure
        # first). Either way the failing node ends with its worker's code, never a round timeout.
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(timeout=10)
        self.start_daemon("127.0.0.1:0", lease="10")  # The stopped agent must outlive its pause.
        agents = [self.agent(f"n{i}", "--max-restarts", "1", nnodes="2", nproc="1",
                             extra_env=self.FINISH_OR_FAIL) for i in range(2)]
        by_pid = {proc.pid: proc for proc in agents}
        finished, failing = by_pid[self.agent_pid(0)], by_pid[self.agent_pid(1)]
        os.kill(finished.pid, signal.SIGSTOP)
        self.touch("release0")
        self.touch("go")
        self.assertTrue(wait_for(lambda: self.read_log().count("joined, 1 node(s) so far") >= 2, 20),
                        "the failing node never re-joined:\n" + self.read_log())
        os.kill(finished.pid, signal.SIGCONT)
        code, _, err = self.finish([failing], timeout=30)[0]
        self.assertEqual(code, 7, err + self.read_log())
        self.assertIn(self.finish([finished])[0][0], (0, 7))

    def test_without_a_daemon_a_failure_after_the_host_finished_ends_the_job_without_a_restart(self):
        # The finished node hosts the rendezvous and leaves with the round's end: the failing
        # node learns from that end that the job is closed, not from a restart join nobody hears.
        port = reserve_port(self)
        self.endpoint = f"127.0.0.1:{port}"
        host = self.agent("n0", "--max-restarts", "1", nnodes="2", nproc="1", extra_env=self.FINISH_OR_FAIL)
        self.assertTrue(wait_for(lambda: host.poll() is not None or port_open(port), 10))
        failing = self.agent("n1", "--max-restarts", "1", "--rdzv-conf", "is_host=false", nnodes="2",
                             nproc="1", extra_env=self.FINISH_OR_FAIL)
        self.assertEqual((self.agent_pid(0), self.agent_pid(1)), (host.pid, failing.pid))
        self.touch("release0")
        self.assertTrue(wait_for(lambda: not alive(int(open(os.path.join(self.tmp, "pid.0")).read())), 30))
        self.touch("go")
        results = self.finish([failing, host], timeout=30)
        self.assertEqual([code for code, _, _ in results], [7, 0], results[0][2])
        self.assertRegex(results[0][2], r"cannot restart: node\(s\) n0 finished with every worker's success")
        with open(os.path.join(self.tmp, "attempts.1")) as f:
            self.assertEqual(f.read(), "0\n", "a worker was restarted")

    def test_local_agents_over_the_unix_socket(self):
        path = os.path.join(self.tmp, "rendezvousd.sock")
        log = open(os.path.join(self.tmp, "unix.log"), "w")
        daemon = subprocess.Popen([RENDEZVOUSD, "--listen", "127.0.0.1:0", "--unix-socket", path],
                                  stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.procs.append(daemon)
        self.assertTrue(wait_for(lambda: os.path.exists(path), 10), "no unix socket")
        self.endpoint = "unix:" + path
        agents = [self.agent(f"n{i}", nnodes="2", nproc="1") for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        ranks = self.ranks()
        self.assertEqual(sorted(ranks), [0, 1])
        self.assertEqual(ranks[0][3], "127.0.0.1")
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        self.assertFalse(os.path.exists(path), "the daemon should remove its socket on exit")

    def test_elastic_job_admits_a_late_node_at_a_restart_boundary(self):
        # Alone, the first node runs with WORLD_SIZE=1 and waits; a second node joining re-forms
        # the job into a round of two, which spends no restart.
        behaviour = ('echo "$WORLD_SIZE $TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/attempts.$GROUP_RANK"; '
                     '[ "$WORLD_SIZE" = 2 ] || exec sleep 60')
        extra = {"BEHAVIOUR_0": behaviour, "BEHAVIOUR_1": behaviour}
        first = self.agent("n0", "--rdzv-conf", "last_call_timeout=0.5", nnodes="1:2", nproc="1",
                           extra_env=extra)
        self.assertTrue(wait_for(lambda: self.files("attempts."), 20), "the first round did not run")
        second = self.agent("n1", "--rdzv-conf", "last_call_timeout=0.5", nnodes="1:2", nproc="1",
                            extra_env=extra)
        results = self.finish([first, second])
        for code, _, err in results:
            self.assertEqual(code, 0, err + self.read_log())
        self.assertIn("n1 joins the job; re-forming the round", results[0][2])
        lines = []
        for name in self.files("attempts."):
            with open(os.path.join(self.tmp, name)) as f:
                lines += f.read().split("\n")[:-1]
        self.assertEqual(sorted(lines), ["1 0", "2 0", "2 0"])


class JoinProgress(RendezvousTestCase):
    def test_a_terminal_sees_who_joined_and_a_pipe_gets_plain_lines(self):
        controller, terminal = pty.openpty()
        command = [MCPRUN, "--nnodes", "2", "-n", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                   self.endpoint, "--rdzv-id", "tty", "--node-name", "a", "--no-python", "/bin/true"]
        on_tty = subprocess.Popen(command, env=self.env, stdin=terminal, stdout=terminal, stderr=terminal,
                                  start_new_session=True)
        self.procs.append(on_tty)
        os.close(terminal)
        seen = b""
        deadline = time.monotonic() + 20
        while b"1/2 nodes joined: a; waiting" not in seen and time.monotonic() < deadline:
            if select.select([controller], [], [], 0.5)[0]:
                seen += os.read(controller, 4096)
        self.assertIn(b"1/2 nodes joined: a; waiting", seen)
        code, _, err = self.run_mcprun(*command[1:12], "b", *command[13:], timeout=30)
        self.assertEqual(code, 0, err)
        self.assertNotIn("nodes joined", err)
        self.assertNotIn("\x1b[", err)
        self.assertEqual(on_tty.wait(timeout=30), 0)
        os.close(controller)


def frame(message):
    payload = json.dumps(dict(message, v=1)).encode()
    return struct.pack(">I", len(payload)) + payload


class RawAgent:
    """An agent speaking the wire protocol by hand, so that a test decides when it is silent."""

    def __init__(self, endpoint, job, node, nodes, assignment=None, progress=None):
        """Joins; with `assignment` (the node's group rank), re-registers a running node instead."""
        host, port = endpoint.split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        join = {"type": "join", "job": job, "node": node, "addr": "127.0.0.1", "nproc": 1,
                "master_port": 0, "node_rank": -1, "labels": {}, "min_nodes": nodes,
                "max_nodes": nodes, "join_timeout_s": 30, "last_call_timeout_s": 1}
        if progress is not None:
            join["progress"] = progress
        if assignment is not None:
            join.update(type="rejoin", assignment={
                "group_rank": assignment, "group_world_size": nodes, "world_size": nodes,
                "rank_offset": assignment, "master_addr": "127.0.0.1", "master_port": 29500})
        self.send(join)

    def send(self, message):
        self.sock.sendall(frame(message))

    def read(self, timeout=30):
        """The next message; None when the daemon closed the connection."""
        self.sock.settimeout(timeout)
        header = self.sock.recv(4, socket.MSG_WAITALL)
        if len(header) < 4:
            return None
        (length,) = struct.unpack(">I", header)
        return json.loads(self.sock.recv(length, socket.MSG_WAITALL))

    def close(self):
        self.sock.close()


class HeartbeatPace(RendezvousTestCase):
    """Agents heartbeat more slowly as the daemon holds more of them (max_heartbeats_per_second)."""

    def setUp(self):
        LauncherTestCase.setUp(self)
        self.daemon_log = os.path.join(self.tmp, "rendezvousd.log")
        self.raw = []
        self.addCleanup(lambda: [agent.close() for agent in self.raw])

    def start_paced_daemon(self, heartbeats_per_second, lease, listen="127.0.0.1:0"):
        config = os.path.join(self.tmp, "rendezvousd.yaml")
        with open(config, "w") as f:
            f.write(f"max_heartbeats_per_second: {heartbeats_per_second}\nfirst_message_timeout_s: 60\n")
        self.start_daemon(listen, "--config", config, "--metrics-listen", "127.0.0.1:0", lease=lease)

    def metric(self, name):
        """The value of `name` on the daemon's /metrics (the last daemon started)."""
        address = re.findall(r"metrics on http://([\d.]+):(\d+)/metrics", self.read_log())[-1]
        with socket.create_connection((address[0], int(address[1])), timeout=10) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
            body = b"".join(iter(lambda: conn.recv(65536), b"")).decode()
        return int(re.search(rf"^{name} (\d+)", body, re.M).group(1))

    def test_the_pace_follows_the_agents_held_and_an_agent_is_lost_after_three_missed_heartbeats(self):
        # 1 heartbeat a second in all: one agent every 1 s, two every 2 s; the lease alone (1 s)
        # would have them heartbeat every 333 ms and lose them after 1 s of silence.
        self.start_paced_daemon(1, lease="1")
        a = RawAgent(self.endpoint, "paced", "a", 2)
        self.raw.append(a)
        self.assertEqual(a.read(), {"v": 1, "type": "joined", "heartbeat_interval_ms": 1000})
        b = RawAgent(self.endpoint, "paced", "b", 2)
        self.raw.append(b)
        self.assertEqual(b.read()["heartbeat_interval_ms"], 2000)
        for agent in (a, b):
            assignment = agent.read()
            self.assertEqual(assignment["type"], "assignment", assignment)
            self.assertEqual(assignment["heartbeat_interval_ms"], 2000, "the first joiner is paced again")
        b_paced_at = time.monotonic()
        # a heartbeats every 1.5 s, slower than the lease but within its pace; b falls silent.
        lost = None
        while lost is None and time.monotonic() - b_paced_at < 20:
            a.send({"type": "heartbeat"})
            try:
                message = a.read(timeout=1.5)
            except socket.timeout:
                continue
            self.assertIsNotNone(message, "a, heartbeating at its pace, was cut: " + self.read_log())
            lost = message
        lost_after = time.monotonic() - b_paced_at
        self.assertEqual(lost, {"v": 1, "type": "lost", "node": "b"}, self.read_log())
        self.assertGreaterEqual(lost_after, 5.5, "b was lost before three heartbeats were missed")
        self.assertLess(lost_after, 10)

    def test_a_rebuilt_jobs_first_node_back_is_paced_again_once_all_are(self):
        # After a daemon restart, a running job's nodes re-register one by one: the first is
        # told the pace of the few agents held then, and the slower one once every node is back.
        self.start_paced_daemon(4, lease="1.5")
        first = RawAgent(self.endpoint, "rebuilt", "a", 2, assignment=0)
        self.raw.append(first)
        self.assertEqual(first.read()["heartbeat_interval_ms"], 500)
        host, port = self.endpoint.split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(30)]
        self.addCleanup(lambda: [sock.close() for sock in idle])
        self.assertTrue(wait_for(lambda: self.metric("mcprun_connections") == 31, 10))
        second = RawAgent(self.endpoint, "rebuilt", "b", 2, assignment=1)
        self.raw.append(second)
        self.assertEqual(second.read()["heartbeat_interval_ms"], 8000)
        self.assertEqual(first.read(), {"v": 1, "type": "pace", "heartbeat_interval_ms": 8000},
                         self.read_log())

    def test_agents_keep_the_faster_pace_of_a_restarted_daemon(self):
        # Paced at 8 s by a daemon holding 32 connections, the agents re-register with a new one
        # holding only them, whose pace is the lease's third (1 s; lost after 3 s): heartbeats
        # at the old pace would lose both nodes and stop the job.
        self.start_paced_daemon(4, lease="3")
        behaviour = ('touch "$MCPRUN_TEST_DIR/started.$RANK"; '
                     'while [ ! -e "$MCPRUN_TEST_DIR/go" ]; do sleep 0.05; done')
        agents = [self.agent("a", nnodes="2", nproc="1", extra_env={"BEHAVIOUR_0": behaviour, "BEHAVIOUR_1": behaviour})]
        self.assertTrue(wait_for(lambda: "a (127.0.0.1, 1 worker(s)" in self.read_log(), 30), self.read_log())
        host, port = self.endpoint.split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(30)]
        agents.append(self.agent("b", nnodes="2", nproc="1", extra_env={"BEHAVIOUR_0": behaviour, "BEHAVIOUR_1": behaviour}))
        self.assertTrue(wait_for(lambda: len(self.files("started.")) == 2, 30), self.read_log())
        for sock in idle:
            sock.close()
        self.daemon.kill()
        self.daemon.wait()
        self.start_paced_daemon(4, lease="3", listen=self.endpoint)
        self.assertTrue(wait_for(lambda: "(2 of 2 node(s))" in self.read_log(), 30), self.read_log())
        rebuilt = time.monotonic()
        # The job runs on for twice the new lease past the rebuild before it may end.
        self.assertFalse(wait_for(lambda: "lost" in self.read_log().split("(2 of 2 node(s))")[-1], 6),
                         self.read_log())
        self.assertGreaterEqual(time.monotonic() - rebuilt, 6)
        open(os.path.join(self.tmp, "go"), "w").close()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)

    def test_mcprun_agents_take_the_pace_of_their_assignment(self):
        # At 2 heartbeats a second in all, the first agent joins alone (told 0.5 s, the lease's
        # third); 30 connections more and the second agent make 32, every 16 s, which the
        # assignment tells both agents.
        self.start_paced_daemon(2, lease="1.5")
        first = self.agent("a", nnodes="2", nproc="1", extra_env={"BEHAVIOUR_0": "sleep 6", "BEHAVIOUR_1": "sleep 6"})
        self.assertTrue(wait_for(lambda: "a (127.0.0.1, 1 worker(s)" in self.read_log(), 30), self.read_log())
        host, port = self.endpoint.split(":")
        idle = [socket.create_connection((host, int(port))) for _ in range(30)]
        self.addCleanup(lambda: [sock.close() for sock in idle])
        second = self.agent("b", nnodes="2", nproc="1", extra_env={"BEHAVIOUR_0": "sleep 6", "BEHAVIOUR_1": "sleep 6"})
        self.assertTrue(wait_for(lambda: "round complete" in self.read_log(), 30), self.read_log())
        assigned = self.metric("mcprun_heartbeats_total")
        for code, _, err in self.finish([first, second]):
            self.assertEqual(code, 0, err)
        # Over the 6 s the workers run (16 s on a loaded box): a's heartbeat due at the old pace,
        # nothing more (at 0.5 s, a dozen).
        self.assertLessEqual(self.metric("mcprun_heartbeats_total") - assigned, 2, self.read_log())


class BatchAgents(RendezvousTestCase):
    def setUp(self):
        LauncherTestCase.setUp(self)
        self.daemon_log = os.path.join(self.tmp, "rendezvousd.log")
        self.start_daemon("127.0.0.1:0", lease="30")  # The raw agents send no heartbeat.

    def test_an_agent_that_shows_no_progress_is_sent_none(self):
        # A forming round's progress goes once a second to the agents on a terminal only: a round
        # of 16,384 agents in batch jobs would otherwise be sent 16,384 frames a second.
        on_terminal = RawAgent(self.endpoint, "forming", "a", 3)
        in_batch = RawAgent(self.endpoint, "forming", "b", 3, progress=False)
        self.addCleanup(on_terminal.close)
        self.addCleanup(in_batch.close)
        self.assertEqual(on_terminal.read()["type"], "joined")
        self.assertEqual(in_batch.read()["type"], "joined")
        self.assertEqual(on_terminal.read(timeout=10)["type"], "progress")
        # The note went out in the same turn of the daemon's loop; the batch agent got none.
        with self.assertRaises(socket.timeout):
            in_batch.read(timeout=0.5)


class DaemonRestart(RendezvousTestCase):
    def test_sigkill_and_restart_of_the_daemon_costs_the_job_nothing(self):
        behaviour = ('echo "$TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/starts.$RANK"; '
                     'while [ ! -e "$MCPRUN_TEST_DIR/go" ]; do sleep 0.05; done')
        agents = [self.agent(f"node{i}", nnodes="2", extra_env={f"BEHAVIOUR_{r}": behaviour for r in range(4)})
                  for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("starts.")) == 4, 30), self.read_log())
        self.daemon.kill()
        self.daemon.wait()
        self.start_daemon(self.endpoint)
        self.assertTrue(wait_for(lambda: "rebuilding a running job" in self.read_log() and
                                 "(2 of 2 node(s))" in self.read_log(), 30), self.read_log())
        open(os.path.join(self.tmp, "go"), "w").close()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
            self.assertIn("re-registering node rank", err)
        for name in self.files("starts."):
            with open(os.path.join(self.tmp, name)) as f:
                self.assertEqual(f.read(), "0\n", "a worker was restarted")


@unittest.skipUnless(os.geteuid() == 0, "creates users: needs root")
class SharedBox(RendezvousTestCase):
    """Two real users on one box, one rendezvousd: each sees and controls only their own jobs."""
    USERS = ("mcprun-alice", "mcprun-bob")

    @classmethod
    def setUpClass(cls):
        for user in cls.USERS:
            if subprocess.run(["id", user], capture_output=True).returncode != 0:
                subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", user],
                               check=True)

    @classmethod
    def tearDownClass(cls):
        for user in cls.USERS:
            subprocess.run(["userdel", user], check=False)

    def setUp(self):
        super().setUp()
        self.daemon.kill()
        self.daemon.wait()
        # A socket directory every user can reach: the daemon decides who may do what.
        self.socket_dir = tempfile.mkdtemp(prefix="mcprun-sock-")
        os.chmod(self.socket_dir, 0o755)
        self.socket = os.path.join(self.socket_dir, "rendezvousd.sock")
        self.start_daemon("127.0.0.1:0", "--unix-socket", self.socket)

    def tearDown(self):
        super().tearDown()
        subprocess.run(["rm", "-rf", self.socket_dir], check=False)

    def operator(self, *args, user=None):
        return self.run_mcprun(*args, "--rdzv-endpoint", "unix:" + self.socket, user=user, timeout=30)

    def test_each_user_sees_and_stops_only_their_own_jobs(self):
        env = dict(self.env, TMPDIR="/tmp")
        alice = self.start("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "unix:" + self.socket,
                           "--rdzv-id", "alicejob", "--no-python", "/bin/sleep", "60", env=env,
                           user="mcprun-alice")
        self.assertTrue(wait_for(lambda: "alicejob" in self.read_log(), 10), self.read_log())

        code, out, err = self.operator("jobs", user="mcprun-alice")
        self.assertEqual(code, 0, err)
        self.assertRegex(out, r"alicejob\s+mcprun-alice \(uid \d+\)\s+1\s+0\s+joining")
        code, out, err = self.operator("jobs", user="mcprun-bob")
        self.assertEqual(code, 0, err)
        self.assertNotIn("alicejob", out)
        for command in ("status", "stop"):
            code, _, err = self.operator(command, "alicejob", user="mcprun-bob")
            self.assertEqual(code, 1, err)
            self.assertIn("belongs to mcprun-alice", err)
        code, _, err = self.run_mcprun("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                       "unix:" + self.socket, "--rdzv-id", "alicejob", "--no-python",
                                       "/bin/true", env=env, user="mcprun-bob", timeout=30)
        self.assertEqual(code, 75, err)
        self.assertIn("job alicejob belongs to mcprun-alice", err)

        code, out, err = self.operator("status", "alicejob", "--json", user="mcprun-alice")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["state"], "joining")
        code, out, err = self.operator("jobs")  # root sees everyone's
        self.assertIn("alicejob", out)
        code, out, err = self.operator("stop", "alicejob")
        self.assertEqual(code, 0, err)
        _, alice_err = alice.communicate(timeout=10)
        self.assertEqual(alice.returncode, 75, alice_err)
        self.assertIn("stopped by root (uid 0) with mcprun stop", alice_err)


class GpuLeases(RendezvousTestCase):
    """One rendezvousd leases a fake 8-GPU box to concurrent local jobs."""
    # Records what the job got, then waits for its go file.
    WORKER = (r'echo "$CUDA_VISIBLE_DEVICES $LOCAL_RANK $MASTER_PORT" > "$MCPRUN_TEST_DIR/lease.$JOB.$RANK"; '
              r'echo $$ > "$MCPRUN_TEST_DIR/pid.$JOB.$RANK"; '
              r'while [ ! -e "$MCPRUN_TEST_DIR/go.$JOB" ]; do sleep 0.05; done')

    def setUp(self):
        super().setUp()
        self.daemon.kill()
        self.daemon.wait()
        self.sysfs = make_tree(os.path.join(self.tmp, "sysfs"), [
            {"bus_id": f"0000:{0x10 * (i + 1):02x}:00.0", "numa_node": i // 4} for i in range(8)])
        self.socket = os.path.join(self.tmp, "rendezvousd.sock")
        self.env = dict(self.env, MCPRUN_SYSFS_ROOT=self.sysfs, MCPRUN_DAEMON="unix:" + self.socket)
        self.start_daemon("127.0.0.1:0", "--unix-socket", self.socket, env=self.env)

    def job(self, name, nproc, *flags):
        return self.start("-n", str(nproc), "--rdzv-id", name, *flags, "--no-python", "/bin/sh", "-c",
                          self.WORKER, env=dict(self.env, JOB=name))

    def leased(self, name, nproc):
        """Job `name`'s GPU indices and master port, once every rank recorded them."""
        files = [os.path.join(self.tmp, f"lease.{name}.{rank}") for rank in range(nproc)]
        self.assertTrue(wait_for(lambda: all(os.path.exists(f) and os.path.getsize(f) for f in files), 20),
                        self.read_log())
        gpus, ports, visible_lists = set(), set(), set()
        for path in files:
            with open(path) as f:
                visible, local_rank, port = f.read().split()
            gpus.add(visible.split(",")[int(local_rank)])  # What set_device(LOCAL_RANK) selects.
            visible_lists.add(visible)
            ports.add(port)
        self.assertEqual(len(ports), 1)
        self.assertEqual(len(visible_lists), 1, "every rank of a job sees the same GPUs")
        self.assertEqual(set(visible_lists.pop().split(",")), gpus)
        return gpus, ports.pop()

    def go(self, name):
        open(os.path.join(self.tmp, "go." + name), "w").close()

    def test_concurrent_jobs_get_disjoint_gpus_and_ports_and_leases_end_with_their_job(self):
        a, b = self.job("a", 4), self.job("b", 4)
        gpus_a, port_a = self.leased("a", 4)
        gpus_b, port_b = self.leased("b", 4)
        self.assertEqual(len(gpus_a), 4)
        self.assertFalse(gpus_a & gpus_b)
        self.assertNotEqual(port_a, port_b)

        code, _, err = self.run_mcprun("-n", "4", "--rdzv-id", "c", "--no-python", "/bin/true", timeout=30)
        self.assertEqual(code, 75, err)
        self.assertIn("4 GPU(s) wanted, 0 of 8 free; held by", err)
        for name, port in (("a", port_a), ("b", port_b)):
            self.assertIn(f"root (uid 0), job {name} (", err)
            self.assertIn(f"port {port})", err)

        waiting = self.job("d", 2, "--gpu-wait", "30")
        self.go("a")
        self.assertEqual(a.wait(timeout=30), 0)
        gpus_d, _ = self.leased("d", 2)
        self.assertTrue(gpus_d <= gpus_a, (gpus_d, gpus_a))
        self.go("d")
        self.assertEqual(waiting.wait(timeout=30), 0)

        self.daemon.kill()  # A restarted daemon learns the running job's lease back from it.
        self.daemon.wait()
        self.start_daemon(self.endpoint, "--unix-socket", self.socket, env=self.env)
        self.assertTrue(wait_for(lambda: "restored the lease of 4 GPU(s)" in self.read_log(), 20),
                        self.read_log())
        code, _, err = self.run_mcprun("-n", "8", "--rdzv-id", "f", "--no-python", "/bin/true", timeout=30)
        self.assertEqual(code, 75, err)
        self.assertIn("8 GPU(s) wanted, 4 of 8 free; held by root (uid 0), job b (", err)

        os.killpg(b.pid, signal.SIGKILL)  # Its agent dies: the lease must not leak.
        b.wait()
        late = self.job("e", 4)
        gpus_e, _ = self.leased("e", 4)
        self.assertEqual(len(gpus_e), 4)
        self.go("e")
        self.assertEqual(late.wait(timeout=30), 0)

    def test_leasing_costs_the_daemon_no_thread_and_no_descriptor(self):
        def threads_and_descriptors():
            return (len(os.listdir(f"/proc/{self.daemon.pid}/task")),
                    len(os.listdir(f"/proc/{self.daemon.pid}/fd")))
        before = threads_and_descriptors()
        self.assertEqual(before[0], 1, "rendezvousd is one thread")
        for name in ("a", "b"):
            code, _, err = self.run_mcprun("-n", "2", "--rdzv-id", name, "--no-python", "/bin/true", timeout=30)
            self.assertEqual(code, 0, err)
            self.assertIn("leased from rendezvousd: 2 GPU(s)", err)
        # Each job's connection closes as it ends; nothing else the leases touched stays open.
        self.assertTrue(wait_for(lambda: threads_and_descriptors() == before, 5),
                        (before, threads_and_descriptors()))

    def test_a_waiting_job_is_not_overtaken_and_an_impossible_one_is_refused_at_once(self):
        holder = self.job("a", 6)
        self.leased("a", 6)
        big = self.job("big", 4, "--gpu-wait", "60")
        self.assertTrue(wait_for(lambda: "job big waits up to 60 s" in self.read_log(), 20), self.read_log())

        # Two GPUs are free, but taking them would make the older 4-GPU request wait longer.
        code, _, err = self.run_mcprun("-n", "2", "--rdzv-id", "small", "--no-python", "/bin/true", timeout=30)
        self.assertEqual(code, 75, err)
        self.assertIn("2 GPU(s) wanted, 2 of 8 free; held by root (uid 0), job a (", err)
        self.assertIn("waiting first: root (uid 0), job big (4 GPU(s))", err)
        # A request for more GPUs than the box has would block the queue for nothing.
        code, _, err = self.run_mcprun("-n", "9", "--rdzv-id", "huge", "--gpu-wait", "60", "--no-python",
                                       "/bin/true", timeout=30)
        self.assertEqual(code, 75, err)
        self.assertIn("9 GPU(s) wanted, but this box has 8", err)

        self.go("a")
        self.assertEqual(holder.wait(timeout=30), 0)
        gpus, _ = self.leased("big", 4)
        self.assertEqual(len(gpus), 4)
        self.go("big")
        _, err = big.communicate(timeout=30)
        self.assertEqual(big.returncode, 0, err)
        self.assertIn("waiting up to 60 s for a GPU lease: 4 GPU(s) wanted, 2 of 8 free", err)


class StaticBackend(LauncherTestCase):
    def test_two_nodes_with_node_rank_and_master_need_no_rendezvous(self):
        port = reserve_port(self)
        agents = [self.start("--nnodes", "2", "--node-rank", str(i), "-n", "2", "--master-addr",
                             "127.0.0.1", "--master-port", str(port),
                             os.path.join(REPO, "examples/ddp_train.py")) for i in range(2)]
        out = ""
        for proc in agents:
            o, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
            out += o
        for rank in range(4):
            self.assertIn(f"[rank{rank}]:rank {rank}/4 local_rank {rank % 2}: done, replicas in sync", out)
