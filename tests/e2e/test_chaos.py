"""The chaos test: rounds of jobs on one rendezvousd, faults at random moments, and after every
round the promises checked: every job ended with a documented exit code and a report naming the
cause, no process of the round is left, every lease is back, the daemon is alive (or was
restarted and rebuilt its jobs) and neither its descriptors nor its memory grow.

Each round runs, on network-namespace hosts (h0 holds the daemon; h1 and h2 are other hosts):
a 2-rank job leasing fake GPUs, with --log-dir on a small tmpfs (on h0's loopback); a 2-node job
leasing a GPU per node through the daemon's unix socket (h0); a 2-node job across h1 and h2 over
TCP; a 1-rank job with a fixed --master-port (h0). Some have --max-restarts and a rank that fails
as planned. Faults: SIGKILL, SIGSTOP and SIGCONT of workers, agents and the daemon; the daemon
killed and restarted (every tenth round); h1 or h2's link cut, restored mid-round or at the round's end; the tmpfs
filled; a hostile peer on the daemon's port and socket; the job store's port taken.

CHAOS_SEED replays a run (each round's plan is drawn from the seed and the round's number), and
CHAOS_FIRST_ROUND with it starts at a given round; CHAOS_ROUNDS sets its length (default 100);
CHAOS_STATS names a file for the run's figures (JSON).
"""
import collections
import ctypes
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from fake_sysfs import make_tree
from harness import MCPRUN, alive, wait_for
from test_hostile_peers import Peer, frame
from test_netns import NamespaceHosts, can_make_namespaces
from test_rendezvous import RENDEZVOUSD

ROUNDS = int(os.environ.get("CHAOS_ROUNDS") or 100)
FIRST_ROUND = int(os.environ.get("CHAOS_FIRST_ROUND") or 0)
SEED = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 32))
FAIL_CODE = 7  # What a worker that fails as planned exits with.
# The README's exit codes: 0, a worker's own (FAIL_CODE here), mcprun's own, 128+N for signal N.
DOCUMENTED = {0, FAIL_CODE, 1, 2, 3, 75, 76, 124} | {128 + n for n in range(1, 65)}
JOB_TIMEOUT_S = 20    # --timeout of every job: a round cannot outlast it by much.
ROUND_DEADLINE_S = 45  # A job still running this long after its round began is a hang.
SETTLE_S = 5          # How long the round's processes, leases and connections may take to go.
LEASE_S = 2           # The daemon's lease: a silent agent is lost after this.
RSS_GROWTH_BYTES = 2 << 20  # Over a daemon's life after its warm-up rounds.
WARMUP_ROUNDS = 3
DAEMON_LIFE = 10  # Rounds between daemon restarts.
GPUS = 8
RETRIES = 20  # A fault whose target has not started yet tries again every 0.1 s this often.
LEASE_PORTS = range(29500, 29504)  # The first master ports the daemon leases (its range starts there).

# Records its pid, prints a line, sleeps, prints again; then fails as planned, or sleeps again
# and exits 0 (so that a failure reaches the other ranks while they still run).
WORKER = r'''
echo $$ > "$CHAOS_DIR/pid.$CHAOS_JOB.$RANK.$TORCHELASTIC_RESTART_COUNT"
echo "$CHAOS_JOB rank $RANK attempt $TORCHELASTIC_RESTART_COUNT started $CHAOS_PAD"
sleep "$CHAOS_SLEEP"
echo "$CHAOS_JOB rank $RANK halfway $CHAOS_PAD"
if [ "$RANK" = "$CHAOS_FAIL_RANK" ] && [ "$TORCHELASTIC_RESTART_COUNT" -lt "$CHAOS_FAIL_ATTEMPTS" ]; then
  echo "$CHAOS_JOB rank $RANK fails as planned" >&2
  exit 7
fi
sleep "$CHAOS_SLEEP"
'''

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000


def socket_in(namespace, family=socket.AF_INET, kind=socket.SOCK_STREAM):
    """A socket made in network namespace `namespace`; setns moves only its caller's thread, so a
    thread of its own makes it, and the socket stays there whoever uses it."""
    made = {}

    def make():
        with open(f"/run/netns/{namespace}") as ns:
            if _libc.setns(ns.fileno(), CLONE_NEWNET) != 0:
                made["error"] = OSError(ctypes.get_errno(), "setns " + namespace)
                return
        made["socket"] = socket.socket(family, kind)

    thread = threading.Thread(target=make)
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]
    return made["socket"]


