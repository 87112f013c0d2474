"""End-to-end tests of stall detection with real torch workers (gloo on CPU), 1.13 and 2.13."""
import glob
import json
import os
import re
import time

from harness import PYTHON, LauncherTestCase
from test_rendezvous import RendezvousTestCase

# Every rank records its pid, then acts as $BEHAVIOUR_<RANK> says; the default is a healthy run.
WORKER = r'''
import os, signal, sys, time
rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
behaviour = os.environ.get(f"BEHAVIOUR_{rank}", "")
print(f"rank {rank} up", flush=True)
if behaviour == "late_init" or (behaviour == "late_first_attempt" and
                                os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"):
    print("sleeping before init_process_group", flush=True)
    time.sleep(600)
if behaviour == "nccl_bootstrap_warning":  # NCCL's own line, then stuck before init.
    print(f"{os.uname().nodename}:{os.getpid()}:{os.getpid()} [0] bootstrap.cc:45 NCCL WARN "
          "Bootstrap : no socket interface found", flush=True)
    time.sleep(600)
if behaviour == "slow_import":
    time.sleep(5)  # A node whose imports outlast --init-timeout: no evidence of a stall yet.
if os.environ.get("MODE") == "quiet" and behaviour != "quiet":
    def tick():  # From before the import on, so the quiet rank is found first however slow it is.
        while True:
            print("tick", flush=True)
            time.sleep(0.1)
    import threading
    threading.Thread(target=tick, daemon=True).start()
restart_count = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if behaviour == "late_in_retry" and restart_count > 0:
    print("late to init in this attempt", flush=True)
    time.sleep(3)
import torch
import torch.distributed as dist
import mcprun
dist.init_process_group("gloo")
print("initialised", flush=True)
mode = os.environ.get("MODE", "")
if mode == "heartbeat":
    for step in range(1000):
        mcprun.heartbeat()
        if step == 5 and behaviour == "sigstop":
            print("stopping myself", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.1)
elif mode == "timer":
    from torch.distributed.elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    with timer.expires(after=30):
        pass  # Released in time: no stall.
    if behaviour == "hang_in_scope":
        with timer.expires(after=2, scope="train_step"):
            print("hanging inside the scope", flush=True)
            time.sleep(600)
    time.sleep(5)
elif mode == "barrier":
    mcprun.barrier("warmup", timeout=60)
    print("passed warmup", flush=True)
    if behaviour == "skip_barrier":
        print("never reaching the checkpoint barrier", flush=True)
        time.sleep(600)
    mcprun.barrier("checkpoint", timeout=5)
elif mode == "quiet":
    time.sleep(600)  # The other rank ticks until mcprun stops the group.
elif mode == "train":
    # A real DDP loop of at least $TRAIN_SECONDS, much longer than --init-timeout. Every rank runs
    # the same number of steps, as a real script does: a rank that left a clock-bound loop one
    # step early would wait in all_gather while the others wait in backward's allreduce, forever.
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, round(float(os.environ.get("TRAIN_SECONDS", "1")) / 0.05) + 1):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        if behaviour == "fail_after_init_first_attempt" and restart_count == 0 and step == 5:
            print("failing after init", flush=True)
            sys.exit(1)
        time.sleep(0.05)
    weights = [p.detach().clone() for p in model.parameters()]
    for weight in weights:
        gathered = [torch.zeros_like(weight) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, weight)
        assert all(torch.equal(g, weight) for g in gathered), "replicas diverged"
    print(f"trained {step} steps in sync", flush=True)
elif mode == "healthy":
    from torch.distributed.elastic import timer
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    for step in range(3):
        with timer.expires(after=60):
            model(torch.randn(4, 8)).sum().backward()
        mcprun.heartbeat()
        print(f"step {step}", flush=True)
        mcprun.barrier(f"step-{step}", timeout=60)
    print("agent store:", os.environ["TORCHELASTIC_USE_AGENT_STORE"], flush=True)
dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
dist.destroy_process_group()
print("done", flush=True)
'''


