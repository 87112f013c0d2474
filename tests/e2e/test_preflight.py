"""--preflight: the collective check over the job's own ranks before its script, on one host and
across network-namespace hosts (a rate-limited host is named slow, a host cut off mid-check is
named dead within the step's deadline)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest

from harness import MCPRUN, REPO, LauncherTestCase, alive, wait_for
from fake_sysfs import make_tree
from test_netns import NamespaceHosts, can_make_namespaces, ip
from test_rendezvous import RENDEZVOUSD

# The script: what it sees after the preflight is what it would see without one.
SCRIPT = r'''
import json, os
from datetime import timedelta
import torch, torch.distributed as dist
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "pid.%s" % os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([1.0])
dist.all_reduce(value)
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                      timedelta(seconds=10))
def present(key):  # torch 1.13's TCPStore has no check().
    try:
        store.wait([key], timedelta(milliseconds=300))
        return True
    except Exception:
        return False
seen = {k: present(k) for k in ("mcprun/preflight/0/report", "mcprun/preflight/0/info/0")}
names = sorted(os.environ)
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "script.%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"sum": value.item(), "keys": seen, "env": names}, f)
dist.barrier()
dist.destroy_process_group()
'''


def preflight_processes(tmp):
    """Pids of preflight ranks started for the test whose folder is `tmp`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"mcprun._preflight" not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"MCPRUN_TEST_DIR={tmp}".encode() in f.read().split(b"\0") and alive(int(pid)):
                    found.append(int(pid))
        except OSError:
            continue
    return found


sys.path.insert(0, os.path.join(REPO, "worker_helper"))
from mcprun import _preflight as preflight  # noqa: E402  (its judging needs no torch)
from mcprun import _preflight_verdict as verdict  # noqa: E402


