"""The collective watchdog end to end, with real torch (gloo on CPU), 1.13 and 2.13: a hang after
init is found with no change to the script, named, and stopped; a busy or idle job is not."""
import glob
import itertools
import json
import os
import re
import signal
import subprocess
import time

from harness import PYTHON, TORCH2, LauncherTestCase, wait_for

# Every rank records its pid, initialises gloo, then does what $SCENARIO says for its rank.
WORKER = r'''
import itertools, os, queue, signal, sys, threading, time
rank = int(os.environ["RANK"])
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))
import datetime
import torch
import torch.distributed as dist
group_timeout = float(os.environ.get("GROUP_TIMEOUT_S", "0"))
if group_timeout:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=group_timeout))
else:
    dist.init_process_group("gloo")
scenario = os.environ["SCENARIO"]
hold = float(os.environ.get("HOLD_S", "0"))
print(f"rank {rank} initialised", flush=True)

def ddp_steps(count):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(count):
        loss = model(torch.randn(16, 8)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model

def busy(seconds):  # Pure Python: the GIL is released often, as in real training code.
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(1000))

def hold_the_gil(seconds):  # One C call, as long as the box's full speed makes it: say how long.
    started = time.monotonic()
    sum(itertools.repeat(1, int(seconds * float(os.environ["SUMS_PER_S"]))))
    print(f"rank 0 held the GIL for {time.monotonic() - started:.1f} s", flush=True)

class SlowBackward(torch.autograd.Function):  # Every rank's backward computes for HOLD_S.
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        busy(hold)
        return grad

def ddp_loop(steps, before_step=lambda step: None):
    """The loop users write: DDP's gradient all-reduce runs inside backward()."""
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        before_step(step)
        hidden = model.module[0](torch.randn(16, 8))
        loss = model(torch.randn(16, 8)).sum()
        if scenario == "ddp_long_backward" and step == 2:
            loss = loss + SlowBackward.apply(hidden).sum() * 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

if scenario == "ddp_deadlock":
    ddp_loop(30, lambda step: rank == 1 and step == 5 and queue.Queue().get())
elif scenario == "ddp_frozen":  # A debugger, a cgroup freezer, a swap storm: it stops running.
    ddp_loop(30, lambda step: rank == 1 and step == 5 and os.kill(os.getpid(), signal.SIGSTOP))
elif scenario == "ddp_long_backward":
    ddp_loop(4)
elif scenario == "ddp_rank0_evaluates":  # The others wait in DDP's all-reduce meanwhile.
    ddp_loop(4, lambda step: rank == 0 and step == 2 and busy(hold))
elif scenario == "early_finisher":  # Uneven shards and no barrier: rank 1 exits a step early.
    ddp_loop(30 - (1 if rank == 1 else 0))
    print(f"rank {rank} finished its shard", flush=True)
    sys.exit(0)
elif scenario == "uneven":
    ddp_steps(30 - (1 if rank == 1 else 0))  # Uneven shards: rank 1 has one batch fewer.
    print(f"rank {rank} finished its shard", flush=True)
    dist.barrier()
elif scenario == "mismatch":
    t = torch.ones(4)
    if rank == 0:
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
elif scenario == "deadlock":
    dist.all_reduce(torch.ones(1))
    if rank == 1:
        queue.Queue().get()  # A queue nobody fills: 0 % CPU, forever.
    dist.all_reduce(torch.ones(1))
elif scenario == "skipped_barrier":
    dist.barrier()
    if rank == 2:
        threading.Event().wait()
    dist.barrier()
elif scenario == "subgroup":
    pair = dist.new_group([0, 1])
    if rank == 0:
        dist.barrier(group=pair)
    elif rank == 1:
        threading.Event().wait()
    else:
        threading.Event().wait()  # Not a member: nobody waits for it.
elif scenario == "wedged_peer":
    # Rank 2 enters the all-reduce and then freezes whole, as a peer behind a broken transport
    # or a wedged GPU would: once its progress record shows the call pending, it stops itself.
    # The others join after that, so every member is in a collective that never completes.
    marker = os.path.join(os.environ["MCPRUN_TEST_DIR"], "rank2-frozen")
    if rank == 2:
        def freeze_once_reported():
            store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                                  is_master=False)
            while b'"pending":[{' not in store.get("mcprun/progress/2"):
                time.sleep(0.1)
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        threading.Thread(target=freeze_once_reported, daemon=True).start()
    else:
        while not os.path.exists(marker):
            time.sleep(0.1)
    dist.all_reduce(torch.ones(4))
elif scenario == "busy_rank0":
    dist.barrier()
    if rank == 0:
        open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "rank0-busy"), "w").close()
        busy(hold)  # Checkpointing or evaluating while the others wait.
    dist.barrier()
elif scenario == "gil_held_rank0":
    dist.barrier()
    if rank == 0:
        busy(2)  # Records show it in user code, computing.
        # Then one C call that never releases the GIL (a pickle of a checkpoint, a C extension):
        # its reporter cannot run until it returns.
        hold_the_gil(hold)
    dist.barrier()
elif scenario == "gil_held_at_init":
    dist.barrier()
    if rank == 0:
        # The field's commonest pattern, right after init: rank 0 prepares the data in one C call
        # that holds the GIL (pickle.load, json.loads of a big file) while the others wait at the
        # barrier. Its reporter has sent no record yet, and cannot until the call returns.
        hold_the_gil(hold)
    dist.barrier()
elif scenario == "long_step":
    ddp_steps(1)
    busy(hold)  # Every rank computes one step far longer than the timeout.
    ddp_steps(1)
elif scenario == "loader_sleeps":
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    for step in range(2):
        time.sleep(hold)  # The data loader waits on a slow filesystem, on every rank.
        model(torch.randn(4, 8)).sum().backward()
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
'''

