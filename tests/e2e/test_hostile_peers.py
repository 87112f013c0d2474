"""Nothing a peer sends can crash rendezvousd or mcprun, and no peer can make them wait forever.

For every message type, every field and every wrong JSON type (and the field missing, a huge
string, deep nesting), the framed message goes to rendezvousd over TCP and over its unix socket,
before and after a join. The daemon keeps its pid and keeps answering, and a normal 2-node job
succeeds afterwards. The same against mcprun's agent socket from a worker: the job exits 0. The
daemon's configured caps cut the peer past them and no other. mcprun's connects to a listener that
never accepts, and its requests to a daemon that never answers, end at their named deadlines."""
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

import test_rendezvous
from harness import PYTHON, LauncherTestCase, wait_for

TOKEN = "hostile-peers-token"

# One valid example of each message a peer may send the daemon; fieldless ones get an extra
# field, so that the extra field's wrong types are tried too.
DAEMON_MESSAGES = {
    "join": {"job": "x", "node": "n", "addr": "127.0.0.1", "nproc": 1, "master_port": 0,
             "node_rank": -1, "labels": {"rack": "r1"}, "gpus": [], "min_nodes": 1, "max_nodes": 1,
             "join_timeout_s": 5.0, "last_call_timeout_s": 1.0, "token": TOKEN},
    "rejoin": {"job": "x", "node": "n", "nproc": 1, "min_nodes": 1, "max_nodes": 1, "token": TOKEN,
               "assignment": {"group_rank": 0, "group_world_size": 1, "world_size": 1,
                              "rank_offset": 0, "master_addr": "127.0.0.1", "master_port": 1}},
    "lease": {"gpus": 0, "wait_s": 0.0, "job": "x", "held_gpus": [], "held_port": 0},
    "jobs": {"token": TOKEN},
    "status": {"job": "x", "token": TOKEN},
    "stop": {"job": "x", "token": TOKEN},
    "heartbeat": {"extra": 1},
    "done": {"extra": 1},
    "clock": {"extra": 1},
    "failed": {"reason": "r", "exit_code": 1},
    "stall": {"kind": "barrier", "what": "w", "barrier": "b", "rank": 0, "noticed_on": "h",
              "arrived": {"127.0.0.1": [1]}},
    "stall_report": {"ranks": []},
    "barrier": {"name": "b", "rank": 0},
}

MISSING = object()


def deep(levels):
    value = 1
    for _ in range(levels):
        value = [value]
    return value


# The wrong values: every JSON type, the field missing, a huge string, deep nesting (past the
# frame's limit and within it).
WRONG_VALUES = ["text", 5, -7, 2.5, 1e300, True, None, [1, "a"], {"k": 1}, MISSING,
                "x" * 60000, deep(20), deep(200), 1 << 63]


def frame(message):
    payload = json.dumps(dict({"v": 1}, **message)).encode()
    return struct.pack(">I", len(payload)) + payload


def variants(messages):
    """(description, message) for every type, field and wrong value, the field's own too."""
    for kind, fields in messages.items():
        for field in ["v", *fields]:
            for wrong in WRONG_VALUES:
                message = dict(fields, type=kind)
                if field != "v":
                    if wrong is MISSING:
                        del message[field]
                    else:
                        message[field] = wrong
                    yield f"{kind}.{field}={str(wrong)[:20]}", frame(message)
                elif wrong is not MISSING:
                    payload = json.dumps(dict(message, v=wrong)).encode()
                    yield f"{kind}.v={str(wrong)[:20]}", struct.pack(">I", len(payload)) + payload


