"""Multi-host tests: each "node" is a network namespace with its own IP on a veth pair, joined by
a bridge in a namespace of the test's own. Traffic never leaves these namespaces."""
import json
import os
import re
import signal
import subprocess
import time
import unittest
from datetime import datetime, timezone

from harness import MCPRUN, PYTHON, TORCH2, LauncherTestCase, alive, wait_for
from test_rendezvous import RENDEZVOUSD

SUBNET = "10.250.{}.{}"  # Addresses of the test's own hosts, inside its own namespaces only.

ALLREDUCE = r'''
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "node.%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"sum": value.item(), "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
               "nccl_ifname": os.environ.get("NCCL_SOCKET_IFNAME"),
               "master": os.environ["MASTER_ADDR"]}, f)
dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
dist.destroy_process_group()
'''

# A hang after init, across hosts: uneven shards (rank 1 leaves for the barrier a step early) or
# mismatched collectives (a broadcast on rank 0, an all-reduce on the others).
AFTER_INIT_HANG = r'''
import os
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
if os.environ["HANG"] == "uneven":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    for step in range(10 - (1 if rank == 1 else 0)):
        model(torch.randn(16, 8)).sum().backward()
    dist.barrier()
elif rank == 0:
    dist.broadcast(torch.ones(4), src=0)
else:
    dist.all_reduce(torch.ones(4))
'''


# DDP with 2 MiB of gradients a step, until $DURATION_S; rank 0 leaves a file once it has run
# $WARM_S, so that the test slows a link after the job measured its collectives at full speed.
CRAWL = r'''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
start = time.monotonic()
warm = os.path.join(os.environ["MCPRUN_TEST_DIR"], "warm")
while True:
    elapsed = torch.tensor([time.monotonic() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # Every rank stops at the same step.
    if elapsed.item() > float(os.environ["DURATION_S"]):
        break
    if dist.get_rank() == 0 and elapsed.item() > float(os.environ["WARM_S"]):
        open(warm, "a").close()
    time.sleep(float(os.environ.get("COMPUTE_S", "0.05")))  # The step's own compute.
    optimizer.zero_grad()
    model(torch.randn(8, 512)).sum().backward()
    optimizer.step()
dist.barrier()
'''


def ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def can_make_namespaces():
    if os.geteuid() != 0:
        return False
    probe = f"mcprun-probe-{os.getpid()}"
    if ip("netns", "add", probe, check=False).returncode != 0:
        return False
    ip("netns", "del", probe, check=False)
    return True