class Judging(unittest.TestCase):
    """The verdict's rules on made-up figures: compared with each other, never a spec sheet."""

    def test_round_robin_meets_every_pair_once_in_about_n_rounds(self):
        for n in (2, 3, 4, 7, 8):
            rounds = preflight.round_robin(range(n))
            self.assertEqual(len(rounds), n - 1 if n % 2 == 0 else n)
            met = [pair for pairs in rounds for pair in pairs]
            self.assertEqual(sorted(met), [(a, b) for a in range(n) for b in range(a + 1, n)])
            for pairs in rounds:  # Nobody plays twice in a round.
                ranks = [r for pair in pairs for r in pair]
                self.assertEqual(len(ranks), len(set(ranks)))

    def pairs(self, n, bandwidth):
        return {(a, b): bandwidth(a, b) for a in range(n) for b in range(a + 1, n)}

    def test_a_slow_node_is_named_and_a_uniformly_slow_job_is_not(self):
        nodes = {r: f"host{r}" for r in range(4)}
        slow = self.pairs(4, lambda a, b: 12e6 if 3 in (a, b) else 1.5e9)
        faults = verdict.slow_faults(slow, nodes, [], judge_ranks=False)
        self.assertEqual([(f["what"], f["name"]) for f in faults], [("node", "host3")])
        uniform = self.pairs(4, lambda a, b: 12e6)
        self.assertEqual(verdict.slow_faults(uniform, nodes, [], judge_ranks=False), [])
        noisy = self.pairs(4, lambda a, b: 1.5e9 / (3 if (a, b) == (1, 2) else 1))
        self.assertEqual(verdict.slow_faults(noisy, nodes, [], judge_ranks=False), [])
        # Three nodes of one rank: the one pair without host2 outruns both of host2's.
        three = {r: f"host{r}" for r in range(3)}
        faults = verdict.slow_faults(self.pairs(3, lambda a, b: 1e6 if 2 in (a, b) else 1e9),
                                       three, [], judge_ranks=False)
        self.assertEqual([(f["what"], f["name"]) for f in faults], [("node", "host2")])
        mixed = self.pairs(3, lambda a, b: {(0, 2): 1e6, (1, 2): 0.5e9}.get((a, b), 1e9))
        self.assertEqual(verdict.slow_faults(mixed, three, [], judge_ranks=False), [])
        two = {r: f"host{r}" for r in range(2)}  # Nothing to compare the one pair with.
        self.assertEqual(verdict.slow_faults(self.pairs(2, lambda a, b: 1e3), two, [], False), [])

    def test_a_link_far_under_its_interfaces_speed_is_named_with_two_nodes_too(self):
        infos = lambda n: {r: {"speed_mbps": 10000} for r in range(n)}
        two = {r: f"host{r // 2}" for r in range(4)}  # Two nodes of two ranks.
        pairs = self.pairs(4, lambda a, b: 0.6e6 if two[a] != two[b] else 5e9)
        faults = verdict.nominal_faults(pairs, infos(4), two, [])
        self.assertEqual([(f["kind"], f["what"], f["name"], f["ranks"]) for f in faults],
                         [("slow", "link", "host0 - host1", [0, 1, 2, 3])])
        three = {r: f"host{r}" for r in range(3)}
        pairs = self.pairs(3, lambda a, b: 0.6e6 if 2 in (a, b) else 1e9)
        self.assertEqual([(f["what"], f["name"]) for f in verdict.nominal_faults(pairs, infos(3), three, [])],
                         [("node", "host2")])
        # Named once: the relative rule found it first.
        self.assertEqual(verdict.nominal_faults(pairs, infos(3), three, ["host2"]), [])
        # A loaded box's figures, and an interface that states no speed, name nothing.
        self.assertEqual(verdict.nominal_faults(self.pairs(4, lambda a, b: 100e6), infos(4), two, []), [])
        self.assertEqual(verdict.nominal_faults(self.pairs(4, lambda a, b: 1e3),
                                                  {r: {"speed_mbps": None} for r in range(4)}, two, []), [])

    def test_sizes_left_out_or_unfinished_are_figures_not_bandwidths(self):
        steps = {0: {"all-reduce": {"sizes": [{"bytes": 4096, "seconds": 0.01},
                                              {"bytes": 262144, "unfinished": True}]}},
                 1: {"all-reduce": {"sizes": [{"bytes": 4096, "seconds": 0.02},
                                              {"bytes": 262144, "unfinished": True}]}}}
        figures = verdict.all_reduce_figures(steps, [0, 1], 2)
        self.assertEqual([(f["bytes"], f["seconds"]) for f in figures], [(4096, 0.02), (262144, None)])
        self.assertTrue(figures[1]["unfinished"])
        self.assertEqual(verdict.size_figure(figures[1]), "unfinished at the deadline")
        skipped = {"bytes": 16 << 20, "skipped": True, "predicted_s": 45.2}
        self.assertEqual(verdict.size_figure(skipped), "not run (it would take ~45 s)")

    def test_a_rank_within_a_node_is_judged_on_gpus_only(self):
        one_node = {r: "box" for r in range(4)}
        pairs = self.pairs(4, lambda a, b: 2e9 if 1 in (a, b) else 20e9)
        self.assertEqual([(f["what"], f["name"]) for f in
                          verdict.slow_faults(pairs, one_node, [], judge_ranks=True)],
                         [("rank", "rank 1")])
        self.assertEqual(verdict.slow_faults(pairs, one_node, [], judge_ranks=False), [])

    def test_dead_pairs_are_explained_by_what_they_share(self):
        nodes = {r: f"host{r}" for r in range(4)}
        pairs = self.pairs(4, lambda a, b: None if 2 in (a, b) else 1e9)
        faults = verdict.attribute_pairs([k for k, v in pairs.items() if v is None], pairs, nodes, "dead")
        self.assertEqual([(f["what"], f["name"]) for f in faults], [("node", "host2")])
        pairs = self.pairs(4, lambda a, b: None if (a, b) == (0, 3) else 1e9)
        faults = verdict.attribute_pairs([(0, 3)], pairs, nodes, "dead")
        self.assertEqual([(f["what"], f["ranks"]) for f in faults], [("link", [0, 3])])

    def test_the_narrow_gpu_is_named_against_its_neighbours(self):
        gpu = lambda bus, width: {"bus_id": bus, "link_width": width, "max_link_width": 16}
        infos = {0: {"node": "box", "gpu": gpu("0000:1a:00.0", 16)},
                 1: {"node": "box", "gpu": gpu("0000:3b:00.0", 8)},
                 2: {"node": "box", "gpu": gpu("0000:5e:00.0", 16)}}
        self.assertEqual([f["name"] for f in verdict.pcie_faults(infos)], ["GPU 0000:3b:00.0"])
        for info in infos.values():
            info["gpu"]["link_width"] = 8  # Every slot x8: a figure, not a fault.
        self.assertEqual(verdict.pcie_faults(infos), [])