NO_PROCESS_GROUP = r'''
import os, time
import torch
time.sleep(float(os.environ["HOLD_S"]))
print("done without a process group", flush=True)
'''

TIMEOUT = 4  # --collective-timeout of the short runs.


def sums_per_second():
    """How many ones sum(itertools.repeat(1, n)) adds in a second at this box's full speed: the
    fastest of many short counts, measured here and not in the rank, so that the rank goes
    straight into its one long call. Each one costs the same, however long the call. This box's
    speed still drifts by half either way within seconds (a host's other tenants), so a call
    counted for a time may end well short of it: hold_the_gil says how long it held."""
    def seconds_for_one():
        started = time.perf_counter()
        sum(itertools.repeat(1, 10**5))
        return time.perf_counter() - started
    return 10**5 / min(seconds_for_one() for _ in range(50))


def report_rows(stderr):
    """Rank -> its row of the stall report."""
    return {int(m.group(1)): m.group(0) for m in re.finditer(r"^  (\d+)\*? .*$", stderr, re.M)}


class CollectiveStallCase(LauncherTestCase):
    def launch(self, scenario, nproc=3, timeout=TIMEOUT, hold=0, limit=180, script=WORKER, env=None):
        env = dict(self.env, SCENARIO=scenario, HOLD_S=str(hold), **(env or {}))
        self.logs = os.path.join(self.tmp, "logs")
        self.summary = os.path.join(self.tmp, "summary.json")
        flags = [] if timeout is None else ["--collective-timeout", str(timeout)]
        start = time.monotonic()
        code, out, err = self.run_mcprun("-n", str(nproc), "--log-dir", self.logs, "--summary-json",
                                         self.summary, *flags, self.script("worker.py", script),
                                         env=env, timeout=limit)
        return code, out, err, time.monotonic() - start

    def attempt_dir(self):
        """The first attempt's folder of this test's run, under --log-dir."""
        found = glob.glob(os.path.join(self.logs, "*", "attempt_0"))
        self.assertEqual(len(found), 1, found)
        return found[0]

    def stall_summary(self):
        with open(self.summary) as f:
            summary = json.load(f)
        self.assertEqual(summary["result"], "stalled")
        self.assertEqual(summary["stall"]["kind"], "collective")
        return summary["stall"]["collective"]

    def assert_gil_held_is_no_stall(self, scenario):
        """Rank 0 holds the GIL in one C call while the others wait at a barrier: no stall. The
        call is counted for four timeouts at the box's full speed; a box that runs faster than it
        measured ends it sooner, so what it really held is checked: two timeouts at least, one
        whole timeout of silence past the watch's first chance to misjudge it."""
        code, out, err, _ = self.launch(scenario, hold=4 * TIMEOUT,
                                        env={"SUMS_PER_S": str(sums_per_second())})
        self.assertEqual(code, 0, err)
        self.assertNotIn("STALLED", err)
        self.assertEqual(out.count(" done"), 3, out)
        held = re.search(r"rank 0 held the GIL for ([\d.]+) s", out)
        self.assertTrue(held, out)
        self.assertGreater(float(held.group(1)), 2 * TIMEOUT, out)

    def assert_stalled(self, code, err, missing):
        self.assertEqual(code, 3, err)
        self.assertIn("job STALLED", err)
        self.assertRegex(err, rf"not in it: {missing}\b")
        attempt = self.attempt_dir()
        self.assertTrue(os.path.exists(os.path.join(attempt, "stall_report.txt")))
        self.assertTrue(glob.glob(os.path.join(attempt, "*", "stacks.txt")), "no stack dumps")