class RoundFailed(Exception):
    pass


class Job:
    """One job of a round: its plan, its agents and how they ended."""

    def __init__(self, name, kind, hosts, nproc, restarts, fail_rank, fail_attempts, sleep, start_at):
        self.name, self.kind, self.hosts, self.nproc = name, kind, hosts, nproc
        self.restarts, self.fail_rank, self.fail_attempts = restarts, fail_rank, fail_attempts
        self.sleep, self.start_at = sleep, start_at
        self.planned = FAIL_CODE if fail_attempts > restarts else 0
        self.agents = []       # Popen per node, once started
        self.extra = collections.defaultdict(set)  # node -> exit codes its faults explain
        self.killed = set()    # nodes whose agent was SIGKILLed
        self.uses_daemon = kind in ("lease", "local", "net")

    def accept_everywhere(self, *codes):
        for node in range(len(self.hosts)):
            self.extra[node].update(codes)

    def describe(self):
        when = "every attempt" if self.fail_attempts > 9 else "attempt 0"
        failing = f", rank {self.fail_rank} fails in {when}" if self.fail_attempts else ""
        return (f"{self.name} ({self.kind}, {len(self.hosts)} node(s) x {self.nproc}, "
                f"--max-restarts {self.restarts}{failing}, planned exit {self.planned})")


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class Chaos(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mcprun-chaos-")
        self.addCleanup(subprocess.run, ["rm", "-rf", self.tmp], check=False)
        self.tag = f"chaos-{os.getpid()}"
        self.net = NamespaceHosts(3)
        self.addCleanup(self.net.remove)
        self.full = os.path.join(self.tmp, "full")  # --log-dir: a small tmpfs the faults fill.
        os.makedirs(self.full)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", self.full], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", self.full], check=False)
        self.sysfs = make_tree(os.path.join(self.tmp, "sysfs"), [
            {"bus_id": f"0000:{0x10 * (i + 1):02x}:00.0", "numa_node": i // 4} for i in range(GPUS)])
        self.no_gpus = make_tree(os.path.join(self.tmp, "sysfs-none"), [])
        self.socket = os.path.join(self.tmp, "rendezvousd.sock")
        self.daemon_log = os.path.join(self.tmp, "rendezvousd.log")
        self.config = os.path.join(self.tmp, "rendezvousd.yaml")
        with open(self.config, "w") as f:
            f.write("finished_job_ttl_s: 2\n")  # Finished jobs leave memory within the round.
        # The fixed --master-port of the store job: held (bound, never listening) for the run,
        # as mcprun reserves its own, so only the squatter fault can take it.
        self.store_port_holder = socket_in(self.net.names[0])
        self.store_port_holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.store_port_holder.bind(("127.0.0.1", 0))
        self.addCleanup(self.store_port_holder.close)
        self.store_port = self.store_port_holder.getsockname()[1]
        self.daemon = None
        self.addCleanup(self.stop_daemon)
        self.listen = f"{self.net.address(0)}:0"
        self.metrics_listen = f"{self.net.address(0)}:0"
        self.start_daemon()
        self.stats = {"rounds": 0, "faults": collections.Counter(), "skipped": collections.Counter(),
                      "exits": collections.Counter(), "jobs": 0, "jobs_rebuilt": 0, "agents": 0, "daemon_restarts": 0,
                      "processes_left": 0, "leases_lost": 0, "round_s": [],
                      "longest_daemon": (0, 0)}  # (rounds it lived, KiB its RSS grew after warm-up)

    # --- the daemon

    def start_daemon(self):
        log = open(self.daemon_log, "a")
        started_at = log.tell()
        self.daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.net.names[0], RENDEZVOUSD, "--config", self.config,
             "--listen", self.listen, "--unix-socket", self.socket, "--metrics-listen", self.metrics_listen,
             "--lease", str(LEASE_S)],
            stdout=log, stderr=log, start_new_session=True,
            env=dict(os.environ, MCPRUN_SYSFS_ROOT=self.sysfs))
        log.close()

        def listening():
            text = self.read_log()[started_at:]
            tcp = re.search(r"listening on ([\d.]+:\d+)", text)
            metrics = re.search(r"metrics on http://([\d.]+:\d+)/metrics", text)
            return (tcp.group(1), metrics.group(1)) if tcp and metrics else None

        found = wait_for(listening, 10)
        if not found:
            raise RoundFailed("rendezvousd did not start: " + self.read_log()[started_at:])
        self.listen, self.metrics_listen = found  # A restart listens on the same ports.
        self.daemon_rounds = 0
        self.daemon_fds = None
        self.daemon_rss = None
        self.daemon_started_at = started_at

    def stop_daemon(self):
        if self.daemon and self.daemon.poll() is None:
            os.kill(self.daemon.pid, signal.SIGCONT)
            self.daemon.kill()
            self.daemon.wait()

    def read_log(self):
        with open(self.daemon_log) as f:
            return f.read()

    def metrics(self):
        """The daemon's /metrics, as {name: value}; None if it does not answer."""
        host, port = self.metrics_listen.split(":")
        try:
            with socket_in(self.net.names[0]) as conn:
                conn.settimeout(5)
                conn.connect((host, int(port)))
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n")
                answer = b""
                while chunk := conn.recv(65536):
                    answer += chunk
        except OSError:
            return None
        body = answer.decode().partition("\r\n\r\n")[2]
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in body.splitlines() if line and not line.startswith("#")}

    def daemon_jobs(self):
        """What `mcprun jobs` would list, asked over the unix socket: {id: state}; None if no answer."""
        try:
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(5)
            sock.connect(self.socket)
        except OSError:
            return None
        peer = Peer(sock)
        peer.sock.settimeout(5)
        try:
            peer.send(frame({"type": "jobs"}))
            reply = peer.receive()
        except OSError:
            reply = None
        peer.close()
        return {job["id"]: job["state"] for job in reply["jobs"]} if reply and "jobs" in reply else None

    def daemon_fd_count(self):
        try:
            return len(os.listdir(f"/proc/{self.daemon.pid}/fd"))
        except FileNotFoundError:
            return None

    def daemon_rss_bytes(self):
        with open(f"/proc/{self.daemon.pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024

    # --- a round

    def plan(self, index, rng):
        """The round's jobs and faults, all drawn from `rng`: a seed replays them exactly."""
        def job(kind, hosts, nproc):
            restarts = rng.choice([0, 0, 1])
            fail_attempts = rng.choice([0, 0, 1, 99])
            world = len(hosts) * nproc
            return Job(f"r{index}-{kind}", kind, hosts, nproc, restarts, rng.randrange(world),
                       fail_attempts, round(rng.uniform(0.3, 0.7), 2), round(rng.uniform(0, 0.4), 2))
        jobs = [job("lease", [0], 2), job("local", [0, 0], 1), job("net", [1, 2], 1), job("store", [0], 1)]
        # The daemon is killed and restarted every DAEMON_LIFE rounds, so that each daemon lives
        # long enough for its descriptors and memory to show a leak.
        others = sorted(set(FAULTS) - {"daemon_kill"})
        kinds = rng.sample(others, rng.randint(1, 3))
        if index % DAEMON_LIFE == DAEMON_LIFE - 1:
            kinds.append("daemon_kill")
        faults = []
        for kind in kinds:
            at = 0.0 if kind == "port_taken" else round(rng.uniform(0.1, 1.6), 2)
            faults.append((at, kind, {"job": rng.choice(jobs[:3] if kind.startswith("agent") else jobs),
                                      "pick": rng.random(), "hold": round(rng.uniform(0.2, 1.2), 2),
                                      "restore": rng.random() < 0.5, "host": rng.choice([1, 2])}))
        return jobs, faults

    def start_job(self, job, round_dir):
        for node, host in enumerate(job.hosts):
            env = dict(os.environ, CHAOS_TAG=f"{self.tag}-{job.name}", CHAOS_DIR=round_dir,
                       CHAOS_JOB=job.name, CHAOS_SLEEP=str(job.sleep), CHAOS_PAD="x" * 200,
                       CHAOS_FAIL_RANK=str(job.fail_rank), CHAOS_FAIL_ATTEMPTS=str(job.fail_attempts),
                       MCPRUN_SYSFS_ROOT=self.no_gpus, MCPRUN_DAEMON="", TMPDIR=round_dir,
                       PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
            flags = ["-n", str(job.nproc), "--rdzv-id", job.name, "--max-restarts", str(job.restarts),
                     "--timeout", str(JOB_TIMEOUT_S), "--term-timeout", "1",
                     "--summary-json", os.path.join(round_dir, f"summary.{job.name}.{node}.json")]
            if job.kind in ("lease", "local"):
                env.update(MCPRUN_SYSFS_ROOT=self.sysfs, MCPRUN_DAEMON="unix:" + self.socket)
            if job.kind == "lease":
                flags += ["--log-dir", self.full]
            if job.kind in ("local", "net"):
                endpoint = "unix:" + self.socket if job.kind == "local" else self.listen
                flags += ["--nnodes", str(len(job.hosts)), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                          endpoint, "--node-name", f"{job.name}-n{node}", "--rdzv-conf", "join_timeout=3"]
            if job.kind == "store":
                flags += ["--master-port", str(self.store_port)]
            out = open(os.path.join(round_dir, f"out.{job.name}.{node}"), "w")
            err = open(os.path.join(round_dir, f"err.{job.name}.{node}"), "w")
            job.agents.append(subprocess.Popen(
                ["ip", "netns", "exec", self.net.names[host], MCPRUN, *flags, "--no-python", "/bin/sh",
                 "-c", WORKER], env=env, stdout=out, stderr=err, start_new_session=True))
            out.close()
            err.close()

    def worker_pids(self, round_dir, job):
        """The pids job's workers recorded, latest attempt last, alive ones only."""
        found = []
        for name in sorted(os.listdir(round_dir)):
            if name.startswith(f"pid.{job.name}."):
                with open(os.path.join(round_dir, name)) as f:
                    found += [int(p) for p in f.read().split() if alive(int(p))]
        return found

    def round_processes(self):
        """Pids of every process that carries this run's tag in its environment, but the test's own."""
        needle = f"CHAOS_TAG={self.tag}-".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read() and alive(int(entry)):
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def run_round(self, context, jobs, faults):
        """Starts the jobs and fires the faults on time until every agent has ended."""
        round_dir = context["round_dir"]
        os.makedirs(round_dir)
        pending = sorted([(job.start_at, "start", {"job": job}) for job in jobs] + faults,
                         key=lambda e: (e[0], e[1] != "port_taken"))
        self.cleanups = []  # What the round's faults left to undo at its end: callables
        self.running_at_kill = []
        started = context["started"] = time.monotonic()
        try:
            while True:
                now = time.monotonic() - started
                while pending and pending[0][0] <= now:
                    at, kind, args = pending.pop(0)
                    if kind == "start":
                        self.start_job(args["job"], round_dir)
                        continue
                    follow = (FAULTS.get(kind) or FOLLOW_UPS[kind])(self, context, args)
                    if follow:
                        pending = sorted(pending + [(now + follow[0], *follow[1:])],
                                         key=lambda e: e[0])
                if not pending and all(p.poll() is not None for job in jobs for p in job.agents):
                    break
                if now > ROUND_DEADLINE_S:
                    hung = [f"{job.name} node {n}" for job in jobs for n, p in enumerate(job.agents)
                            if p.poll() is None]
                    raise RoundFailed(f"agents still running {ROUND_DEADLINE_S} s into the round: {hung}")
                time.sleep(0.02)
        finally:
            for undo in reversed(self.cleanups):
                undo()
            for job in jobs:
                for proc in job.agents:
                    if proc.poll() is None:
                        os.kill(proc.pid, signal.SIGCONT)
        return time.monotonic() - started

    def note(self, context, what):
        context["log"].append((time.monotonic() - context["started"], what))

    def count_fault(self, context, kind, what):
        self.stats["faults"][kind] += 1
        self.note(context, what)

    def skip_fault(self, context, kind, what):
        self.stats["skipped"][kind] += 1
        self.note(context, "(no target) " + what)

    # --- the checks

    def check_round(self, index, jobs, context):
        round_dir = context["round_dir"]
        left = [] if wait_for(lambda: not self.round_processes(), SETTLE_S) else self.round_processes()
        if left:
            self.stats["processes_left"] += len(left)
            described = []
            for pid in left:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        command = f.read().replace(b"\0", b" ").decode(errors="replace")
                    described.append(f"{pid}: {command[:120]}")
                except OSError:
                    pass
                os.kill(pid, signal.SIGKILL)
            raise RoundFailed("processes of the round outlived it: " + "; ".join(described))
        for job in jobs:
            for node, proc in enumerate(job.agents):
                self.check_agent(job, node, proc, round_dir)
        self.check_daemon(index, jobs, context)

    def check_agent(self, job, node, proc, round_dir):
        code = proc.returncode
        where = f"{job.describe()}, node {node}"
        with open(os.path.join(round_dir, f"err.{job.name}.{node}")) as f:
            err = f.read()
        if node in job.killed and code == -signal.SIGKILL:
            return  # SIGKILLed: it wrote nothing, and its workers were checked with the others.
        self.stats["exits"][code] += 1
        self.stats["agents"] += 1
        tail = "\n    ".join(err.splitlines()[-15:])
        if code not in DOCUMENTED:
            raise RoundFailed(f"{where} exited {code}, not a documented exit code\n    {tail}")
        path = os.path.join(round_dir, f"summary.{job.name}.{node}.json")
        try:
            with open(path) as f:
                summary = json.load(f)
        except (OSError, ValueError) as error:
            raise RoundFailed(f"{where} exited {code} but its --summary-json is unusable: {error}\n    {tail}")
        if summary.get("exit_code") != code:
            raise RoundFailed(f"{where} exited {code}; its summary says {summary.get('exit_code')}")
        accepted = {job.planned} | job.extra[node]
        # A node whose own workers all succeeded before another node's failure reached it ends
        # with 0, as torchrun's does.
        if len(job.hosts) > 1 and summary.get("ranks") and all(
                r.get("exit_code") == 0 for r in summary["ranks"]):
            accepted.add(0)
        # A failure that another node's success overtook cannot restart, since a restart needs
        # every node: the failing node ends with its worker's code and names the finished node.
        if job.fail_attempts and "cannot restart: node(s)" in err and any(
                other.returncode == 0 for i, other in enumerate(job.agents) if i != node):
            accepted.add(FAIL_CODE)
        if code not in accepted:
            raise RoundFailed(f"{where} exited {code}; its plan and faults explain only "
                              f"{sorted(accepted)}\n    {tail}")
        cause = summary.get("root_cause")
        if code != 0 and not (cause and names_cause(err, cause)):
            raise RoundFailed(f"{where} exited {code}; the summary's cause {cause!r} is not in its "
                              f"report\n    {tail}")

    def check_daemon(self, index, jobs, context):
        if self.daemon.poll() is not None:
            raise RoundFailed(f"rendezvousd died (exit {self.daemon.returncode}):\n" + self.read_log()[-3000:])
        names = {job.name for job in jobs}
        def all_finished():
            listed = self.daemon_jobs()
            return listed is not None and all(state == "finished" for job_id, state in listed.items()
                                              if job_id in names)
        if not wait_for(all_finished, SETTLE_S):
            raise RoundFailed(f"the daemon still holds the round's jobs as not finished: {self.daemon_jobs()}")
        held = wait_for(lambda: (lambda m: m and m.get("mcprun_gpu_leases") == 0 and
                                 m.get("mcprun_port_leases") == 0)(self.metrics()), SETTLE_S)
        if not held:
            metrics = self.metrics() or {}
            self.stats["leases_lost"] += int(metrics.get("mcprun_gpu_leases", 0))
            raise RoundFailed(f"leases outlived their jobs: {metrics.get('mcprun_gpu_leases')} GPU(s), "
                              f"{metrics.get('mcprun_port_leases')} port(s) still leased")
        for job_name, log_from in self.running_at_kill:
            job = next(j for j in jobs if j.name == job_name)
            if job.planned != 0 or any(p.returncode != 0 for p in job.agents):
                continue  # Ended by its plan or another fault: nothing left to rebuild, maybe.
            if not re.search(f"job {job_name}: \\S+ re-registered", self.read_log()[log_from:]):
                raise RoundFailed(f"{job_name} ran through a daemon restart, but the new daemon never "
                                  "rebuilt it")
            self.stats["jobs_rebuilt"] += 1
        self.daemon_rounds += 1
        if self.daemon_fds is None:
            self.daemon_fds = self.daemon_fd_count()
        elif not wait_for(lambda: self.daemon_fd_count() <= self.daemon_fds, SETTLE_S):
            fds = sorted(os.readlink(f"/proc/{self.daemon.pid}/fd/{fd}")
                         for fd in os.listdir(f"/proc/{self.daemon.pid}/fd"))
            raise RoundFailed(f"the daemon's descriptors grew from {self.daemon_fds} to {len(fds)}: {fds}")
        rss = self.daemon_rss_bytes()
        if self.daemon_rounds == WARMUP_ROUNDS:
            self.daemon_rss = rss
        elif self.daemon_rss is not None and rss > self.daemon_rss + RSS_GROWTH_BYTES:
            raise RoundFailed(f"the daemon's memory grew from {self.daemon_rss >> 10} KiB to {rss >> 10} KiB "
                              f"over {self.daemon_rounds - WARMUP_ROUNDS} rounds")
        if self.daemon_rss is not None and self.daemon_rounds > self.stats["longest_daemon"][0]:
            self.stats["longest_daemon"] = (self.daemon_rounds, (rss - self.daemon_rss) >> 10)

    def failure(self, index, context, jobs, problem):
        lines = [f"chaos: seed {SEED} round {index} (CHAOS_SEED={SEED} CHAOS_FIRST_ROUND={index} "
                 f"CHAOS_ROUNDS=1 replays it): {problem}",
                 "jobs:"] + [f"  {job.describe()}: exits {[p.returncode for p in job.agents]}" for job in jobs]
        lines += ["faults in order:"] + [f"  t={t:5.2f} s  {what}" for t, what in context["log"]]
        lines += ["rendezvousd log (end):", self.read_log()[-2500:]]
        return "\n".join(lines)

    def test_rounds_of_faults_lose_nothing(self):
        print(f"\nchaos: seed {SEED}, {ROUNDS} rounds (CHAOS_SEED={SEED} replays this run)", flush=True)
        began = time.monotonic()
        for index in range(FIRST_ROUND, FIRST_ROUND + ROUNDS):
            # Each round's plan comes from the seed and its number alone.
            jobs, faults = self.plan(index, random.Random(f"{SEED}-{index}"))
            context = {"jobs": jobs, "log": [], "started": time.monotonic(),
                       "round_dir": os.path.join(self.tmp, f"round-{index}")}
            try:
                seconds = self.run_round(context, jobs, faults)
                self.check_round(index, jobs, context)
            except Exception as problem:  # A broken invariant, or the test's own error: both end the run.
                for job in jobs:
                    for proc in job.agents:
                        if proc.poll() is None:
                            os.killpg(proc.pid, signal.SIGKILL)
                            proc.wait()
                if not isinstance(problem, RoundFailed):
                    raise
                self.fail(self.failure(index, context, jobs, problem))
            self.stats["rounds"] += 1
            self.stats["jobs"] += len(jobs)
            self.stats["round_s"].append(seconds)
            if self.stats["rounds"] % 100 == 0:
                print(f"chaos: {self.stats['rounds']} rounds in {time.monotonic() - began:.0f} s", flush=True)
            subprocess.run(["rm", "-rf", context["round_dir"]], check=False)
            subprocess.run(f"rm -rf {self.full}/*", shell=True, check=False)
        self.report(time.monotonic() - began)

    def report(self, seconds):
        stats = self.stats
        figures = {"seed": SEED, "rounds": stats["rounds"], "seconds": round(seconds, 1),
                   "round_s_mean": round(sum(stats["round_s"]) / len(stats["round_s"]), 2),
                   "round_s_max": round(max(stats["round_s"]), 2),
                   "faults": dict(sorted(stats["faults"].items())),
                   "faults_without_target": dict(sorted(stats["skipped"].items())),
                   "jobs": stats["jobs"], "agents_ended": stats["agents"],
                   "exit_codes": {str(k): v for k, v in sorted(stats["exits"].items())},
                   "processes_left": stats["processes_left"], "leases_lost": stats["leases_lost"],
                   "daemon_restarts_survived": stats["daemon_restarts"],
                   "jobs_rebuilt_after_a_restart": stats["jobs_rebuilt"],
                   "longest_daemon_life_rounds": stats["longest_daemon"][0],
                   "its_rss_growth_after_warmup_kib": stats["longest_daemon"][1]}
        print("chaos: " + json.dumps(figures, indent=1), flush=True)
        if os.environ.get("CHAOS_STATS"):
            with open(os.environ["CHAOS_STATS"], "w") as f:
                json.dump(figures, f, indent=1)


# --- the faults: each acts now, notes what it did, and may return (delay, kind, args) to follow.

def signal_worker(test, context, args, signum):
    job = args["job"]
    pids = test.worker_pids(context["round_dir"], job)
    if not pids:
        if any(p.poll() is None for p in job.agents) and args.get("tries", 0) < RETRIES:
            # Its workers may not have started yet: try again a little later.
            kind = "worker_kill" if signum == signal.SIGKILL else "worker_stop"
            return (0.1, kind, dict(args, tries=args.get("tries", 0) + 1))
        return test.skip_fault(context, f"worker_{signum.name}",
                               f"{signum.name} of a worker of {job.name}: none running")
    pid = pids[int(args["pick"] * len(pids))]
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return test.skip_fault(context, f"worker_{signum.name}",
                               f"{signum.name} of worker {pid} of {job.name}: already gone")
    test.count_fault(context, f"worker_{signum.name}", f"{signum.name} worker {pid} of {job.name}")
    if signum == signal.SIGKILL:
        job.accept_everywhere(128 + signal.SIGKILL)
        return None
    test.cleanups.append(lambda: kill_quietly(pid, signal.SIGCONT))
    return (args["hold"], "cont_worker", {"pid": pid, "job": job})


def cont_worker(test, context, args):
    kill_quietly(args["pid"], signal.SIGCONT)
    test.count_fault(context, "worker_SIGCONT", f"SIGCONT worker {args['pid']} of {args['job'].name}")


def signal_agent(test, context, args, signum):
    job = args["job"]
    running = [(node, p) for node, p in enumerate(job.agents) if p.poll() is None]
    if not running:
        return test.skip_fault(context, f"agent_{signum.name}",
                               f"{signum.name} of an agent of {job.name}: none running")
    node, proc = running[int(args["pick"] * len(running))]
    os.kill(proc.pid, signum)
    test.count_fault(context, f"agent_{signum.name}", f"{signum.name} agent {proc.pid} ({job.name} node {node})")
    # The others lose the node (75); a lost heartbeat also ends the stopped one so.
    job.accept_everywhere(75)
    if signum == signal.SIGKILL:
        job.killed.add(node)
        return None
    test.cleanups.append(lambda: kill_quietly(proc.pid, signal.SIGCONT))
    job.accept_everywhere(124)
    return (args["hold"], "cont_agent", {"proc": proc, "job": job, "node": node})


def cont_agent(test, context, args):
    kill_quietly(args["proc"].pid, signal.SIGCONT)
    test.count_fault(context, "agent_SIGCONT", f"SIGCONT agent {args['proc'].pid} ({args['job'].name} node {args['node']})")


def daemon_uses(test, context):
    """Every job that talks to the daemon may fail its rendezvous or lease (75) while it is gone."""
    for job in context["jobs"]:
        if job.uses_daemon:
            job.accept_everywhere(75)


def kill_daemon(test, context, args):
    # The multi-node jobs whose every worker runs now: the restarted daemon must rebuild them.
    for job in context["jobs"]:
        if job.kind in ("local", "net") and all(p.poll() is None for p in job.agents) and \
                len(test.worker_pids(context["round_dir"], job)) == len(job.hosts) * job.nproc:
            test.running_at_kill.append((job.name, None))
    kill_quietly(test.daemon.pid, signal.SIGKILL)
    test.daemon.wait()
    test.count_fault(context, "daemon_SIGKILL", f"SIGKILL rendezvousd {test.daemon.pid}")
    daemon_uses(test, context)
    return (args["hold"] / 3, "restart_daemon", {})


def restart_daemon(test, context, args):
    test.start_daemon()
    test.running_at_kill = [(name, test.daemon_started_at) for name, _ in test.running_at_kill]
    test.stats["daemon_restarts"] += 1
    test.count_fault(context, "daemon_restart", f"rendezvousd restarted as {test.daemon.pid}")


def stop_daemon(test, context, args):
    if test.daemon.poll() is not None:
        return test.skip_fault(context, "daemon_SIGSTOP", "SIGSTOP of rendezvousd: killed, not restarted yet")
    os.kill(test.daemon.pid, signal.SIGSTOP)
    test.cleanups.append(lambda: kill_quietly(test.daemon.pid, signal.SIGCONT))
    test.count_fault(context, "daemon_SIGSTOP", f"SIGSTOP rendezvousd {test.daemon.pid}")
    daemon_uses(test, context)
    return (args["hold"], "cont_daemon", {})


def cont_daemon(test, context, args):
    kill_quietly(test.daemon.pid, signal.SIGCONT)
    test.count_fault(context, "daemon_SIGCONT", f"SIGCONT rendezvousd {test.daemon.pid}")


def cut_link(test, context, args):
    host = args["host"]
    test.net.link(host, "down")
    test.cleanups.append(lambda: test.net.link(host, "up"))
    test.count_fault(context, "link_cut", f"cut h{host}'s link")
    for job in context["jobs"]:
        if host in job.hosts:
            job.accept_everywhere(75)
    if args["restore"]:
        return (args["hold"], "restore_link", {"host": host})
    return None


def restore_link(test, context, args):
    test.net.link(args["host"], "up")
    test.count_fault(context, "link_restored", f"restored h{args['host']}'s link mid-round")


def fill_disk(test, context, args):
    filled = 0
    with open(os.path.join(test.full, "filler"), "ab", buffering=0) as f:  # Unbuffered: nothing left to flush.
        try:
            while written := f.write(b"\0" * 65536):
                filled += written
        except OSError:
            pass  # ENOSPC: full.
    test.count_fault(context, "disk_full", f"filled --log-dir's tmpfs ({filled >> 10} KiB more)")


def hostile_peer(test, context, args):
    """Garbage, an oversized frame, a half frame, idle connections and a flood, over TCP from
    another host and over the unix socket, held open until the round ends."""
    host, port = test.listen.split(":")
    peers = []

    def connected(sock, address):
        sock.settimeout(1)
        try:
            sock.connect(address)
        except OSError:
            sock.close()  # A cut link or a stopped daemon's full backlog: no connection.
            raise
        return sock

    def tcp():
        return connected(socket_in(test.net.names[1]), (host, int(port)))

    def unix():
        return connected(socket.socket(socket.AF_UNIX), test.socket)

    payloads = [b"\0\0\0\x14GET / HTTP/1.1\r\n\r\n..", b"\x40\0\0\0", b'\0\0\0\x64{"v":1,',
                frame({"type": "heartbeat"}) * 3000, b""]
    try:
        for connect in (tcp, unix):
            for payload in payloads + [b""] * 20:
                sock = connect()
                peers.append(sock)
                try:
                    sock.sendall(payload)
                except OSError:
                    pass  # Refused mid-send: the daemon closed it.
    except OSError as error:
        test.note(context, f"hostile peer: connect failed: {error}")
    test.cleanups.append(lambda: [sock.close() for sock in peers])
    test.count_fault(context, "hostile_peer", f"hostile peer: {len(peers)} connections")


def take_port(test, context, args):
    """Something else listens on the store job's --master-port and on the first ports the daemon
    leases: the store job must fail naming the port; the leased jobs must get other ports."""
    squatters, taken = [], []
    for port in [test.store_port, *LEASE_PORTS]:
        sock = socket_in(test.net.names[0])
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0" if port != test.store_port else "127.0.0.1", port))
            sock.listen()
        except OSError:
            sock.close()
            continue
        squatters.append(sock)
        taken.append(port)
    test.cleanups.append(lambda: [sock.close() for sock in squatters])
    if test.store_port in taken:
        for job in context["jobs"]:
            if job.kind == "store":
                job.accept_everywhere(1)
    test.count_fault(context, "port_taken", f"ports taken: {taken}")


def names_cause(report, cause):
    """Whether mcprun's report on stderr names the summary's root cause: word for word, as an
    error line the cause quotes, or as the failure report's root cause (the rank and its exit)."""
    if cause in report:
        return True
    errors = [line.split("error: ", 1)[1] for line in report.splitlines() if "error: " in line]
    if any(error in cause for error in errors):
        return True
    # One failure report per failed attempt: the summary's cause is the last attempt's.
    roots = re.findall(r"Root cause.*?\n\s+rank:\s+(\d+).*?\n\s+exit:\s+(.*?)\n", report, re.S)
    return bool(roots) and f"rank {roots[-1][0]} on " in cause and roots[-1][1] in cause


def kill_quietly(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


FAULTS = {
    "worker_kill": lambda t, c, a: signal_worker(t, c, a, signal.SIGKILL),
    "worker_stop": lambda t, c, a: signal_worker(t, c, a, signal.SIGSTOP),
    "agent_kill": lambda t, c, a: signal_agent(t, c, a, signal.SIGKILL),
    "agent_stop": lambda t, c, a: signal_agent(t, c, a, signal.SIGSTOP),
    "daemon_kill": kill_daemon,
    "daemon_stop": stop_daemon,
    "link_cut": cut_link,
    "disk_full": fill_disk,
    "hostile_peer": hostile_peer,
    "port_taken": take_port,
}
FOLLOW_UPS = {"cont_worker": cont_worker, "cont_agent": cont_agent, "restart_daemon": restart_daemon,
              "cont_daemon": cont_daemon, "restore_link": restore_link}

if __name__ == "__main__":
    sys.exit("run through unittest")