class OneHost(LauncherTestCase):
    def run_job(self, *flags, env=None):
        script = self.script("job.py", SCRIPT)
        summary = os.path.join(self.tmp, "summary.json")
        started = time.monotonic()
        code, out, err = self.run_mcprun("-n", "4", "--summary-json", summary, *flags, script, env=env)
        with open(summary) as f:
            return code, err, json.load(f), time.monotonic() - started

    def script_saw(self, rank):
        with open(os.path.join(self.tmp, f"script.{rank}.json")) as f:
            return json.load(f)

    def test_healthy_host_prints_the_table_and_runs_the_script_unchanged(self):
        code, err, summary, _ = self.run_job()
        self.assertEqual(code, 0, err)
        self.assertNotIn("mcprun preflight", err)
        self.assertIsNone(summary["preflight"])
        without = [self.script_saw(rank)["env"] for rank in range(4)]
        code, err, summary, elapsed = self.run_job("--preflight=fail")
        self.assertEqual(code, 0, err)
        self.assertRegex(err, r"rank\s+node\s+gpu\s+pcie\s+numa\s+interface")
        self.assertRegex(err, r"all-reduce busbw \(GB/s\): 4 KiB [\d.e-]+, 256 KiB [\d.e-]+, 16 MiB")
        self.assertIn("mcprun preflight: OK", err)
        preflight = summary["preflight"]
        self.assertTrue(preflight["ok"])
        self.assertEqual(preflight["world_size"], 4)
        self.assertEqual(len(preflight["pairs"]), 6)
        self.assertGreater(preflight["floor_busbw"], 0)
        self.assertEqual(summary["restarts"], 0)
        checked = sum(step["seconds"] for step in preflight["steps"].values())
        self.assertLess(checked, 15, preflight["steps"])
        for rank in range(4):
            seen = self.script_saw(rank)
            self.assertEqual(seen["sum"], 4.0)
            self.assertEqual(seen["keys"], {"mcprun/preflight/0/report": False,
                                            "mcprun/preflight/0/info/0": False})
            self.assertEqual(seen["env"], without[rank], "the same variables as without it")
        self.assertEqual(preflight_processes(self.tmp), [])

    def test_an_x8_gpu_among_x16_is_in_the_table_and_named(self):
        gpus = [{"bus_id": f"0000:{bus:02x}:00.0", "numa_node": 0} for bus in (0x1a, 0x3b, 0x5e, 0x86)]
        gpus[2]["current_link_width"] = 8
        root = make_tree(os.path.join(self.tmp, "sysfs"), gpus)
        env = dict(self.env, MCPRUN_SYSFS_ROOT=root, MCPRUN_DAEMON="")
        code, err, summary, _ = self.run_job("--preflight", env=env)
        self.assertEqual(code, 0, err)  # warn: the job runs after the report.
        self.assertRegex(err, r"\n\s+2\s+\S+\s+0000:5e:00\.0\s+x8/x16")
        self.assertRegex(err, r"\n\s+0\s+\S+\s+0000:1a:00\.0\s+x16/x16")
        self.assertIn("GPU 0000:5e:00.0", summary["preflight"]["verdict"])
        self.assertIn("x8", summary["preflight"]["verdict"])
        self.assertIn("--preflight=warn: starting the script anyway", err)

    def test_doctor_collectives_runs_the_check_alone(self):
        code, out, err = self.run_mcprun("doctor", "--collectives", "-n", "2")
        self.assertEqual(code, 0, err)
        self.assertRegex(err, r"mcprun preflight: 2 ranks on 1 node\(s\), gloo")
        self.assertIn("mcprun preflight: OK", err)
        code, _, err = self.run_mcprun("doctor", "--collectives", "--preflight=warn")
        self.assertEqual((code, err.count("\n")), (2, 1), err)

    def test_bad_preflight_value_is_a_usage_error(self):
        code, _, err = self.run_mcprun("--preflight=maybe", "-n", "1", "x.py")
        self.assertEqual(code, 2)
        self.assertIn("--preflight", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)