class Peer:
    """One connection that reads frames."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(10)
        self.buffer = b""

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # The daemon closed us mid-send: the frame was refused.

    def receive(self):
        """The next message, or None once the daemon closed the connection."""
        while True:
            if len(self.buffer) >= 4:
                (length,) = struct.unpack(">I", self.buffer[:4])
                if len(self.buffer) >= 4 + length:
                    payload, self.buffer = self.buffer[4:4 + length], self.buffer[4 + length:]
                    return json.loads(payload)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            self.buffer += chunk

    def close(self):
        self.sock.close()


class PeerTestCase(test_rendezvous.RendezvousTestCase):
    """A rendezvousd on TCP and a unix socket, with a token, and raw peers to talk to it."""

    def daemon_flags(self):
        return []

    def setUp(self):
        super().setUp()
        self.daemon.kill()
        self.daemon.wait()
        self.socket_dir = tempfile.mkdtemp(prefix="mcprun-sock-")
        self.socket = os.path.join(self.socket_dir, "rendezvousd.sock")
        self.token_file = self.script("token", TOKEN + "\n")
        self.start_daemon("127.0.0.1:0", "--unix-socket", self.socket, "--token-file", self.token_file,
                          *self.daemon_flags())
        self.env["MCPRUN_RDZV_TOKEN_FILE"] = self.token_file
        self.jobs = 0

    def tearDown(self):
        super().tearDown()
        subprocess.run(["rm", "-rf", self.socket_dir], check=False)

    def connect(self, transport):
        if transport == "tcp":
            host, port = self.endpoint.split(":")
            return Peer(socket.create_connection((host, int(port))))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.socket)
        return Peer(sock)

    def joined_peer(self, transport):
        """A connection whose node joined a 1-node job, which is now running."""
        self.jobs += 1
        peer = self.connect(transport)
        peer.send(frame(dict(DAEMON_MESSAGES["join"], type="join", job=f"pre-{self.jobs}")))
        while True:
            reply = peer.receive()
            self.assertIsNotNone(reply, "the daemon refused a valid join: " + self.read_log()[-2000:])
            if reply["type"] == "assignment":
                return peer

    def assert_daemon_answers(self, what):
        self.assertIsNone(self.daemon.poll(), f"rendezvousd died after {what}: " + self.read_log()[-3000:])
        peer = self.connect("tcp")
        peer.send(frame({"type": "clock"}))
        reply = peer.receive()
        peer.close()
        self.assertEqual((reply or {}).get("type"), "clock", f"rendezvousd stopped answering after {what}")


class HostilePeers(PeerTestCase):
    def test_every_wrong_field_costs_only_its_connection(self):
        pid = self.daemon.pid
        tried = 0
        for transport in ("tcp", "unix"):
            for joined in (False, True):
                for description, data in variants(DAEMON_MESSAGES):
                    what = f"{description} over {transport}{' after a join' if joined else ''}"
                    peer = self.joined_peer(transport) if joined else self.connect(transport)
                    # A clock right behind it: answered if the message was accepted, else the
                    # connection closes. Either way the daemon handled both without dying.
                    peer.send(data + frame({"type": "clock"}))
                    while True:
                        reply = peer.receive()
                        if reply is None or reply["type"] == "clock":
                            break
                    peer.close()
                    tried += 1
                    if tried % 200 == 0:
                        self.assert_daemon_answers(what)
                self.assert_daemon_answers(f"the {transport} cases")
        self.assertEqual(self.daemon.pid, pid)
        self.assertIsNone(self.daemon.poll())
        log = self.read_log()
        self.assertNotIn("handler failed", log)
        self.assertIn('field "token" must be a string', log)  # Named, with the peer.
        self.assertIn('malformed barrier: field "rank"', log)
        print(f"\n{tried} hostile messages; rendezvousd (pid {pid}) still serving")

        agents = [self.agent(f"after{i}", job="after", nnodes="2", nproc="1") for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)

    def test_a_flood_from_one_peer_costs_only_that_peer(self):
        flood = self.joined_peer("tcp")
        flood.send(frame({"type": "heartbeat"}) * 20000)  # Far past the message rate.
        while flood.receive() is not None:
            pass
        silent = self.joined_peer("unix")  # Asks for clocks and never reads the answers.
        silent.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for _ in range(2000):
            silent.send(frame({"type": "clock", "pad": "x" * 4000}))
        agents = [self.agent(f"n{i}", job="flooded", nnodes="2", nproc="1") for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        self.assertIn("messages a second; closing", self.read_log())
        self.assert_daemon_answers("a flood")
        silent.close()
        flood.close()


# A worker that sends the agent's socket every wrong field of every message, each on its own
# connection, then uses the real helper: a heartbeat and a barrier. One rank: a barrier request
# that happens to be valid ("name": "text") then completes at once instead of waiting for a rank
# that never sends it, and stalling the job.
HOSTILE_WORKER = r'''
import json, os, socket, struct, sys
import mcprun

MISSING = object()
def deep(n):
    v = 1
    for _ in range(n):
        v = [v]
    return v
WRONG = ["text", 5, -7, 2.5, 1e300, True, None, [1, "a"], {"k": 1}, MISSING, "x" * 60000,
         deep(20), deep(200), 1 << 63]
MESSAGES = {"hello": {"rank": 0, "pid": 1}, "heartbeat": {"extra": 1},
            "barrier": {"name": "hostile", "timeout_s": 0.5}}
sent = 0
for kind, fields in MESSAGES.items():
    for field in fields:
        for wrong in WRONG:
            message = dict(fields, type=kind, v=1)
            if wrong is MISSING:
                del message[field]
            else:
                message[field] = wrong
            payload = json.dumps(message).encode()
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(os.environ["MCPRUN_AGENT_SOCKET"])
            try:
                if kind != "hello":
                    hello = json.dumps({"type": "hello", "v": 1, "rank": int(os.environ["RANK"])}).encode()
                    sock.sendall(struct.pack(">I", len(hello)) + hello)
                sock.sendall(struct.pack(">I", len(payload)) + payload)
            except OSError:
                pass
            sock.close()
            sent += 1
mcprun.heartbeat()
mcprun.barrier("after-hostile", 30)
print(f"rank {os.environ['RANK']} sent {sent} hostile messages", flush=True)
'''


class HostileWorker(LauncherTestCase):
    def test_a_worker_cannot_crash_its_launcher(self):
        script = self.script("hostile_worker.py", HOSTILE_WORKER)
        env = dict(self.env, PYTHON_EXEC=PYTHON)
        code, out, err = self.run_mcprun("-n", "1", "--heartbeat-timeout", "0", script, env=env, timeout=120)
        self.assertEqual(code, 0, err)
        self.assertNotIn("fatal", err)
        self.assertIn("sent a malformed message", err)
        self.assertIn("rank 0 sent", out)


class ConfiguredCaps(PeerTestCase):
    """rendezvousd started with small caps in its YAML: the peer past a cap is cut, with the
    configured figure in the log line; a job running meanwhile is served as usual."""

    def daemon_flags(self):
        config = self.script("rendezvousd.yaml", "messages_per_second: 400\nmessage_burst: 500\n"
                                                 "max_queued_bytes: 65540\n")
        return ["--config", config]

    def test_a_peer_past_a_configured_cap_is_cut_and_no_other(self):
        wait = 'while [ ! -e "$MCPRUN_TEST_DIR/go" ]; do sleep 0.05; done'
        agents = [self.agent(f"n{i}", job="capped", nnodes="2", nproc="1",
                             extra_env={"BEHAVIOUR_0": wait, "BEHAVIOUR_1": wait}) for i in range(2)]
        self.assertTrue(wait_for(lambda: "job capped: round complete" in self.read_log(), 30), self.read_log())

        flood = self.joined_peer("tcp")
        flood.send(frame({"type": "heartbeat"}) * 2000)  # Past a burst of 500 at 400 a second.
        while flood.receive() is not None:
            pass
        self.assertIn("more than 400 messages a second; closing", self.read_log())

        # Asks for clocks and never reads: the answers fill the socket, then the 65540-byte queue.
        # Within the rate, and heartbeating within the lease, so only the queue cap can cut it.
        silent = self.joined_peer("unix")
        silent.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        for _ in range(60):
            silent.send(frame({"type": "heartbeat"}) + frame({"type": "clock"}) * 150)
            if wait_for(lambda: "the peer reads none of them; closing" in self.read_log(), 0.5):
                break
        self.assertIn(f"unix uid {os.geteuid()}: 65", self.read_log())  # Past 65540 - one answer.
        self.assertIn("bytes wait to be written and the peer reads none of them; closing", self.read_log())
        while silent.receive() is not None:  # What was written before the cut, then the end.
            pass

        open(os.path.join(self.tmp, "go"), "w").close()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        self.assertNotIn("job capped: node", self.read_log())  # No node of the job was lost.
        self.assert_daemon_answers("the caps")
        silent.close()
        flood.close()


class BadCapsConfig(LauncherTestCase):
    def test_a_bad_cap_is_one_line_and_exit_2(self):
        for text, expected in [("messages_per_second: 0\n", "'messages_per_second' must be messages a second > 0"),
                               ("message_burst: lots\n", "'message_burst' must be a message count >= 1"),
                               ("max_queued_bytes: 1024\n", "'max_queued_bytes' must be a byte count >= 65540")]:
            config = self.script("bad.yaml", text)
            proc = subprocess.run([test_rendezvous.RENDEZVOUSD, "--config", config, "--listen", "127.0.0.1:0"],
                                  capture_output=True, text=True, timeout=30)
            self.assertEqual(proc.returncode, 2, proc.stderr)
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            self.assertEqual(len(lines), 1, lines)
            self.assertIn(f"{config}:1: {expected}", lines[0])


# mcprun's connect deadline (kConnectTimeout) and the operator's answer deadline
# (kOperatorRequestTimeout), both 10 s; a loaded box may add a little to either.
CONNECT_TIMEOUT_S = 10
ANSWER_TIMEOUT_S = 10
SLACK_S = 5


class NeverAnswers(test_rendezvous.RendezvousTestCase):
    """Listeners that accept nothing (their backlog full) and a stopped daemon: every mcprun that
    reaches for them gives up at its deadline with one line and exit 75, none hangs."""

    def full_listener(self, family, address):
        """A listener with backlog 0, filled by one connection it never accepts: the kernel then
        drops further SYNs (TCP) or refuses with EAGAIN (unix), and no accept frees a slot."""
        listener = socket.socket(family, socket.SOCK_STREAM)
        self.addCleanup(listener.close)
        listener.bind(address)
        listener.listen(0)
        filler = socket.socket(family, socket.SOCK_STREAM)
        self.addCleanup(filler.close)
        filler.settimeout(5)
        filler.connect(listener.getsockname())
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.settimeout(0.5)
        try:
            probe.connect(listener.getsockname())
            self.fail("a backlog-0 listener with one queued connection still accepted another")
        except (socket.timeout, BlockingIOError):
            pass  # It never answers: what the test needs.
        finally:
            probe.close()
        return listener.getsockname()

    def test_operator_commands_and_agents_give_up_at_their_deadlines(self):
        host, port = self.full_listener(socket.AF_INET, ("127.0.0.1", 0))
        unix_path = os.path.join(self.tmp, "full.sock")
        self.full_listener(socket.AF_UNIX, unix_path)
        self.daemon.send_signal(signal.SIGSTOP)  # Its backlog takes the connect; nothing answers.
        try:
            self.give_up_at_deadlines(host, port, unix_path)
        finally:
            self.daemon.send_signal(signal.SIGCONT)

    def give_up_at_deadlines(self, host, port, unix_path):
        cases = {
            "jobs over TCP": (["jobs", "--rdzv-endpoint", f"{host}:{port}"], CONNECT_TIMEOUT_S,
                              f"mcprun: cannot reach rendezvousd at {host}:{port}: no answer within {CONNECT_TIMEOUT_S} s"),
            "status over unix": (["status", "j", "--rdzv-endpoint", "unix:" + unix_path], CONNECT_TIMEOUT_S,
                                 f"mcprun: cannot reach rendezvousd at unix:{unix_path}: no answer within "
                                 f"{CONNECT_TIMEOUT_S} s: its backlog is full and it accepts nothing"),
            "stop to a stopped daemon": (["stop", "j", "--rdzv-endpoint", self.endpoint], ANSWER_TIMEOUT_S,
                                         f"mcprun: rendezvousd at {self.endpoint} did not answer within "
                                         f"{ANSWER_TIMEOUT_S} s"),
        }
        started = time.monotonic()
        procs = {name: self.start(*argv) for name, (argv, _, _) in cases.items()}
        agent = self.start("--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{host}:{port}",
                           "--rdzv-id", "j", "--rdzv-conf", "is_host=false", "--no-python", "/bin/true")
        for name, (argv, deadline, line) in cases.items():
            out, err = procs[name].communicate(timeout=deadline + SLACK_S + 30)
            took = time.monotonic() - started
            self.assertEqual(procs[name].returncode, 75, f"{name}: {err}")
            self.assertEqual(err.splitlines(), [line], name)
            self.assertEqual(out, "", name)
            self.assertGreaterEqual(took, deadline, name)
            self.assertLess(took, deadline + SLACK_S, f"{name} took {took:.1f} s")
        _, err = agent.communicate(timeout=CONNECT_TIMEOUT_S + SLACK_S + 30)
        took = time.monotonic() - started
        self.assertEqual(agent.returncode, 75, err)
        self.assertIn(f"cannot reach rendezvous at {host}:{port}: no answer within {CONNECT_TIMEOUT_S} s", err)
        self.assertLess(took, CONNECT_TIMEOUT_S + SLACK_S, f"the agent took {took:.1f} s")