class CollectiveStallTest(CollectiveStallCase):
    def test_uneven_shards_name_the_allreduce_and_the_rank_that_left_for_the_barrier(self):
        code, _, err, elapsed = self.launch("uneven")
        rows = report_rows(err)
        collective = self.stall_summary()
        self.assertTrue(collective["mismatch"])
        self.assertIn("MISMATCH", err)
        if TORCH2:
            # The Flight Recorder sees DDP's own all-reduce, which no Python frame shows.
            self.assert_stalled(code, err, missing="1")
            self.assertEqual((collective["op"], collective["in"], collective["missing"]),
                             ("all_reduce", [0, 2], [1]))
            self.assertIn("in barrier", rows[1])
            self.assertIn("a mismatch", rows[1])
            self.assert_flight_recorder_dumps(3)
        else:
            # torch 1.13 sees rank 1's barrier in its stack, and the others in DDP's all-reduce
            # through the sequence number it moved in their backward().
            self.assert_stalled(code, err, missing="1")
            self.assertEqual((collective["op"], collective["in_backward"], collective["source"]),
                             ("all_reduce", True, "stack"))
            self.assertIn("in DDP's gradient all_reduce on group 0 (gloo) in backward()", rows[0])
            self.assertIn("in barrier on group 0 (gloo)", rows[1])
            self.assertIn("a mismatch", rows[1])
        self.assertLess(elapsed, TIMEOUT + 60)

    def assert_flight_recorder_dumps(self, world):
        """Every rank's dump, in the folder layout torch's own analyzer reads as it is; the
        analyzer names the rank that called the other collective."""
        folder = os.path.join(self.attempt_dir(), "flight_recorder")
        self.assertEqual(sorted(os.listdir(folder)), [f"rank_{r}" for r in range(world)])
        analysis = subprocess.run([PYTHON, "-m", "torch.distributed.flight_recorder.fr_trace",
                                   folder], capture_output=True, text=True, timeout=120)
        self.assertEqual(analysis.returncode, 0, analysis.stderr)
        self.assertIn("Culprit rank 1; Error type: COLLECTIVE_TYPE_MISMATCH",
                      analysis.stdout + analysis.stderr)

    def test_a_broadcast_on_one_rank_and_an_allreduce_on_the_others_is_a_mismatch(self):
        code, _, err, _ = self.launch("mismatch")
        self.assertEqual(code, 3, err)
        collective = self.stall_summary()
        self.assertEqual(collective["op"], "all_reduce")
        self.assertEqual(collective["missing"], [0])
        self.assertTrue(collective["mismatch"])
        self.assertIn("in broadcast", report_rows(err)[0])

    def test_a_rank_deadlocked_in_user_code_is_named_with_its_frames(self):
        code, _, err, _ = self.launch("deadlock")
        self.assert_stalled(code, err, missing="1")
        self.assertIn("in user code", report_rows(err)[1])
        self.assertIn("get", report_rows(err)[1])  # queue.Queue.get, its innermost frame.

    def test_a_rank_deadlocked_in_user_code_under_ddp_is_named(self):
        code, _, err, elapsed = self.launch("ddp_deadlock")
        self.assert_stalled(code, err, missing="1")
        collective = self.stall_summary()
        self.assertEqual((collective["op"], collective["in"]), ("all_reduce", [0, 2]))
        if not TORCH2:  # torch 1.x sees DDP's all-reduce only as backward().
            self.assertTrue(collective["in_backward"])
            self.assertIn("in DDP's gradient all_reduce on group 0 (gloo) in backward()", report_rows(err)[0])
        self.assertIn("in user code", report_rows(err)[1])
        self.assertIn("queue.py", report_rows(err)[1])

    def test_a_rank_that_stops_running_is_named_as_stopped(self):
        code, _, err, elapsed = self.launch("ddp_frozen")
        self.assert_stalled(code, err, missing="1")
        row = report_rows(err)[1]
        self.assertIn("stopped (state T", row)
        self.assertNotIn("GIL", row)
        self.assertIn("stopped (state T", self.stall_summary()["states"]["1"])

    def test_a_rank_that_finished_first_is_named_when_its_peers_lose_it(self):
        code, out, err, _ = self.launch("early_finisher")
        self.assertNotIn(code, (0, 3), err)
        self.assertIn("rank 1 finished its shard", out)
        # Reaped before the others failed, or still in its interpreter's teardown then.
        self.assertRegex(err, r"hint: +rank 1 finished \((exit 0|its script ended; its interpreter "
                              r"was exiting)\) [0-9.]+ s before rank [02] lost its peer: "
                              r"uneven data across ranks\?")
        with open(self.summary) as f:
            summary = json.load(f)
        self.assertEqual(summary["early_finisher"]["rank"], 1)
        self.assertLess(summary["early_finisher"]["seconds_before_failure"], 60)

    def test_a_barrier_after_init_that_one_rank_never_reaches(self):
        code, _, err, _ = self.launch("skipped_barrier")
        self.assert_stalled(code, err, missing="2")
        self.assertEqual(self.stall_summary()["op"], "barrier")

    def test_a_subgroup_barrier_names_only_the_missing_member(self):
        code, _, err, _ = self.launch("subgroup")
        self.assert_stalled(code, err, missing="1")
        collective = self.stall_summary()
        self.assertEqual(collective["group_ranks"], [0, 1])
        self.assertNotEqual(collective["group"], "0")

    def test_a_collective_every_member_is_in_that_never_completes_points_at_the_transport(self):
        self.env["MCPRUN_PROGRESS_INTERVAL_S"] = "0.2"
        code, _, err, _ = self.launch("wedged_peer")
        self.assertEqual(code, 3, err)
        collective = self.stall_summary()
        self.assertEqual((collective["op"], collective["in"], collective["missing"]),
                         ("all_reduce", [0, 1, 2], []))
        self.assertIn("not in it: none", err)
        self.assertIn("every member is in it and it never completes", err)
        self.assertIn("mcprun doctor", err)

    def test_rank_0_busy_for_three_timeouts_while_the_others_wait_is_no_stall(self):
        code, out, err, elapsed = self.launch("busy_rank0", hold=3 * TIMEOUT)
        self.assertEqual(code, 0, err)
        self.assertGreater(elapsed, 3 * TIMEOUT)
        self.assertEqual(out.count(" done"), 3, out)

    def test_a_watching_node_held_up_past_the_timeout_judges_no_stall_when_it_resumes(self):
        # The node that judges the job (its store, its watch) is stopped for twice the timeout,
        # as a host that swaps or a paused VM is, while rank 0 computes and the others wait: on
        # resuming, what the ranks sent meanwhile must be read before anything is judged.
        env = dict(self.env, SCENARIO="busy_rank0", HOLD_S=str(4 * TIMEOUT))
        launcher = self.start("-n", "3", "--collective-timeout", str(TIMEOUT),
                              self.script("worker.py", WORKER), env=env)
        self.assertTrue(wait_for(lambda: os.path.exists(os.path.join(self.tmp, "rank0-busy")), 60))
        os.kill(launcher.pid, signal.SIGSTOP)
        time.sleep(2 * TIMEOUT)  # The hold-up itself.
        os.kill(launcher.pid, signal.SIGCONT)
        out, err = launcher.communicate(timeout=120)
        self.assertEqual(launcher.returncode, 0, err)
        self.assertEqual(out.count(" done"), 3, out)

    def test_rank_0_busy_in_a_call_that_holds_the_gil_is_no_stall(self):
        # Its reporter writes no record for the call; its node's kernel sees it compute.
        self.assert_gil_held_is_no_stall("gil_held_rank0")

    def test_rank_0_in_a_gil_holding_call_before_its_first_record_is_no_stall(self):
        self.assert_gil_held_is_no_stall("gil_held_at_init")

    def test_one_step_three_timeouts_long_on_every_rank_is_no_stall(self):
        code, out, err, _ = self.launch("long_step", hold=3 * TIMEOUT)
        self.assertEqual(code, 0, err)

    def test_a_backward_three_timeouts_long_on_every_rank_under_ddp_is_no_stall(self):
        code, out, err, elapsed = self.launch("ddp_long_backward", hold=3 * TIMEOUT)
        self.assertEqual(code, 0, err)
        self.assertGreater(elapsed, 3 * TIMEOUT)

    def test_rank_0_evaluating_while_the_others_wait_in_ddp_is_no_stall(self):
        code, out, err, elapsed = self.launch("ddp_rank0_evaluates", hold=3 * TIMEOUT)
        self.assertEqual(code, 0, err)
        self.assertGreater(elapsed, 3 * TIMEOUT)

    def test_ranks_sleeping_in_the_data_loader_are_no_stall(self):
        code, out, err, _ = self.launch("loader_sleeps", hold=1.5 * TIMEOUT)
        self.assertEqual(code, 0, err)

    def test_a_script_without_a_process_group_is_never_watched(self):
        code, out, err, _ = self.launch("none", nproc=2, hold=3 * TIMEOUT, script=NO_PROCESS_GROUP)
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count("done without a process group"), 2)

    def test_a_shorter_group_timeout_fires_first_and_the_report_names_the_collective(self):
        self.env["GROUP_TIMEOUT_S"] = "5"
        code, _, err, _ = self.launch("uneven", timeout=120)
        self.assertNotIn(code, (0, 3), err)  # torch's own timeout: a failure, not mcprun's stall.
        self.assertIn("worker group failed", err)
        self.assertIn("Collectives at the failure", err)
        # Every rank times out, in an order a loaded box shuffles, and whichever exits first
        # still shows the call it was in: rank 1 its barrier, the others DDP's all-reduce (torch
        # 1.13 sees that one as backward()), by the last record each sent before it exited.
        calls = re.findall(r"^  rank (\d): (?:exited: [^;\n]+; last )?in (barrier|all_reduce|"
                           r"DDP's gradient all_reduce|backward)", err, re.M)
        self.assertTrue(calls, err)
        self.assertTrue(all(op == "barrier" for rank, op in calls if rank == "1"), err)

    def test_off_leaves_a_hang_to_the_other_watchdogs(self):
        code, out, err = self.run_mcprun("-n", "3", "--collective-timeout", "off", "--timeout", "20",
                                         self.script("worker.py", WORKER),
                                         env=dict(self.env, SCENARIO="skipped_barrier"), timeout=120)
        self.assertEqual(code, 124, err)  # --timeout's exit: the collective watchdog stayed off.
        self.assertNotIn("STALLED", err)


