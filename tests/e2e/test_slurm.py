"""mcprun under a real Slurm: munged, slurmctld and two slurmd started by hand, once per class.

Each node is a network namespace with its own hostname and address, as on a real cluster: the
controller `ctl` holds a bridge at 10.213.X.1 (X from this process's pid), and n1 (.11) and n2
(.12) hang off it on veth pairs. Every slurmd runs under `unshare --uts --mount` with its own
hostname and a bind-mounted hosts file, so a task on n2 resolves `n1` to n1's address, and the
master address Slurm gives mcprun really crosses a link. The clients (srun, sbatch, scancel)
run inside the controller's namespace. `nsenter --net` enters the namespaces: `ip netns exec`
remounts /sys, and slurmd then finds no cgroup filesystem. Namespaces live only in this kernel
and their names carry the pid, so two runs cannot clash.

Needs root, network namespaces and Debian's slurm-wlm and munge (scripts/install-deps.sh);
skipped otherwise.
"""
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from fake_sysfs import make_tree
from harness import MCPRUN, PYTHON, REPO, LauncherTestCase, alive, wait_for

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "scontrol", "sinfo")
NETNS_DIR = "/run/netns"
# A requeued job waits cred_expire + 1 s before it may start again (120 s by default): shortened
# here so the requeue test takes seconds. README: Slurm says what a real cluster sees.
CRED_EXPIRE = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def slurm_missing():
    if os.geteuid() != 0:
        return "needs root (slurmd, network namespaces)"
    missing = [b for b in SLURM_BINARIES + ("munged", "nsenter", "unshare")
               if not shutil.which(b, path="/usr/sbin:/usr/bin")]
    if missing:
        return f"missing {', '.join(missing)}: run scripts/install-deps.sh"
    probe = f"mcprun-slurm-probe-{os.getpid()}"
    if ip("netns", "add", probe, check=False).returncode != 0:
        return "cannot make network namespaces (ip netns add)"
    ip("netns", "del", probe, check=False)
    return None


def stop(proc):
    """SIGTERM to its process group, a bounded wait, then SIGKILL: the daemon goes either way."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def namespace_inode(name):
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except FileNotFoundError:
        return None


def pids_in_namespaces(inodes):
    """Every process whose network namespace is one of `inodes`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            link = os.readlink(f"/proc/{entry}/ns/net")  # "net:[4026532301]"
        except OSError:
            continue
        if int(link[5:-1]) in inodes and alive(int(entry)):
            found.append(int(entry))
    return found


WORKER = r"""
import json, os, socket, sys, time
out = os.environ["MCPRUN_TEST_DIR"]
rank = os.environ["RANK"]
with open(os.path.join(out, "pid." + rank), "w") as f:
    f.write(str(os.getpid()))
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURMD_NODENAME")
with open(os.path.join(out, "rank." + rank + ".json"), "w") as f:
    json.dump(dict({k: os.environ.get(k) for k in keys}, started=time.time(),
                   hostname=socket.gethostname()), f)
print("first line from rank", rank, flush=True)
if sys.argv[1] == "ddp":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    assert t.item() == sum(range(dist.get_world_size())), t
    open(os.path.join(out, "reduced." + rank), "w").write(str(t.item()))
    dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
    dist.destroy_process_group()
else:
    while True:
        time.sleep(0.1)
"""