class NamespaceHosts:
    """`count` hosts, each a network namespace with its own IP on a veth pair into a bridge that
    lives in a namespace of its own. remove() deletes them all."""

    def __init__(self, count):
        tag = f"{os.getpid() % 10000}-{int(time.monotonic() * 1000) % 100000}"
        self.subnet = 1 + os.getpid() % 250
        self.switch = f"mcprun-sw-{tag}"
        self.names = [f"mcprun-h{i}-{tag}" for i in range(count)]
        ip("netns", "add", self.switch)
        try:
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.names):
                ip("netns", "add", host)
                ip("-n", host, "link", "add", "eth0", "type", "veth", "peer", "name", f"port{i}",
                   "netns", self.switch)
                ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
                ip("-n", host, "addr", "add", self.address(i) + "/24", "dev", "eth0")
                ip("-n", host, "link", "set", "eth0", "up")
                ip("-n", host, "link", "set", "lo", "up")
        except subprocess.CalledProcessError:
            self.remove()
            raise

    def address(self, i):
        return SUBNET.format(self.subnet, i + 1)

    def link(self, i, state):
        """Cuts ("down") or restores ("up") host i's only link."""
        ip("-n", self.names[i], "link", "set", "eth0", state)

    def rate_limit(self, i, rate, both_ways=False):
        """Host i sends at `rate` at most (and receives, `both_ways`: the switch's port towards it
        too): a token bucket (this kernel has no netem) whose burst holds a few full frames."""
        ends = [(self.names[i], "eth0")] + ([(self.switch, f"port{i}")] if both_ways else [])
        for namespace, device in ends:
            subprocess.run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                            "rate", rate, "burst", "16kb", "latency", "500ms"],
                           check=True, capture_output=True, text=True)

    def remove(self):
        for name in [*self.names, self.switch]:
            ip("netns", "del", name, check=False)


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class AcrossHosts(LauncherTestCase):
    HOSTS = 3

    def setUp(self):
        super().setUp()
        self.net = NamespaceHosts(self.HOSTS)
        self.hosts = self.net.names
        self.addCleanup(self.remove_namespaces)
        log = open(os.path.join(self.tmp, "rendezvousd.log"), "w")
        self.daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.hosts[0], RENDEZVOUSD, "--listen",
             self.address(0) + ":0", "--lease", "2"], stdout=log, stderr=log, start_new_session=True)
        log.close()
        self.procs.append(self.daemon)
        found = wait_for(lambda: re.search(r"listening on [\d.]+:(\d+)", self.daemon_log()), 10)
        self.assertTrue(found, self.daemon_log())
        self.endpoint = f"{self.address(0)}:{found.group(1)}"

    def address(self, i):
        return self.net.address(i)

    def daemon_log(self):
        with open(os.path.join(self.tmp, "rendezvousd.log")) as f:
            return f.read()

    def remove_namespaces(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.net.remove()

    def agent(self, i, *args):
        command = ["ip", "netns", "exec", self.hosts[i], MCPRUN, "--nnodes", str(self.HOSTS),
                   "-n", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", self.endpoint,
                   "--rdzv-id", "netjob", "--node-name", f"host{i}", *args]
        proc = subprocess.Popen(command, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        return proc

    def test_gloo_job_across_hosts_uses_the_veth(self):
        script = self.script("allreduce.py", ALLREDUCE)
        agents = [self.agent(i, script) for i in range(self.HOSTS)]
        results = [proc.communicate(timeout=120) for proc in agents]
        for proc, (_, err) in zip(agents, results):
            self.assertEqual(proc.returncode, 0, "\n".join(e for _, e in results))
        for rank in range(self.HOSTS):
            with open(os.path.join(self.tmp, f"node.{rank}.json")) as f:
                node = json.load(f)
            self.assertEqual(node["sum"], 6.0)
            self.assertEqual(node["ifname"], "eth0")
            self.assertEqual(node["nccl_ifname"], "eth0")
            self.assertIn(node["master"], [self.address(i) for i in range(self.HOSTS)])
            self.assertNotEqual(node["master"], "127.0.0.1")

    def test_cut_link_stops_the_others_within_the_lease(self):
        worker = 'echo $$ > "$MCPRUN_TEST_DIR/pid.$RANK"; exec sleep 60'
        agents = [self.agent(i, "--no-python", "/bin/sh", "-c", worker) for i in range(self.HOSTS)]
        self.assertTrue(wait_for(lambda: len(self.pids()) == self.HOSTS, 30), "workers did not start")
        self.net.link(2, "down")
        cut = time.monotonic()
        for proc in agents[:2]:
            _, err = proc.communicate(timeout=30)
            self.assertEqual(proc.returncode, 75, err)
            self.assertIn("host2 was lost", err)
        self.assertLess(time.monotonic() - cut, 2 + 3)  # The lease, plus teardown.
        os.killpg(agents[2].pid, signal.SIGTERM)
        agents[2].communicate(timeout=30)

    @unittest.skipUnless(TORCH2, "torch 1.x's recorder-less ranks time no collective")
    def test_a_rate_limited_link_is_named_as_a_slow_collective_on_every_host(self):
        self.env.update(DURATION_S="45", WARM_S="15")
        script = self.script("crawl.py", CRAWL)
        agents = [self.agent(i, "--straggler-window", "10", "--summary-json",
                             os.path.join(self.tmp, f"summary.{i}.json"), script)
                  for i in range(self.HOSTS)]
        warm = os.path.join(self.tmp, "warm")
        self.assertTrue(wait_for(lambda: os.path.exists(warm) or any(p.poll() is not None for p in agents), 90))
        self.net.rate_limit(2, "40mbit")
        results = [proc.communicate(timeout=150) for proc in agents]
        errs = [err for _, err in results]
        for i, proc in enumerate(agents):
            self.assertEqual(proc.returncode, 0, "\n".join(errs))
            lines = [line for line in errs[i].splitlines() if "slow collective:" in line]
            self.assertTrue(lines, f"host{i} named no slow collective: {errs[i]}")
            found = re.search(r"slow collective: all_reduce of 1 MiB-4 MiB on group 0 \(ranks 0-2\) runs at "
                              r"([\d.e-]+) GB/s bus bandwidth, under 50% of the ([\d.e-]+) GB/s it ran at earlier", lines[0])
            self.assertTrue(found, lines[0])
            # Named while the window still holds some of the fast ones: 40 Mbit/s is 0.005 GB/s.
            self.assertLess(float(found.group(1)), 0.05, lines[0])
            # The sending end of the slow link, found by host2's own mcprun, on every console.
            self.assertRegex(errs[i], r"slow link: rank 2 \(node host2\) sends to 10\.250\.\d+\.\d+:\d+ slowly")
        with open(os.path.join(self.tmp, "summary.0.json")) as f:
            slow = [s for s in json.load(f)["slow_collectives"]]
        self.assertEqual([(s["op"], s["ranks"]) for s in slow][:1], [("all_reduce", [0, 1, 2])])

    @unittest.skipUnless(TORCH2, "torch 1.x's recorder-less ranks time no collective")
    def test_a_link_cut_to_5_mbits_both_ways_is_a_slow_collective_not_a_straggler(self):
        # Steps of a few milliseconds until the cut; then the 1 MiB gradient's all-reduce is the step.
        self.env.update(DURATION_S="100", WARM_S="20", COMPUTE_S="0.005")
        script = self.script("crawl.py", CRAWL)
        agents = [self.agent(i, "--summary-json", os.path.join(self.tmp, f"summary.{i}.json"), script)
                  for i in range(self.HOSTS)]
        warm = os.path.join(self.tmp, "warm")
        self.assertTrue(wait_for(lambda: os.path.exists(warm) or any(p.poll() is not None for p in agents), 90))
        self.net.rate_limit(1, "5mbit", both_ways=True)
        cut = datetime.now(timezone.utc).replace(microsecond=0)
        results = [proc.communicate(timeout=200) for proc in agents]
        errs = [err for _, err in results]
        self.assertEqual([proc.returncode for proc in agents], [0] * self.HOSTS, "\n".join(errs))
        named = []
        for i in range(self.HOSTS):
            with open(os.path.join(self.tmp, f"summary.{i}.json")) as f:
                summary = json.load(f)
            named += [s for s in summary["slow_collectives"] if s["op"] == "all_reduce"]
            self.assertEqual(summary["stragglers"], [], errs[i])
            self.assertNotIn("straggler:", errs[i])
        self.assertTrue(named, "no host named a slow collective:\n" + "\n".join(errs))
        first = min(datetime.strptime(s["first_seen"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
                    for s in named)
        self.assertLessEqual((first - cut).total_seconds(), 60, "\n".join(errs))
        self.assertTrue(any("slow collective: all_reduce" in err for err in errs), "\n".join(errs))
        self.assertTrue(any(re.search(r"slow link: rank \d \(node host\d\) sends to", err) for err in errs),
                        "\n".join(errs))

    def collective_hang_on_every_host(self, hang):
        """Runs AFTER_INIT_HANG on every host; returns each node's stderr and summary."""
        self.env["HANG"] = hang
        script = self.script("hang.py", AFTER_INIT_HANG)
        agents = [self.agent(i, "--collective-timeout", "6", "--summary-json",
                             os.path.join(self.tmp, f"summary.{i}.json"), script)
                  for i in range(self.HOSTS)]
        results = [proc.communicate(timeout=120) for proc in agents]
        errs = [err for _, err in results]
        summaries = []
        for i, proc in enumerate(agents):
            self.assertEqual(proc.returncode, 3, "\n".join(errs))
            with open(os.path.join(self.tmp, f"summary.{i}.json")) as f:
                summaries.append(json.load(f))
        return errs, summaries

    def test_uneven_shards_across_hosts_are_named_on_every_host_and_stop_them_all(self):
        errs, summaries = self.collective_hang_on_every_host("uneven")
        # torch 1.13 sees DDP's all-reduce through the sequence number it moved in backward().
        for err, summary in zip(errs, summaries):
            self.assertIn("job STALLED", err)
            self.assertIn("MISMATCH", err)
            self.assertEqual(summary["stall"]["collective"]["missing"], [1])
        self.assertEqual(summaries[0]["stall"]["collective"]["op"], "all_reduce")
        self.assertEqual(summaries[0]["stall"]["collective"]["in_backward"], not TORCH2)
        self.assertFalse([pid for pid in self.pids() if alive(pid)])

    def test_mismatched_collectives_across_hosts_name_the_odd_rank_out(self):
        errs, summaries = self.collective_hang_on_every_host("mismatch")
        for err, summary in zip(errs, summaries):
            collective = summary["stall"]["collective"]
            self.assertEqual((collective["op"], collective["missing"]), ("all_reduce", [0]))
            self.assertTrue(collective["mismatch"])
            self.assertRegex(err, r"in broadcast.*: a mismatch")
