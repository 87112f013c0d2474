"""Jobs that succeed must end in success: many short DDP jobs (gloo on CPU) that end right after
training, one-node and static two-node, beside CPU hogs, with the store's host node finishing
first in half of the two-node jobs and last in the other half. A rank that aborts at exit
(a thread of mcprun's inside torch as the interpreter finalises) fails its job. EXIT_STRESS_JOBS
sets how many of each kind (scripts/exit-stress runs hundreds)."""
import os
import subprocess
import sys

from harness import LauncherTestCase, reserve_port

JOBS = int(os.environ.get("EXIT_STRESS_JOBS", "4"))
# One CPU hog by default: in the test command, with the suites beside it, the box runs past its
# cores; scripts/exit-stress, run alone, puts one on every core (EXIT_STRESS_HOGS).
HOGS = int(os.environ.get("EXIT_STRESS_HOGS", "1"))
JOB_TIMEOUT_S = 180

# Trains a few DDP steps and ends at once: no barrier, no destroy_process_group(), as most
# scripts end. FINISH_DELAY_S holds this node's ranks back, so the other node ends first.
TRAIN = r'''
import os, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(5):
    optimizer.zero_grad()
    model(torch.randn(8, 32)).sum().backward()
    optimizer.step()
time.sleep(float(os.environ.get("FINISH_DELAY_S", "0")))
print(f"rank {dist.get_rank()} done", flush=True)
'''

# All-reduces of temporaries, then the end: torch's gloo worker holds each tensor's last
# reference and frees it, with the GIL, just after the collective completes; an interpreter that
# finalises meanwhile ends that thread in a noexcept destructor (torch's own race: under torchrun
# 2.13 this aborted 5 of 12 jobs here; under mcprun on torch 1.13, whose threads are unnamed,
# 1 of 14 beside the hogs until exit waited for every thread). mcprun's exit waits for the
# workers to finish.
TEMPORARIES = r'''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for _ in range(5):
    dist.all_reduce(torch.ones(1 << 16))
print(f"rank {dist.get_rank()} done", flush=True)
'''

HOG = "while True: pass"


class ExitStressTest(LauncherTestCase):
    def setUp(self):
        super().setUp()
        self.train = self.script("train.py", TRAIN)
        # CPU hogs: the reporter's exit races a loaded machine.
        self.hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(HOGS)]
        for hog in self.hogs:
            self.addCleanup(hog.wait)
            self.addCleanup(hog.kill)

    def assert_succeeded(self, code, out, err, ranks, what):
        aborted = "terminate called" in err or "Aborted" in err
        self.assertFalse(aborted, f"{what}: a rank aborted at exit\n{err[-3000:]}")
        self.assertEqual(code, 0, f"{what}\n{err[-3000:]}")
        for rank in range(ranks):
            self.assertIn(f"rank {rank} done", out, what)

    def test_one_node_jobs_that_end_right_after_training_succeed(self):
        for job in range(JOBS):
            code, out, err = self.run_mcprun("-n", "2", self.train, timeout=JOB_TIMEOUT_S)
            self.assert_succeeded(code, out, err, 2, f"one-node job {job}")

    def test_jobs_whose_last_tensors_die_with_the_script_succeed(self):
        script = self.script("temporaries.py", TEMPORARIES)
        for job in range(JOBS):
            code, out, err = self.run_mcprun("-n", "2", script, timeout=JOB_TIMEOUT_S)
            self.assert_succeeded(code, out, err, 2, f"job {job} of temporaries")

    def test_static_two_node_jobs_succeed_whichever_node_ends_first(self):
        for job in range(JOBS):
            # Even jobs: the store's host (node 0) ends first; odd jobs: it ends last.
            late_node = 1 if job % 2 == 0 else 0
            port = reserve_port(self)
            nodes = [self.start("--nnodes", "2", "--node-rank", str(node), "-n", "2",
                                "--master-addr", "127.0.0.1", "--master-port", str(port), self.train,
                                env=dict(self.env, FINISH_DELAY_S="1.5" if node == late_node else "0"))
                     for node in range(2)]
            out = err = ""
            codes = []
            for node in nodes:
                o, e = node.communicate(timeout=JOB_TIMEOUT_S)
                out, err, codes = out + o, err + e, codes + [node.returncode]
            self.assert_succeeded(max(codes, key=abs), out, err, 4,
                                  f"two-node job {job} (node {late_node} ends last)")
