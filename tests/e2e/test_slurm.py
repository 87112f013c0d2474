"""mcprun under a real Slurm: munged, slurmctld and two slurmd (n1, n2) started by hand.

Both slurmd run on this host (`slurmd -N n1` / `-N n2`, NodeAddr 127.0.0.1): the node names
resolve through Slurm's NodeAddr, not DNS, which is the path mcprun takes for the master then.
Needs root and Debian's slurm-wlm and munge (scripts/install-deps.sh); skipped otherwise.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from harness import MCPRUN, PYTHON, LauncherTestCase, alive, wait_for

SLURM_BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "scontrol", "sinfo")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_missing():
    if os.geteuid() != 0:
        return "needs root (slurmd)"
    missing = [b for b in SLURM_BINARIES + ("munged",) if not shutil.which(b, path="/usr/sbin:/usr/bin")]
    return f"missing {', '.join(missing)}: run scripts/install-deps.sh" if missing else None


def stop(pid):
    """SIGTERM, a bounded wait, then SIGKILL: every daemon goes, whatever state it is in."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not wait_for(lambda: not alive(pid), 5):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_for(lambda: not alive(pid), 5)


WORKER = r"""
import json, os, socket, sys, time
out = os.environ["MCPRUN_TEST_DIR"]
rank = os.environ["RANK"]
with open(os.path.join(out, "pid." + rank), "w") as f:
    f.write(str(os.getpid()))
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURMD_NODENAME")
with open(os.path.join(out, "rank." + rank + ".json"), "w") as f:
    json.dump(dict({k: os.environ.get(k) for k in keys}, started=time.time()), f)
print("first line from rank", rank, flush=True)
if sys.argv[1] == "ddp":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    assert t.item() == sum(range(dist.get_world_size())), t
    open(os.path.join(out, "reduced." + rank), "w").write(str(t.item()))
    dist.destroy_process_group()
else:
    while True:
        time.sleep(0.1)
"""