class Hosts(LauncherTestCase):
    """HOSTS network-namespace hosts of NPROC ranks each, one rendezvousd."""
    HOSTS = 4
    NPROC = 1
    DEADLINE = 4  # --preflight-timeout: what a dead host may cost a step.

    def setUp(self):
        super().setUp()
        self.net = NamespaceHosts(self.HOSTS)
        self.addCleanup(self.remove_namespaces)
        log = open(os.path.join(self.tmp, "rendezvousd.log"), "w")
        # A lease longer than the check: the preflight, not the rendezvous, names a lost host.
        self.daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.net.names[0], RENDEZVOUSD, "--listen",
             self.net.address(0) + ":0", "--lease", "60"], stdout=log, stderr=log,
            start_new_session=True)
        log.close()
        self.procs.append(self.daemon)
        found = wait_for(lambda: re.search(r"listening on [\d.]+:(\d+)", self.daemon_log()), 10)
        self.assertTrue(found, self.daemon_log())
        self.endpoint = f"{self.net.address(0)}:{found.group(1)}"

    def daemon_log(self):
        with open(os.path.join(self.tmp, "rendezvousd.log")) as f:
            return f.read()

    def remove_namespaces(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.net.remove()

    def agents(self, *flags):
        """Starts mcprun on every host; each one's stderr is collected line by line."""
        script = self.script("job.py", SCRIPT)
        self.stderr = [[] for _ in range(self.HOSTS)]
        self.ended = {}  # Host -> when its stderr closed: when its mcprun exited.
        agents = []
        for i in range(self.HOSTS):
            command = ["ip", "netns", "exec", self.net.names[i], MCPRUN, "--nnodes", str(self.HOSTS),
                       "-n", str(self.NPROC), "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint,
                       "--rdzv-id", "preflightjob", "--node-name", f"host{i}",
                       "--preflight-timeout", str(self.DEADLINE), "--summary-json",
                       os.path.join(self.tmp, f"summary.{i}.json"), *flags, script]
            proc = subprocess.Popen(command, env=self.env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            self.procs.append(proc)
            def read(p=proc, lines=self.stderr[i], i=i):
                lines.extend(p.stderr)
                self.ended[i] = time.monotonic()
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            agents.append((proc, reader))
        return agents

    def finish(self, agents, timeout=60):
        codes = []
        deadline = time.monotonic() + timeout
        for i, (proc, reader) in enumerate(agents):
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                reader.join(timeout=10)
                self.fail(f"host{i}'s mcprun ran past {timeout} s:\n" + "".join(self.stderr[i]))
            reader.join(timeout=10)
            codes.append(proc.returncode)
        return codes, ["".join(lines) for lines in self.stderr]

    def summary(self, i):
        with open(os.path.join(self.tmp, f"summary.{i}.json")) as f:
            return json.load(f)

    def slow_link(self, i, rate):
        """Host i's only link at `rate` both ways: its own egress, and the switch port towards it
        (a token bucket whose burst holds a few full frames)."""
        for namespace, device in ((self.net.names[i], "eth0"), (self.net.switch, f"port{i}")):
            ip("-n", namespace, "link", "set", device, "mtu", "1500")
            subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                            "rate", rate, "burst", "32kb", "latency", "100ms"], check=True)

    def finish_within_bound(self, agents):
        """Every agent's exit code and stderr, once each has ended within the bound its first
        preflight line stated (and a second for the launcher's own teardown)."""
        bounds = {}

        def stated():
            for i, lines in enumerate(self.stderr):
                found = re.search(r"preflight: checking \d+ rank\(s\) before the script, within "
                                  r"(\d+) s", "".join(lines))
                if found and i not in bounds:
                    bounds[i] = (int(found.group(1)), time.monotonic())
            return len(bounds) == self.HOSTS
        self.assertTrue(wait_for(stated, 90, interval=0.05),
                        "\n".join("".join(lines) for lines in self.stderr))
        codes, errs = self.finish(agents, timeout=max(b for b, _ in bounds.values()) + 30)
        for i, (bound, seen) in bounds.items():
            self.assertLessEqual(self.ended[i] - seen, bound + 1, f"host{i}:\n{errs[i]}")
        return codes, errs


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class AcrossHosts(Hosts):

    def test_rate_limited_host_is_named_slow_and_the_job_runs_under_warn(self):
        self.slow_link(3, "100mbit")
        codes, errs = self.finish(self.agents("--preflight=warn"))
        self.assertEqual(codes, [0] * self.HOSTS, "\n".join(errs))
        for i in range(self.HOSTS):
            preflight = self.summary(i)["preflight"]
            self.assertFalse(preflight["ok"], errs[i])
            self.assertEqual([(f["kind"], f["what"], f["name"]) for f in preflight["faults"]],
                             [("slow", "node", "host3")], errs[i])
            self.assertIn("node host3 (ranks 3, " + self.net.address(3) + " on eth0) is SLOW", errs[i])
        self.assertEqual(preflight_processes(self.tmp), [])

    def test_host_cut_off_mid_check_is_named_dead_within_the_deadline(self):
        agents = self.agents("--preflight=fail")
        ready = wait_for(lambda: any("process group of 4 ranks" in line for line in self.stderr[0]), 60)
        self.assertTrue(ready, "".join(self.stderr[0]))
        self.net.link(3, "down")
        cut = time.monotonic()
        codes, errs = self.finish(agents)
        # The failed step's deadline, the pairs among the hosts left, the verdict: not more.
        self.assertLess(time.monotonic() - cut, 2 * self.DEADLINE + 10, "\n".join(errs))
        self.assertEqual(codes, [77] * self.HOSTS, "\n".join(errs))
        for i in range(3):
            summary = self.summary(i)
            self.assertEqual(summary["result"], "failed")
            faults = summary["preflight"]["faults"]
            self.assertEqual([(f["kind"], f["what"], f["name"]) for f in faults],
                             [("dead", "node", "host3")], errs[i])
            self.assertIn("node host3 (ranks 3", errs[i])
            self.assertIn("is DEAD", errs[i])
            self.assertIn("--preflight=fail: not starting the script (exit 77)", errs[i])
        self.assertIn("host3 (rank 3) lost the job", errs[3])
        self.assertEqual(self.files("script."), [])
        self.assertTrue(wait_for(lambda: not preflight_processes(self.tmp), 5))


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class ThreeHosts(Hosts):
    HOSTS = 3
    NPROC = 2

    def test_a_host_at_5_mbits_is_named_and_every_node_ends_within_the_stated_bound(self):
        self.slow_link(2, "5mbit")
        codes, errs = self.finish_within_bound(self.agents("--preflight=fail"))
        self.assertEqual(codes, [77] * self.HOSTS, "\n".join(errs))
        for i in range(self.HOSTS):
            faults = self.summary(i)["preflight"]["faults"]
            self.assertEqual([(f["kind"], f["what"], f["name"]) for f in faults],
                             [("slow", "node", "host2")], errs[i])
            self.assertIn("node host2 (ranks 4,5, " + self.net.address(2) + " on eth0) is SLOW", errs[i])
        self.assertEqual(self.files("script."), [])
        self.assertTrue(wait_for(lambda: not preflight_processes(self.tmp), 5))


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class TwoHosts(Hosts):
    HOSTS = 2

    def test_a_slow_link_between_two_hosts_is_named_as_the_link(self):
        self.slow_link(1, "5mbit")
        codes, errs = self.finish_within_bound(self.agents("--preflight=fail"))
        self.assertEqual(codes, [77] * self.HOSTS, "\n".join(errs))
        for i in range(self.HOSTS):
            faults = self.summary(i)["preflight"]["faults"]
            self.assertEqual([(f["kind"], f["what"], f["name"]) for f in faults],
                             [("slow", "link", "host0 - host1")], errs[i])
            self.assertIn(f"the link between host0 ({self.net.address(0)} on eth0) and host1 "
                          f"({self.net.address(1)} on eth0) is SLOW", errs[i])
            self.assertRegex(errs[i], r"of the 10000 Mb/s its interfaces state")

    def test_healthy_hosts_pass_and_the_script_runs(self):
        codes, errs = self.finish_within_bound(self.agents("--preflight=fail"))
        self.assertEqual(codes, [0] * self.HOSTS, "\n".join(errs))
        for i in range(self.HOSTS):
            self.assertTrue(self.summary(i)["preflight"]["ok"], errs[i])
            self.assertIn("mcprun preflight: OK", errs[i])
        self.assertEqual(len(self.files("script.")), self.HOSTS)


if __name__ == "__main__":
    unittest.main()