# The training loop examples/slurm-job.sbatch's comments describe, with files that tell the test
# what each rank saw. Files are named <what>.<SLURM_RESTART_COUNT>.<rank>.
STEPS = 100
STEP_SECONDS = 0.02
TRAIN = r"""
import json, os, signal, socket, sys, time
import torch, torch.distributed as dist

out = os.environ["MCPRUN_TEST_DIR"]
run = os.environ.get("SLURM_RESTART_COUNT", "0")
rank = os.environ["RANK"]
step = None
stop = False


def note(what, value):
    with open(os.path.join(out, "%s.%s.%s" % (what, run, rank)), "w") as f:
        json.dump(value, f)


def on_usr1(*_):
    global stop
    stop = True
    note("usr1", step)


signal.signal(signal.SIGUSR1, on_usr1)
directory = sys.argv[sys.argv.index("--checkpoint-dir") + 1]
checkpoint = os.path.join(directory, "checkpoint.json")
dist.init_process_group("gloo", init_method="env://")
start = 0
if os.path.exists(checkpoint):
    with open(checkpoint) as f:
        start = json.load(f)["step"] + 1
note("pid", os.getpid())
note("started", {"start": start, "job": os.environ["SLURM_JOB_ID"], "host": socket.gethostname(),
                 "master": os.environ["MASTER_ADDR"]})
for step in range(start, STEPS):
    time.sleep(STEP_SECONDS)  # One training step.
    flag = torch.tensor([float(stop)])
    dist.all_reduce(flag)
    if flag.item() > 0:
        note("stopped", step)
        if dist.get_rank() == 0:
            os.makedirs(directory, exist_ok=True)
            with open(checkpoint + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(checkpoint + ".tmp", checkpoint)
        dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
        dist.destroy_process_group()
        sys.exit(99)
note("finished", {"start": start, "last": step})
dist.barrier()
dist.destroy_process_group()
""".replace("STEPS", str(STEPS)).replace("STEP_SECONDS", str(STEP_SECONDS))