@unittest.skipIf(slurm_missing(), slurm_missing())
class SlurmTest(LauncherTestCase):
    @classmethod
    def setUpClass(cls):
        started = time.monotonic()
        cls.cluster = tempfile.mkdtemp(prefix="mcprun-slurm-")
        T = cls.cluster
        for sub in ("etc", "state/ctld", "run", "log", "munge"):
            os.makedirs(os.path.join(T, sub), exist_ok=True)
        os.chmod(T, 0o755)
        shutil.chown(os.path.join(T, "munge"), "munge", "munge")
        cls.daemons = []
        cls.addClassCleanup(cls.stop_cluster)
        sock = os.path.join(T, "munge", "socket")
        munged = subprocess.Popen(
            ["runuser", "-u", "munge", "--", "/usr/sbin/munged", "-F", f"--socket={sock}",
             f"--pid-file={T}/munge/pid", f"--log-file={T}/munge/log", f"--seed-file={T}/munge/seed"],
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        cls.daemons.append(munged.pid)
        if not wait_for(lambda: os.path.exists(sock), 10):
            raise RuntimeError("munged did not create its socket")
        host = socket.gethostname()
        ports = [free_port() for _ in range(4)]
        cls.conf = os.path.join(T, "etc", "slurm.conf")
        with open(cls.conf, "w") as f:
            f.write(f"""ClusterName=mcprun
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
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
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[2]} CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={ports[3]} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        cls.slurm_env = dict(os.environ, SLURM_CONF=cls.conf)
        for argv in (["slurmctld", "-D", "-f", cls.conf], ["slurmd", "-D", "-N", "n1", "-f", cls.conf],
                     ["slurmd", "-D", "-N", "n2", "-f", cls.conf]):
            proc = subprocess.Popen(argv, env=cls.slurm_env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            cls.daemons.append(proc.pid)

        def idle():
            out = subprocess.run(["timeout", "2", "sinfo", "-h", "-o", "%T %D"], env=cls.slurm_env,
                                 capture_output=True, text=True).stdout.split()
            return out == ["idle", "2"]
        if not wait_for(idle, 30, interval=0.2):
            logs = subprocess.run(f"tail -n 5 {T}/log/*", shell=True, capture_output=True, text=True).stdout
            raise RuntimeError("Slurm never showed two idle nodes:\n" + logs)
        print(f"\nSlurm up in {time.monotonic() - started:.1f} s", flush=True)

    @classmethod
    def stop_cluster(cls):
        for pid in reversed(cls.daemons):  # slurmd, slurmctld, then munged.
            stop(pid)
        # slurmstepd of a job a failed test left behind: its spool dir names it.
        subprocess.run(["rm", "-rf", cls.cluster], check=False)

    def setUp(self):
        super().setUp()
        os.chmod(self.tmp, 0o755)
        self.env.update(SLURM_CONF=self.conf, MCPRUN=MCPRUN, PYTHON_EXEC=PYTHON)
        for name in [n for n in self.env if n.startswith(("SLURM_", "PET_")) and n != "SLURM_CONF"]:
            del self.env[name]
        self.worker = self.script("worker.py", WORKER)

    def slurm(self, *argv, timeout=30):
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)

    def sbatch(self, body, *options):
        script = self.script("job.sbatch", "#!/bin/bash\n" + body)
        out = self.slurm("sbatch", "--parsable", "-o", os.path.join(self.tmp, "job.out"), *options, script)
        self.assertEqual(out.returncode, 0, out.stderr)
        job = out.stdout.strip().split(";")[0]
        self.addCleanup(lambda: self.slurm("scancel", job))
        return job

    def wait_gone(self, job, timeout):
        gone = wait_for(lambda: self.slurm("squeue", "-h", "-j", job).stdout.strip() == "", timeout, 0.2)
        self.assertTrue(gone, f"job {job} still queued or running after {timeout} s")

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
            self.assertEqual(env["RANK"], str(rank))
            self.assertEqual(env["LOCAL_RANK"], str(rank % 2))
            self.assertEqual(env["GROUP_RANK"], str(rank // 2))
            self.assertEqual(env["WORLD_SIZE"], "4")
            self.assertEqual(env["LOCAL_WORLD_SIZE"], "2")
            self.assertEqual(env["MASTER_ADDR"], "127.0.0.1")  # n1's NodeAddr, from scontrol.
            self.assertEqual(env["MASTER_PORT"], str(20000 + int(job) % 10000))
            self.assertEqual(env["TORCHELASTIC_RUN_ID"], f"{job}.0")
            self.assertEqual(env["SLURMD_NODENAME"], f"n{rank // 2 + 1}")
            self.assertEqual(self.read(f"reduced.{rank}"), "6.0", logs)
        self.assertIn("Slurm job", logs)
        first_line = min(env["started"] for env in envs)
        by_hand = self.by_hand()
        print(f"\nsbatch to the first rank's line: {first_line - submitted:.2f} s; the same job "
              f"by hand with torchrun's flags: {by_hand:.2f} s", flush=True)

    def by_hand(self):
        """Seconds from starting two mcprun (--nnodes 2 --node-rank N) to the first rank's line."""
        for name in os.listdir(self.tmp):
            if name.startswith(("rank.", "pid.", "reduced.")):
                os.remove(os.path.join(self.tmp, name))
        port = str(free_port())
        started = time.time()
        procs = [self.start("--nnodes", "2", "--node-rank", str(n), "--master-addr", "127.0.0.1",
                            "--master-port", port, "-n", "2", self.worker, "ddp")
                 for n in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=90)
            self.assertEqual(proc.returncode, 0, err)
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
            self.assertTrue(wait_for(lambda: self.read(f"summary.{node}.json"), 5), self.read(f"node{node}.out"))
            summary = json.loads(self.read(f"summary.{node}.json"))
            self.assertEqual(summary["result"], "cancelled", self.read(f"node{node}.out"))
            self.assertEqual(summary["exit_code"], 76, summary)
            self.assertIn("cancelled by Slurm", self.read(f"node{node}.out"))

    def test_more_than_one_task_per_node_is_refused(self):
        out = self.slurm("srun", "-N", "1", "-n", "2", "-o", f"{self.tmp}/task%t.out", "-e",
                         f"{self.tmp}/task%t.err", MCPRUN, "-n", "2", "--no-python", "true")
        self.assertEqual(out.returncode, 2, out.stderr)
        for task in range(2):
            lines = self.read(f"task{task}.err").splitlines()
            self.assertEqual(len(lines), 1, lines)
            self.assertIn("srun --ntasks-per-node=1 mcprun", lines[0])
        self.assertEqual(self.pids(), [])

    def test_hostlists_expand_as_scontrol_does(self):
        for expression in ("n[1-2]", "gpu-[01-04,07]", "a[1-2]-b[3-4]", "n1,gpu[1-2],x", "n[9-11]",
                           "x[001-3]", "n[2,1,1]", "n[1-2],n[2-3]", "rack[1-2]-gpu[08-10]"):
            want = self.slurm("scontrol", "show", "hostnames", expression)
            got = subprocess.run([MCPRUN, "hostnames", expression], capture_output=True, text=True)
            self.assertEqual(want.returncode, 0, want.stderr)
            self.assertEqual(got.stdout.split(), want.stdout.split(), expression)


if __name__ == "__main__":
    unittest.main()