def load_tests(loader, tests, pattern):
    """The suite as `unittest test_collective_stall` runs it: the short runs only. ctest runs
    DefaultTimeoutTest (three idle minutes) on its own, beside the other suites, and
    LoadedBoxTest alone, since its CPU hogs would load the suites beside it."""
    return loader.loadTestsFromTestCase(CollectiveStallTest)


class LoadedBoxTest(CollectiveStallCase):
    """The no-stall judgement with two CPU hogs beside the job, each as busy as a rank."""

    def setUp(self):
        super().setUp()
        hogs = [subprocess.Popen([PYTHON, "-c", "while True: pass"], start_new_session=True)
                for _ in range(2)]
        self.procs += hogs

    def test_rank_0_in_a_gil_holding_call_before_its_first_record_is_no_stall(self):
        self.assert_gil_held_is_no_stall("gil_held_at_init")

    def test_rank_0_busy_in_a_call_that_holds_the_gil_is_no_stall(self):
        self.assert_gil_held_is_no_stall("gil_held_rank0")

    def test_a_rank_deadlocked_in_user_code_is_still_named(self):
        code, _, err, _ = self.launch("deadlock")
        self.assert_stalled(code, err, missing="1")


class DefaultTimeoutTest(CollectiveStallCase):
    """The default --collective-timeout, once, on torch 2.13: what a user gets with no flag."""
    def test_uneven_shards_are_found_with_no_flag(self):
        code, _, err, elapsed = self.launch("uneven", timeout=None, limit=400)
        self.assert_stalled(code, err, missing="1")
        self.assertIn("--collective-timeout 180 s", err)
        self.assertGreater(elapsed, 180)


if __name__ == "__main__":
    import unittest
    unittest.main()