@unittest.skipIf(slurm_missing(), slurm_missing())
class SlurmTest(LauncherTestCase):
    @classmethod
    def setUpClass(cls):
        started = time.monotonic()
        cls.cluster = tempfile.mkdtemp(prefix="mcprun-slurm-")
        cls.daemons, cls.namespaces = [], []
        # Runs after a failed setUpClass too, so a half-built cluster goes as well.
        cls.addClassCleanup(cls.stop_cluster)
        T = cls.cluster
        for sub in ("etc", "state/ctld", "run", "log", "munge"):
            os.makedirs(os.path.join(T, sub), exist_ok=True)
        os.chmod(T, 0o755)
        shutil.chown(os.path.join(T, "munge"), "munge", "munge")
        sock = os.path.join(T, "munge", "socket")
        # munged as our own child (not under runuser), so that stopping it also reaps it.
        cls.daemons.append(subprocess.Popen(
            ["/usr/sbin/munged", "-F", f"--socket={sock}", f"--pid-file={T}/munge/pid",
             f"--log-file={T}/munge/log", f"--seed-file={T}/munge/seed"],
            user="munge", group="munge", extra_groups=[], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        cls.make_network()
        if not wait_for(lambda: os.path.exists(sock), 10):
            raise RuntimeError("munged did not create its socket")
        with open(os.path.join(T, "etc", "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" +
                    "".join(f"{address} {name}\n" for name, address in cls.address.items()))
        ports = [free_port() for _ in range(2)]
        cls.conf = os.path.join(T, "etc", "slurm.conf")
        with open(cls.conf, "w") as f:
            f.write(f"""ClusterName=mcprun
SlurmctldHost=ctl({cls.address['ctl']})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock},cred_expire={CRED_EXPIRE}
StateSaveLocation={T}/state/ctld
SlurmdSpoolDir={T}/state/slurmd.%n
SlurmctldPidFile={T}/run/slurmctld.pid
SlurmdPidFile={T}/run/slurmd.%n.pid
SlurmctldLogFile={T}/log/slurmctld.log
SlurmdLogFile={T}/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
# A requeued job becomes eligible after cred_expire + 1 s but starts only at the next scheduling
# pass: every 60 s by default, every second here.
SchedulerParameters=sched_interval=1
NodeName=n1 NodeAddr={cls.address['n1']} CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr={cls.address['n2']} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        cls.slurm_env = dict(os.environ, SLURM_CONF=cls.conf)
        cls.client = ["nsenter", f"--net={NETNS_DIR}/{cls.netns['ctl']}"]
        cls.node_pid = {}
        for name, daemon in (("ctl", "slurmctld"), ("n1", "slurmd"), ("n2", "slurmd")):
            # The node's own hostname (slurmd finds its NodeName by it) and hosts file.
            inner = (f"hostname {name}; mount --bind {shlex.quote(T)}/etc/hosts /etc/hosts; "
                     f"exec {daemon} -D -f {shlex.quote(cls.conf)}")
            proc = subprocess.Popen(
                ["nsenter", f"--net={NETNS_DIR}/{cls.netns[name]}", "unshare", "--uts", "--mount",
                 "sh", "-c", inner], env=cls.slurm_env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cls.daemons.append(proc)
            cls.node_pid[name] = proc.pid  # The daemon itself once sh has exec'ed it.

        def idle():
            out = subprocess.run(cls.client + ["timeout", "2", "sinfo", "-h", "-o", "%T %D"],
                                 env=cls.slurm_env, capture_output=True, text=True).stdout.split()
            return out == ["idle", "2"]
        if not wait_for(idle, 30, interval=0.1):
            logs = subprocess.run(f"tail -n 5 {T}/log/*", shell=True, capture_output=True, text=True).stdout
            raise RuntimeError("Slurm never showed two idle nodes:\n" + logs)
        cls.startup = time.monotonic() - started
        print(f"\nSlurm up in {cls.startup:.1f} s", flush=True)

    @classmethod
    def make_network(cls):
        tag = os.getpid()
        net = f"10.213.{tag % 250 + 1}"
        cls.address = {"ctl": f"{net}.1", "n1": f"{net}.11", "n2": f"{net}.12"}
        cls.netns = {name: f"mcprun-slurm-{tag}-{name}" for name in cls.address}
        for name, namespace in cls.netns.items():
            ip("netns", "add", namespace)
            cls.namespaces.append(namespace)
            ip("-n", namespace, "link", "set", "lo", "up")
        ctl = cls.netns["ctl"]
        ip("-n", ctl, "link", "add", "br0", "type", "bridge")
        ip("-n", ctl, "addr", "add", cls.address["ctl"] + "/24", "dev", "br0")
        ip("-n", ctl, "link", "set", "br0", "up")
        for node in ("n1", "n2"):
            namespace = cls.netns[node]
            ip("-n", namespace, "link", "add", "eth0", "type", "veth", "peer", "name", node, "netns", ctl)
            ip("-n", ctl, "link", "set", node, "master", "br0", "up")
            ip("-n", namespace, "addr", "add", cls.address[node] + "/24", "dev", "eth0")
            ip("-n", namespace, "link", "set", "eth0", "up")

    @classmethod
    def stop_cluster(cls):
        for proc in reversed(cls.daemons):  # slurmd, slurmctld, then munged.
            stop(proc)
        # A slurmstepd or worker a failed test left behind still holds a namespace: by pid.
        inodes = {namespace_inode(n) for n in cls.namespaces} - {None}
        for pid in pids_in_namespaces(inodes):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_for(lambda: not pids_in_namespaces(inodes), 10)
        if cls.namespaces:
            ip("-n", cls.namespaces[0], "link", "del", "br0", check=False)
        for namespace in cls.namespaces:
            ip("netns", "del", namespace, check=False)
        subprocess.run(["rm", "-rf", cls.cluster], check=False)

    def setUp(self):
        super().setUp()
        self.started = time.monotonic()
        os.chmod(self.tmp, 0o755)
        self.env.update(SLURM_CONF=self.conf, MCPRUN=MCPRUN, PYTHON_EXEC=PYTHON)
        for name in [n for n in self.env if n.startswith(("SLURM_", "PET_")) and n != "SLURM_CONF"]:
            del self.env[name]
        self.worker = self.script("worker.py", WORKER)

    def tearDown(self):
        super().tearDown()
        print(f"\n{self.id().rsplit('.', 1)[1]}: {time.monotonic() - self.started:.1f} s", flush=True)

    def slurm(self, *argv, env=None, timeout=30):
        """A Slurm client, run where clients run: in the controller's namespace."""
        return subprocess.run(self.client + list(argv), env=env or self.env, capture_output=True,
                              text=True, timeout=timeout)

    def sbatch(self, body, *options):
        script = self.script("job.sbatch", "#!/bin/bash\n" + body)
        return self.submit(script, "-o", os.path.join(self.tmp, "job.out"), *options)

    def submit(self, script, *options, env=None):
        out = self.slurm("sbatch", "--parsable", *options, script, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        job = out.stdout.strip().split(";")[0]
        self.addCleanup(lambda: self.slurm("scancel", job))
        return job

    def wait_gone(self, job, timeout):
        gone = wait_for(lambda: self.slurm("squeue", "-h", "-j", job).stdout.strip() == "", timeout, 0.1)
        self.assertTrue(gone, f"job {job} still queued or running after {timeout} s")

    def job_fields(self, job):
        """`scontrol show job` as a dict: JobState, Restarts, ExitCode, ..."""
        out = self.slurm("scontrol", "-o", "show", "job", job).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def read(self, name):
        path = os.path.join(self.tmp, name)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read()

    def test_two_nodes_two_ranks_each_from_slurm_alone(self):
        submitted = time.time()
        job = self.sbatch(f'srun --ntasks-per-node=1 -o {self.tmp}/node%n.out '
                          f'"$MCPRUN" -n 2 {self.worker} ddp\n', "-N", "2")
        self.wait_gone(job, 90)
        logs = self.read("job.out") + self.read("node0.out") + self.read("node1.out")
        envs = [json.loads(self.read(f"rank.{r}.json") or "null") for r in range(4)]
        self.assertTrue(all(envs), logs)
        for rank, env in enumerate(envs):
            node = f"n{rank // 2 + 1}"
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(env["GROUP_RANK"], str(rank // 2))
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(env["MASTER_ADDR"], self.address["n1"])  # n1's own address, by its name.
            self.assertEqual(env["MASTER_PORT"], str(20000 + int(job) % 10000))
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], f"{job}.0")
            self.assertEqual(env["SLURMD_NODENAME"], node)
            self.assertEqual(env["hostname"], node)
            # n2's ranks reach n1's store and n1's ranks across the bridge: only then does it add up.
            self.assertEqual(self.read(f"reduced.{rank}"), "6.0", logs)
        self.assertIn("Slurm job", logs)
        first_line = min(env["started"] for env in envs)
        by_hand = self.by_hand()
        print(f"\nsbatch to the first rank's line: {first_line - submitted:.2f} s; the same job "
              f"by hand with torchrun's flags: {by_hand:.2f} s", flush=True)

    def on_node(self, node):
        """Runs a command on `node` as its slurmd sees the world: its network, hostname, hosts."""
        return ["nsenter", f"--target={self.node_pid[node]}", "--net", "--uts", "--mount"]

    def by_hand(self):
        """Seconds from starting two mcprun (--nnodes 2 --node-rank N) on n1 and n2 to the first
        rank's line."""
        for name in os.listdir(self.tmp):
            if name.startswith(("rank.", "pid.", "reduced.")):
                os.remove(os.path.join(self.tmp, name))
        port = str(free_port())  # Free here, and nothing listens in n1's own namespace anyway.
        started = time.time()
        procs = []
        for n, node in enumerate(("n1", "n2")):
            procs.append(subprocess.Popen(
                self.on_node(node) + [MCPRUN, "--nnodes", "2", "--node-rank", str(n), "--master-addr",
                                      self.address["n1"], "--master-port", port, "-n", "2",
                                      self.worker, "ddp"],
                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                start_new_session=True))
            self.procs.append(procs[-1])
        for proc in procs:
            _, err = proc.communicate(timeout=90)
            self.assertEqual(proc.returncode, 0, err)
        for rank in range(4):
            self.assertEqual(self.read(f"reduced.{rank}"), "6.0")
        return min(json.loads(self.read(f"rank.{r}.json"))["started"] for r in range(4)) - started

    def test_scancel_stops_every_process_and_reports_cancelled(self):
        job = self.sbatch(f'srun --ntasks-per-node=1 -o {self.tmp}/node%n.out '
                          f'bash -c \'exec "$MCPRUN" -n 2 --summary-json {self.tmp}/summary.$SLURM_NODEID.json '
                          f'{self.worker} spin\'\n', "-N", "2")
        self.assertTrue(wait_for(lambda: len(self.pids()) == 4, 60, 0.1),
                        self.read("job.out") + self.read("node0.out"))
        cancelled = time.monotonic()
        self.assertEqual(self.slurm("scancel", job).returncode, 0)
        self.wait_gone(job, 30)
        self.assertTrue(wait_for(lambda: not any(alive(p) for p in self.pids()), 10),
                        "workers outlived scancel")
        print(f"\nscancel until the job was gone: {time.monotonic() - cancelled:.1f} s", flush=True)
        for node in range(2):
            self.assertTrue(wait_for(lambda: self.read(f"summary.{node}.json"), 15), self.read(f"node{node}.out"))
            summary = json.loads(self.read(f"summary.{node}.json"))
            self.assertEqual(summary["result"], "cancelled", self.read(f"node{node}.out"))
            self.assertEqual(summary["exit_code"], 76, summary)
            self.assertIn("cancelled by Slurm", self.read(f"node{node}.out"))

    def test_the_example_batch_script_checkpoints_on_usr1_requeues_and_resumes(self):
        """examples/slurm-job.sbatch as it is, with a train.py that follows its comments."""
        self.script("train.py", TRAIN)
        sysfs = make_tree(os.path.join(self.tmp, "sysfs"), [  # -n gpu: two GPUs on every node.
            {"bus_id": "0000:3b:00.0"}, {"bus_id": "0000:5e:00.0"}])
        env = dict(self.env, HOME=self.tmp, MCPRUN_SYSFS_ROOT=sysfs,
                   PATH=os.path.dirname(os.path.abspath(MCPRUN)) + ":" + self.env["PATH"])
        submitted = time.monotonic()
        job = self.submit(os.path.join(REPO, "examples", "slurm-job.sbatch"), f"--chdir={self.tmp}",
                          env=env)
        log = lambda: self.read(f"ddp-{job}.out")  # noqa: E731 (the script's own --output)
        ranks = range(4)
        self.assertTrue(wait_for(lambda: all(self.read(f"started.0.{r}") for r in ranks), 90, 0.05),
                        log())
        started = time.monotonic()
        warned_at = time.strftime("%H:%M:%S")
        self.assertEqual(self.slurm("scancel", "--signal=USR1", job).returncode, 0)
        # The second run starts once every rank of the first checkpointed and the job requeued.
        self.assertTrue(wait_for(lambda: all(self.read(f"started.1.{r}") for r in ranks), 90, 0.05),
                        log())
        resumed = time.monotonic()
        self.assertTrue(wait_for(lambda: self.job_fields(job).get("JobState") not in
                                 ("PENDING", "RUNNING", "COMPLETING", "REQUEUED", "CONFIGURING"), 60, 0.1),
                        log())
        finished = time.monotonic()
        fields = self.job_fields(job)
        self.assertEqual((fields["JobState"], fields["ExitCode"], fields["Restarts"]),
                         ("COMPLETED", "0:0", "1"), log())

        first = [json.loads(self.read(f"started.0.{r}")) for r in ranks]
        stopped = [json.loads(self.read(f"stopped.0.{r}") or "null") for r in ranks]
        warned = [json.loads(self.read(f"usr1.0.{r}") or "null") for r in ranks]
        self.assertEqual([s["start"] for s in first], [0] * 4)
        self.assertEqual([s["host"] for s in first], ["n1", "n1", "n2", "n2"])
        self.assertEqual({s["master"] for s in first}, {self.address["n1"]})
        self.assertTrue(all(w is not None for w in warned), f"SIGUSR1 reached ranks {warned}\n{log()}")
        self.assertEqual(len(set(stopped)), 1, f"every rank stops at the same step: {stopped}")
        agreed = stopped[0]
        self.assertLess(agreed, STEPS - 1, "the first run ended before the warning arrived")
        for seen in warned:  # Each kept training after the warning, up to the agreed step.
            self.assertLessEqual(seen if seen is not None else -1, agreed)
        with open(os.path.join(self.tmp, "ckpt", job, "checkpoint.json")) as f:
            self.assertEqual(json.load(f), {"step": agreed})

        second = [json.loads(self.read(f"started.1.{r}")) for r in ranks]
        done = [json.loads(self.read(f"finished.1.{r}") or "null") for r in ranks]
        self.assertEqual([(s["job"], s["start"]) for s in second], [(job, agreed + 1)] * 4)
        self.assertEqual(done, [{"start": agreed + 1, "last": STEPS - 1}] * 4, log())
        self.assertFalse(any(self.read(f"finished.0.{r}") for r in ranks))
        self.assertEqual(log().count("Slurm job"), 4, log())  # Both runs, both nodes, one file.
        # mcprun passed the workers' 99 on, on both nodes (the script's requeue condition).
        self.assertEqual(sorted(re.findall(r"srun: error: (n\d): task \d: Exited with exit code 99", log())),
                         ["n1", "n2"], log())
        self.assertNotIn("cancelled by Slurm", log())
        # Every process of the job, both runs: gone once Slurm says the job completed.
        self.assertTrue(wait_for(lambda: not any(alive(p) for p in self.pids()), 10), self.pids())
        # After a requeue SubmitTime is the requeue, EligibleTime cred_expire + 1 s later.
        requeue = {k: fields[k][-8:] for k in ("SubmitTime", "EligibleTime", "StartTime")}
        print(f"\nexample script: USR1 at {warned_at}, requeued at {requeue['SubmitTime']}, eligible at "
              f"{requeue['EligibleTime']}, started again at {requeue['StartTime']}", flush=True)
        print(f"\nexample script: submit to all ranks started {started - submitted:.1f} s, "
              f"USR1 to the requeued run's ranks started {resumed - started:.1f} s, "
              f"to completed {finished - started:.1f} s; agreed step {agreed}, "
              f"ranks warned at {warned}", flush=True)

    def test_more_than_one_task_per_node_is_refused(self):
        out = self.slurm("srun", "-N", "1", "-n", "2", "-o", f"{self.tmp}/task%t.out", "-e",
                         f"{self.tmp}/task%t.err", MCPRUN, "-n", "2", "--no-python", "true")
        self.assertEqual(out.returncode, 2, out.stderr)
        for task in range(2):
            lines = self.read(f"task{task}.err").splitlines()
            self.assertEqual(len(lines), 1, lines)
            self.assertIn("srun --ntasks-per-node=1 mcprun", lines[0])
        self.assertEqual(self.pids(), [])

    def doctor_reports(self, *srun_options):
        """{node id: {check: [(status, finding)]}} of `srun ... mcprun doctor --json`, and the job id."""
        out = self.slurm("srun", *srun_options, "-o", f"{self.tmp}/doctor.%j.%t.json", MCPRUN,
                         "doctor", "--json", "--no-torch")
        files = self.files("doctor.")
        self.assertTrue(files, out.stderr)
        reports = {}
        for name in files:
            checks = {}
            for check in json.loads(self.read(name))["checks"]:
                checks.setdefault(check["check"], []).append((check["status"], check["finding"]))
            reports[int(name.split(".")[2])] = checks
        return reports, files[0].split(".")[1]

    def test_doctor_in_a_step_reports_what_mcprun_takes_from_slurm(self):
        reports, job = self.doctor_reports("-N", "2", "--ntasks-per-node=1")
        port = 20000 + int(job) % 10000
        master = self.address["n1"]
        self.assertEqual(sorted(reports), [0, 1])
        for node, checks in reports.items():
            self.assertEqual([status for status, _ in checks["slurm"]], ["OK"], checks["slurm"])
            self.assertIn(f"Slurm job {job} step 0, node {node} of 2: mcprun takes nnodes 2, "
                          f"node rank {node}, master n1 ({master}) port {port}, run id {job}.0, "
                          f"GPUs none", checks["slurm"][0][1])
            [(status, finding)] = checks["slurm-master"]
            self.assertEqual(status, "OK", finding)
        # n1 binds the port it would listen on; n2 connects to n1 across the bridge.
        self.assertIn(f"MASTER_PORT {port} is free on this node", reports[0]["slurm-master"][0][1])
        self.assertIn(f"first node n1: {master} is reachable and nothing listens on {port}",
                      reports[1]["slurm-master"][0][1])

    def test_doctor_warns_of_more_than_one_task_per_node(self):
        reports, _ = self.doctor_reports("-N", "1", "-n", "2")
        self.assertEqual(sorted(reports), [0, 1])
        for checks in reports.values():
            warnings = [finding for status, finding in checks["slurm"] if status == "WARN"]
            self.assertEqual(len(warnings), 1, checks["slurm"])
            self.assertIn("Slurm started 2 tasks on one node: mcprun refuses to start", warnings[0])

    def test_hostlists_expand_as_scontrol_does(self):
        for expression in ("n[1-2]", "gpu-[01-04,07]", "a[1-2]-b[3-4]", "n1,gpu[1-2],x", "n[9-11]",
                           "x[001-3]", "n[2,1,1]", "n[1-2],n[2-3]", "rack[1-2]-gpu[08-10]"):
            want = self.slurm("scontrol", "show", "hostnames", expression)
            got = subprocess.run([MCPRUN, "hostnames", expression], capture_output=True, text=True)
            self.assertEqual(want.returncode, 0, want.stderr)
            self.assertEqual(got.stdout.split(), want.stdout.split(), expression)


if __name__ == "__main__":
    unittest.main()