def report_rows(stderr):
    """Rank -> its row of the stall report."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^  (\d+)\*? .*$", stderr, re.M)}


class StallTest(LauncherTestCase):
    def launch(self, *flags, behaviour=None, mode="", nproc="4", timeout=120, extra_env=None):
        env = dict(self.env, MODE=mode, **(extra_env or {}),
                   **{f"BEHAVIOUR_{rank}": what for rank, what in (behaviour or {}).items()})
        worker = self.script("worker.py", WORKER)
        logs = os.path.join(self.tmp, "logs")
        start = time.monotonic()
        code, out, err = self.run_mcprun("-n", nproc, "--log-dir", logs, *flags, worker, env=env,
                                         timeout=timeout)
        return code, out, err, time.monotonic() - start, logs

    def test_late_rank_is_named_killed_on_time_and_every_rank_dumped(self):
        code, _, err, elapsed, logs = self.launch("--init-timeout", "10", behaviour={2: "late_init"})
        self.assertEqual(code, 3, err)
        self.assertIn("init barrier was not passed within --init-timeout 10 s", err)
        rows = report_rows(err)
        self.assertEqual(sorted(rows), [0, 1, 2, 3], err)
        self.assertIn("never connected to the store", rows[2])
        self.assertIn("2*", rows[2])
        self.assertIn("sleeping before init_process_group", rows[2])
        for rank in (0, 1, 3):
            self.assertIn("connected, not at the init barrier", rows[rank])
        self.assertRegex(err, r"missing: 2\n")
        # A 10 s timeout plus import time, stack dumps and teardown, with slack for a busy CI box
        # (where imports can outlast the timeout, which then counts from the first arrival).
        self.assertLess(elapsed, 60, err)
        dumps = sorted(glob.glob(os.path.join(logs, "*", "attempt_0", "*", "stacks.txt")))
        self.assertEqual(len(dumps), 4, err)
        for dump in dumps:
            with open(dump) as f:
                text = f.read()
            self.assertIn("Python tracebacks", text, dump)
            self.assertRegex(text, r"File \".*worker\.py\", line \d+", dump)
        self.assertTrue(glob.glob(os.path.join(logs, "*", "attempt_0", "stall_report.txt")))

    def test_a_stalled_ranks_recognised_last_line_gets_its_hint_in_the_report_and_summary(self):
        summary = os.path.join(self.tmp, "summary.json")
        code, _, err, _, _ = self.launch("--init-timeout", "6", "--no-stack-dumps", "--summary-json",
                                         summary, nproc="2",
                                         behaviour={1: "nccl_bootstrap_warning"},
                                         extra_env={"NCCL_SOCKET_IFNAME": "eth7"})
        self.assertEqual(code, 3, err)
        hint = ("NCCL's bootstrap could not open or reach its peers' sockets at init "
                "(NCCL_SOCKET_IFNAME=eth7): run `mcprun doctor` on each node")
        self.assertRegex(err, r"\n  1\* .*\n        hint: " + re.escape(hint))
        self.assertEqual(err.count("hint:"), 1, err)  # Rank 0's output matched nothing.
        with open(summary) as f:
            document = json.load(f)
        self.assertTrue(document["hint"].startswith(hint), document)
        self.assertTrue(document["ranks"][1]["hint"].startswith(hint), document)
        self.assertNotIn("hint", document["ranks"][0])

    def test_init_timeout_counts_from_the_first_arrival_not_the_start(self):
        # Rank 0 reaches the store after 5 s of "imports" plus torch's, well past --init-timeout 3;
        # rank 1 never does. The deadline is rank 0's arrival + 3 s, so rank 0 is at the barrier.
        code, _, err, elapsed, _ = self.launch("--init-timeout", "3", nproc="2",
                                               behaviour={0: "slow_import", 1: "late_init"})
        self.assertEqual(code, 3, err)
        self.assertIn("not passed within --init-timeout 3 s of the first rank's arrival", err)
        rows = report_rows(err)
        self.assertIn("never connected to the store", rows[1], err)
        self.assertNotIn("never connected", rows[0], err)
        self.assertGreater(elapsed, 8, err)

    def test_ranks_slower_than_init_timeout_to_start_are_not_a_stall(self):
        code, out, err, _, _ = self.launch("--init-timeout", "4", behaviour={0: "slow_import", 1: "slow_import"},
                                           nproc="2")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("done"), 2, out)

    def test_a_stall_restarts_the_round_under_max_restarts(self):
        code, out, err, _, _ = self.launch("--init-timeout", "8", "--max-restarts", "1",
                                           behaviour={1: "late_first_attempt"}, nproc="2")
        self.assertEqual(code, 0, err)
        self.assertIn("job STALLED", err)
        self.assertIn("restarting the worker group after the stall (1 of 1 restarts)", err)
        self.assertEqual(out.count("done"), 2, out)

    def test_sigstopped_rank_is_a_heartbeat_stall(self):
        code, _, err, _, logs = self.launch("--heartbeat-timeout", "3", mode="heartbeat",
                                            behaviour={1: "sigstop"}, nproc="2")
        self.assertEqual(code, 3, err)
        self.assertIn("rank 1 sent no heartbeat for --heartbeat-timeout 3 s", err)
        self.assertIn("stopped heartbeating", report_rows(err)[1])
        self.assertIn("running", report_rows(err)[0])

    def test_expired_file_timer_scope_is_a_stall_of_that_rank(self):
        code, _, err, _, _ = self.launch(mode="timer", behaviour={0: "hang_in_scope"}, nproc="2")
        self.assertEqual(code, 3, err)
        self.assertIn("rank 0's FileTimer scope 'train_step' expired", err)
        self.assertIn("its FileTimer scope expired", report_rows(err)[0])

    def test_silent_rank_is_a_stall_only_with_silence_timeout(self):
        # Long enough that importing torch on a loaded box (silent too) is not mistaken for it.
        code, _, err, _, _ = self.launch("--silence-timeout", "10", mode="quiet", behaviour={1: "quiet"},
                                         nproc="2")
        self.assertEqual(code, 3, err)
        self.assertIn("rank 1 printed nothing for --silence-timeout 10 s", err)

    def test_healthy_job_under_every_watchdog_finishes(self):
        code, out, err, _, _ = self.launch("--init-timeout", "60", "--heartbeat-timeout", "30",
                                           "--silence-timeout", "30", mode="healthy")
        self.assertEqual(code, 0, err)
        self.assertNotIn("STALLED", err)
        self.assertEqual(out.count("agent store: True"), 4, out)
        self.assertEqual(out.count("done"), 4, out)

    def test_healthy_job_three_times_longer_than_init_timeout_finishes(self):
        code, out, err, elapsed, _ = self.launch("--init-timeout", "4", mode="train",
                                                 extra_env={"TRAIN_SECONDS": "13"}, nproc="2")
        self.assertEqual(code, 0, err)
        self.assertNotIn("STALLED", err)
        self.assertEqual(out.count("in sync"), 2, out)
        self.assertGreater(elapsed, 12)

    def test_without_torchs_init_barrier_a_long_job_finishes_and_a_late_rank_is_still_named(self):
        code, out, err, _, _ = self.launch("--init-timeout", "4", mode="train", nproc="2",
                                           extra_env={"TRAIN_SECONDS": "13", "TORCH_DIST_INIT_BARRIER": "0"})
        self.assertEqual(code, 0, err)
        self.assertIn("TORCH_DIST_INIT_BARRIER=0", err)
        self.assertEqual(out.count("in sync"), 2, out)
        code, _, err, _, _ = self.launch("--init-timeout", "6", nproc="2", behaviour={1: "late_init"},
                                         extra_env={"TORCH_DIST_INIT_BARRIER": "0"})
        self.assertEqual(code, 3, err)
        self.assertIn("never connected to the store", report_rows(err)[1], err)

    def test_restart_after_init_with_rank_0_late_in_the_retry_finishes(self):
        # Attempt 0 passes init, then rank 2 fails; in attempt 1 rank 0 comes late. A store that
        # kept attempt 0's keys would hand attempt 1 stale gloo addresses and counters.
        code, out, err, _, _ = self.launch(
            "--init-timeout", "20", "--max-restarts", "1", mode="train", nproc="3",
            behaviour={2: "fail_after_init_first_attempt", 0: "late_in_retry"},
            extra_env={"TRAIN_SECONDS": "2"})
        self.assertEqual(code, 0, err)
        self.assertIn("restarting the worker group (1 of 1 restarts)", err)
        self.assertIn("late to init in this attempt", out)
        self.assertEqual(out.count("in sync"), 3, out)

    def test_script_without_init_is_not_a_stall(self):
        worker = self.script("plain.py", "import time\ntime.sleep(3)\nprint('finished')\n")
        code, out, err = self.run_mcprun("-n", "2", "--init-timeout", "1", worker)
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("finished"), 2, out)


class MultiNodeStallTest(RendezvousTestCase):
    def two_nodes(self, *flags, behaviour, mode=""):
        env = {"MODE": mode, **{f"BEHAVIOUR_{rank}": what for rank, what in behaviour.items()}}
        worker = self.script("worker.py", WORKER)
        agents = [self.agent(name, "--log-dir", os.path.join(self.tmp, "logs-" + name), *flags,
                             nnodes="2", nproc="2", extra_env=dict(env, PYTHON_EXEC=PYTHON),
                             script=worker)
                  for name in ("a", "b")]
        return self.finish(agents, timeout=120)

    def test_late_rank_on_node_1_stops_both_nodes_and_both_reports_name_it(self):
        results = self.two_nodes("--init-timeout", "10", behaviour={3: "late_init"})
        for code, _, err in results:
            self.assertEqual(code, 3, err)
            rows = report_rows(err)
            self.assertEqual(sorted(rows), [0, 1, 2, 3], err)
            self.assertIn("never connected to the store", rows[3], err)
            self.assertRegex(err, r"missing: 3\n")

    def test_helper_barrier_one_rank_never_reaches(self):
        results = self.two_nodes(behaviour={3: "skip_barrier"}, mode="barrier")
        for code, out, err in results:
            self.assertEqual(code, 3, err)
            self.assertIn("barrier 'checkpoint' was not complete", err)
            rows = report_rows(err)
            self.assertIn("never reached barrier 'checkpoint'", rows[3], err)
            self.assertIn("at barrier 'checkpoint'", rows[0], err)
            self.assertRegex(err, r"missing: 3\n")
