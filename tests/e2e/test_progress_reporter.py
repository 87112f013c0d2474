"""The workers' collective progress reporter (worker_helper/sitecustomize.py, worker_helper/mcprun/_progress.py)
with real torch workers (gloo on CPU), 1.13 and 2.13. The test plays mcprun: it serves the job
store, starts the ranks with the environment mcprun gives them and reads their records."""
import datetime
import json
import os
import pickle
import signal
import subprocess
import time
import unittest

import torch.distributed as dist

from harness import PYTHON, REPO, TORCH2, LauncherTestCase, proc_stat, reserve_port, wait_for

INTERVAL_S = 0.2
DEADLINE_S = 45  # For the first records: three torch imports at once on a busy 2-core machine.
# docs/stalls.md: a record is up to 12 KiB in a job of up to 64 ranks, which sends every arrival.
RECORD_LIMIT_BYTES = 12 * 1024
# Past the reporter's exit wait for its exiting record (1 s), within its wait for a report.
STORE_STALL_S = 2.0

# Every rank records its pid, then does what $SCENARIO says; none knows about the reporter.
WORKER = r'''
import json, os, subprocess, sys, time
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{os.environ['RANK']}"), "w") as f:
    f.write(str(os.getpid()))
scenario = os.environ["SCENARIO"]
print("sitecustomize:", sys.modules["sitecustomize"].__file__, flush=True)
print("watch in program:", os.environ.get("MCPRUN_COLLECTIVE_WATCH"), flush=True)
child = subprocess.run(
    [sys.executable, "-c", "import os; print(os.environ.get('MCPRUN_COLLECTIVE_WATCH'))"],
    capture_output=True, text=True)
# The last line: the user's sitecustomize prints in the child too.
print("watch in child:", child.stdout.splitlines()[-1], flush=True)
print("fr buffer:", os.environ.get("TORCH_FR_BUFFER_SIZE"), flush=True)
if scenario == "busy_child":  # A DataLoader worker at work: its CPU time is the rank's too.
    subprocess.Popen([sys.executable, "-c", "while True: pass"])
import torch
import torch.distributed as dist
if scenario == "no_group":
    time.sleep(20 * float(os.environ["MCPRUN_PROGRESS_INTERVAL_S"]))
    print("done without a process group", flush=True)
    sys.exit(0)
if scenario == "own_store":  # Its process group needs no job store; the reporter does.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
else:
    dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

def step():
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()

if scenario == "uneven":
    for _ in range(5 - (1 if rank == 1 else 0)):  # Uneven shards: rank 1 has one batch fewer.
        step()
    dist.barrier()
elif scenario == "healthy":
    while True:
        step()
        time.sleep(0.02)
elif scenario == "single":
    for _ in range(300):
        dist.all_reduce(torch.ones(1))
    if hasattr(torch._C._distributed_c10d, "_dump_fr_trace_json"):
        entries = json.loads(torch._C._distributed_c10d._dump_fr_trace_json())["entries"]
        print("fr entries:", len(entries), flush=True)
    print("ready", flush=True)
    time.sleep(600)
elif scenario == "finish":
    dist.all_reduce(torch.ones(1))
    time.sleep(10 * float(os.environ["MCPRUN_PROGRESS_INTERVAL_S"]))
    print("finished", flush=True)  # No destroy_process_group(), as many scripts end.
elif scenario == "destroy":
    dist.all_reduce(torch.ones(1))
    time.sleep(5 * float(os.environ["MCPRUN_PROGRESS_INTERVAL_S"]))  # Seen initialised first.
    dist.barrier()
    dist.destroy_process_group()
    print("destroyed", flush=True)
    time.sleep(600)  # Evaluating alone, say.
elif scenario == "exit_after_recv":
    if rank == 0:
        dist.recv(torch.zeros(2), src=1)  # Pending in the records until rank 1 sends.
    else:
        time.sleep(2.5 * float(os.environ["MCPRUN_PROGRESS_INTERVAL_S"]))
        dist.send(torch.ones(2), dst=0)
    print("received" if rank == 0 else "sent", flush=True)  # And exits, between two records.
elif scenario == "recv":
    if rank == 0:
        dist.recv(torch.zeros(2), src=1)
    time.sleep(600)  # Rank 1 never sends.
elif scenario in ("slow_teardown", "exit_handler_waits"):
    class BigModel:  # Freed as the interpreter finalises, slowly, after its atexit handlers.
        def __del__(self, sleep=time.sleep):
            sleep(3)
    model = BigModel()

    def exit_when_asked():
        exit_request = os.path.join(os.environ["MCPRUN_TEST_DIR"], "exit")
        for _ in range(600):
            if os.path.exists(exit_request):
                break
            time.sleep(0.05)
        print("exiting", flush=True)

    print("initialised", flush=True)
    if scenario == "exit_handler_waits":  # The program ends at once; its exit handler waits.
        import atexit
        atexit.register(exit_when_asked)
    else:
        exit_when_asked()
elif scenario == "garbage_freed_by_the_reporter":
    import gc, threading
    main_thread, freeing = threading.get_ident(), threading.Event()
    gc.set_threshold(1)  # Every allocation collects, on whichever thread makes it.

    class Garbage:  # In a cycle, as torch's objects often are: only the collector frees it.
        def __init__(self):
            self.cycle = self

        def __del__(self, sleep=time.sleep, ident=threading.get_ident):
            if ident() != main_thread and not freeing.is_set():
                freeing.set()
                sleep(7)  # A destructor that releases the GIL, past every wait of the exit's own.
                open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "freed"), "w").close()

    while not freeing.is_set():
        Garbage()
        time.sleep(0.3)  # Allocates nothing: the reporter's next record collects the garbage.
    print("exiting while the reporter frees garbage", flush=True)
elif scenario in ("busy_child", "own_store"):
    print("initialised", flush=True)
    time.sleep(600)
'''

# A job store in a process of its own, which a test can stop and continue.
STORE_SERVER = r'''
import datetime, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
'''


def unread_bytes(port):
    """Bytes waiting in the receive queues of the established connections to local `port`."""
    total = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in rows.readlines()[1:]:
                _, local, _, state, queues = row.split()[:5]
                if int(local.rsplit(":", 1)[1], 16) == port and state == "01":
                    total += int(queues.split(":")[1], 16)
    return total


class ProgressReporterTest(LauncherTestCase):
    def setUp(self):
        super().setUp()
        self.store = dist.TCPStore("127.0.0.1", 0, None, True,
                                   datetime.timedelta(seconds=DEADLINE_S), wait_for_workers=False)
        self.worker = self.script("worker.py", WORKER)
        self.outputs = []

    def start_ranks(self, scenario, world, **env):
        """Starts `world` ranks as mcprun would: clients of our store, the reporter asked for."""
        for rank in range(world):
            rank_env = dict(self.env, SCENARIO=scenario, RANK=str(rank), LOCAL_RANK=str(rank),
                            WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(self.store.port), TORCHELASTIC_RESTART_COUNT="0",
                            # Both torches' init_process_group then join our store, not host one.
                            TORCHELASTIC_USE_AGENT_STORE="True", MCPRUN_COLLECTIVE_WATCH="1",
                            MCPRUN_PROGRESS_INTERVAL_S=str(INTERVAL_S),
                            PYTHONPATH=os.path.join(REPO, "worker_helper"), OMP_NUM_THREADS="1")
            rank_env.update(env)
            output = open(os.path.join(self.tmp, f"output.{rank}"), "w+")
            self.addCleanup(output.close)
            self.outputs.append(output)
            self.procs.append(subprocess.Popen([PYTHON, self.worker], env=rank_env, stdout=output,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def output(self, rank):
        self.outputs[rank].seek(0)
        return self.outputs[rank].read()

    def assert_quiet(self, rank):
        """Nothing from the reporter or its store client in the rank's output."""
        for noise in ("mcprun progress", "Traceback", "[W", "[E", "Error"):
            self.assertNotIn(noise, self.output(rank))

    def record(self, rank, condition=lambda record: True, timeout=DEADLINE_S):
        """The first record of `rank` that meets `condition`; fails with the last one seen."""
        key = f"mcprun/progress/{rank}"
        # A get of a missing key blocks for the store's timeout: wait for the key first.
        try:
            self.store.wait([key], datetime.timedelta(seconds=timeout))
        except RuntimeError:  # The store's timeout.
            self.fail(f"rank {rank} published no record in {timeout} s\n{self.output(rank)}")
        seen = []

        def matching():
            raw = self.store.get(key)
            self.assertLess(len(raw), RECORD_LIMIT_BYTES)
            seen.append(json.loads(raw))
            return condition(seen[-1]) and seen[-1]

        found = wait_for(matching, timeout, interval=INTERVAL_S / 2)
        self.assertTrue(found, f"rank {rank}'s last record: {seen[-1]}\n{self.output(rank)}")
        return found

    def later_record(self, rank, count):
        """The record of `rank` made `count` records after its current one."""
        current = self.record(rank)["n"]
        return self.record(rank, lambda record: record["n"] >= current + count)

    def test_uneven_shards_show_the_barrier_against_the_others_allreduce_and_no_progress(self):
        self.dump_prefix = os.path.join(self.tmp, "flight_recorder", "rank_")
        os.makedirs(os.path.dirname(self.dump_prefix))
        self.start_ranks("uneven", 3, TORCH_FR_DUMP_TEMP_FILE=self.dump_prefix)
        # On torch 2.x, from the Flight Recorder (with its sequence number) once it has shown
        # the same barrier twice: the first records have it from the stack alone.
        in_barrier = self.record(1, lambda r: [(p["op"], p["seq"] >= 0 or not TORCH2)
                                               for p in r["pending"]] == [("barrier", True)])
        barrier = in_barrier["pending"][0]
        self.assertEqual((barrier["group"], barrier["group_ranks"], barrier["backend"]),
                         ("0", [0, 1, 2], "gloo"))
        if TORCH2:
            # The Flight Recorder sees DDP's all-reduce, issued from C++: same slot, other op.
            for rank in (0, 2):
                record = self.record(rank, lambda r: r["pending"])
                self.assertEqual(record["source"], "flight_recorder")
                allreduce = record["pending"][0]
                self.assertEqual((allreduce["op"], allreduce["seq"], allreduce["group_ranks"]),
                                 ("all_reduce", barrier["seq"], [0, 1, 2]))
        else:
            # torch 1.13 has no Flight Recorder: the others are in backward, where DDP's
            # all-reduce runs in C++; the sequence number it moved shows it pending there.
            self.assertEqual(barrier["seq"], -1)
            for rank in (0, 2):
                record = self.record(rank, lambda r: r["pending"])
                self.assertTrue(record["frames"][-1].endswith(" in backward"), record["frames"])
                allreduce = record["pending"][0]
                self.assertEqual((record["source"], allreduce["op"], allreduce["in_backward"],
                                  allreduce["group_ranks"]), ("stack", "all_reduce", True, [0, 1, 2]))
        # Past the first records in backward: DDP's last all-reduce may not have been issued yet.
        before = {rank: self.later_record(rank, 3) for rank in range(3)}
        after = {rank: self.later_record(rank, 5) for rank in range(3)}
        for rank in range(3):
            self.assertEqual(after[rank]["completed"], before[rank]["completed"], rank)
            self.assertEqual(after[rank]["pid"], self.procs[rank].pid)
        waited = self.record(1)["pending"][0]["pending_s"]
        self.assertGreater(waited, 5 * INTERVAL_S)
        for rank in range(3):
            self.assert_quiet(rank)
        if TORCH2:
            self.assert_flight_recorder_dumps_on_request(3)

    def assert_flight_recorder_dumps_on_request(self, world):
        """As mcprun does on a stall: each rank dumps once, in the folder torch's analyzer reads."""
        prefix = self.dump_prefix
        self.assertEqual(os.listdir(os.path.dirname(prefix)), [])  # Not before it is asked.
        self.store.set("mcprun/flight_recorder/dump", "1")
        for rank in range(world):
            self.assertTrue(wait_for(lambda: os.path.exists(prefix + str(rank)), 10), rank)
            with open(prefix + str(rank), "rb") as dump:
                entries = pickle.load(dump)["entries"]
            self.assertIn("gloo:all_reduce", {entry["profiling_name"] for entry in entries})
        self.assertEqual(sorted(os.listdir(os.path.dirname(prefix))),
                         [f"rank_{rank}" for rank in range(world)])
        analysis = subprocess.run([PYTHON, "-m", "torch.distributed.flight_recorder.fr_trace",
                                   os.path.dirname(prefix)], capture_output=True, text=True,
                                  timeout=DEADLINE_S)
        self.assertEqual(analysis.returncode, 0, analysis.stderr)
        self.assertIn("Culprit rank 1", analysis.stdout + analysis.stderr)  # Its log: stderr.

    @unittest.skipUnless(TORCH2, "torch 1.13 has no Flight Recorder to turn off")
    def test_with_the_flight_recorder_off_torch2_falls_back_to_the_stack(self):
        self.start_ranks("uneven", 2, TORCH_FR_BUFFER_SIZE="0")
        # Past its DDP steps, whose all-reduce a record may catch first: the barrier it ends in.
        record = self.record(1, lambda r: [p["op"] for p in r["pending"]] == ["barrier"])
        pending = record["pending"][0]
        self.assertEqual((record["source"], pending["op"], pending["seq"]),
                         ("stack", "barrier", -1))
        # DDP's all-reduce, issued from C++, is seen as the backward() that moved the sequence.
        record = self.record(0, lambda r: r["pending"])
        self.assertTrue(any(f.endswith(" in backward") for f in record["frames"]), record["frames"])
        self.assertEqual((record["source"], record["pending"][0]["op"], record["pending"][0]["in_backward"]),
                         ("stack", "all_reduce", True))

    def test_a_recv_shows_as_pending_though_gloo_records_no_point_to_point(self):
        self.start_ranks("recv", 2)
        record = self.record(0, lambda r: r["pending"] and r["pending"][0]["pending_s"] > 1)
        self.assertEqual((record["pending"][0]["op"], record["pending"][0]["group_ranks"]),
                         ("recv", [0, 1]))
        self.assertEqual(self.record(1)["pending"], [])

    def test_a_healthy_loop_completes_more_and_has_nothing_pending_for_long(self):
        self.start_ranks("healthy", 2)
        first = self.record(0, lambda r: r["completed"] > 0)
        self.record(0, lambda r: r["completed"] >= first["completed"] + 20)
        self.record(0, lambda r: r["pending"] == [])
        for _ in range(10):  # Whatever is in flight at a sample finishes within the step.
            record = self.later_record(0, 1)
            self.assertTrue(all(p["pending_s"] < 2 for p in record["pending"]), record)
        self.assertEqual(record["source"], "flight_recorder" if TORCH2 else "stack")
        self.assertTrue(all(self.procs[rank].poll() is None for rank in range(2)))

    def test_a_process_that_never_creates_a_process_group_publishes_nothing(self):
        keys = self.store.num_keys()
        self.start_ranks("no_group", 1)
        self.assertEqual(self.procs[0].wait(timeout=DEADLINE_S), 0, self.output(0))
        self.assertIn("done without a process group", self.output(0))
        self.assertEqual(self.store.num_keys(), keys)

    def test_a_program_that_ends_exits_at_once_with_its_reporter_running(self):
        self.start_ranks("finish", 1)
        self.record(0)
        self.assertTrue(wait_for(lambda: "finished" in self.output(0), DEADLINE_S), self.output(0))
        start = time.monotonic()
        self.assertEqual(self.procs[0].wait(timeout=DEADLINE_S), 0, self.output(0))
        self.assertLess(time.monotonic() - start, 10)  # Not held by the reporter's thread.
        self.assert_quiet(0)

    def test_a_job_store_not_up_yet_is_retried_quietly(self):
        port = reserve_port(self)  # Refuses connections until a server listens there.
        self.start_ranks("own_store", 1, MASTER_PORT=str(port))
        self.assertTrue(wait_for(lambda: "initialised" in self.output(0), DEADLINE_S),
                        self.output(0))
        time.sleep(5 * INTERVAL_S)  # Lets the reporter fail to connect a few times.
        self.store = dist.TCPStore("127.0.0.1", port, None, True,
                                   datetime.timedelta(seconds=DEADLINE_S), wait_for_workers=False)
        self.assertEqual(self.record(0)["source"], "flight_recorder" if TORCH2 else "stack")
        self.assert_quiet(0)

    def test_records_go_on_past_destroy_process_group_with_nothing_pending(self):
        self.start_ranks("destroy", 1)
        self.assertTrue(wait_for(lambda: "destroyed" in self.output(0), DEADLINE_S),
                        self.output(0))
        later = self.later_record(0, 3)
        self.assertEqual(later["pending"], [])
        self.assertIn(" in <module>", later["frames"][-1])

    def test_the_last_record_of_an_exiting_rank_says_so_and_keeps_its_call(self):
        # Records every 2 s: rank 0 leaves its recv and exits between two of them, so only a
        # record made at exit can tell mcprun that the recv it caught pending is no stall.
        self.start_ranks("exit_after_recv", 2, MCPRUN_PROGRESS_INTERVAL_S="2")
        caught = self.record(0, lambda record: record["pending"])
        self.assertNotIn("exiting", caught)
        self.assertEqual(self.procs[0].wait(timeout=DEADLINE_S), 0, self.output(0))
        self.assertIn("received", self.output(0))
        last = json.loads(self.store.get("mcprun/progress/0"))
        self.assertIs(last.get("exiting"), True, last)
        self.assertGreater(last["n"], caught["n"])
        self.assertEqual([entry["op"] for entry in last["pending"]], ["recv"])

    def store_in_its_own_process(self):
        """(its process, its port): a job store this test can stop or kill, and a client to it."""
        server = subprocess.Popen([PYTHON, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        self.procs.append(server)
        port = int(server.stdout.readline())
        self.store = dist.TCPStore("127.0.0.1", port, None, False,
                                   datetime.timedelta(seconds=DEADLINE_S), wait_for_workers=False)
        return server, port

    def exit_with_the_store_stalled(self, scenario, **env):
        """Stops the job store (SIGSTOP) once the rank's reporter has sent it a record (on torch
        2.x it then waits for the answer to its dump check), lets the rank exit, freeing a big
        model slowly, and has the store answer again STORE_STALL_S later, with the interpreter
        finalising. The thread must not come back from torch's store client then: the process
        would abort."""
        server, port = self.store_in_its_own_process()
        self.start_ranks(scenario, 1, MASTER_PORT=str(port),
                         TORCH_FR_DUMP_TEMP_FILE=os.path.join(self.tmp, "fr_"), **env)
        source = "flight_recorder" if TORCH2 else "stack"  # 2.x: each record asks for a dump.
        self.record(0, lambda record: record["source"] == source)
        os.kill(server.pid, signal.SIGSTOP)
        self.assertTrue(wait_for(lambda: unread_bytes(port) > 0, DEADLINE_S))
        open(os.path.join(self.tmp, "exit"), "w").close()
        self.assertTrue(wait_for(lambda: "exiting" in self.output(0), DEADLINE_S), self.output(0))
        time.sleep(STORE_STALL_S)
        os.kill(server.pid, signal.SIGCONT)
        code = self.procs[1].wait(timeout=DEADLINE_S)
        self.assertNotIn("terminate called", self.output(0))
        self.assertEqual(code, 0, self.output(0))

    def test_a_rank_exits_cleanly_while_its_reporter_waits_on_a_stalled_store(self):
        self.exit_with_the_store_stalled("slow_teardown")

    def test_a_rank_exits_cleanly_after_its_store_host_went_away(self):
        # A static multi-node job whose first node (the store's host) finished first.
        server, port = self.store_in_its_own_process()
        self.start_ranks("slow_teardown", 1, MASTER_PORT=str(port))
        self.record(0)
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=DEADLINE_S)
        open(os.path.join(self.tmp, "exit"), "w").close()
        code = self.procs[1].wait(timeout=DEADLINE_S)
        self.assertNotIn("terminate called", self.output(0))
        self.assertEqual(code, 0, self.output(0))

    def test_a_reporter_that_starts_as_the_program_ends_is_still_waited_for_at_exit(self):
        # The program ends before the reporter's thread, which looks for torch.distributed every
        # 2 s, has begun; the thread reports while the program's own exit handler runs.
        self.exit_with_the_store_stalled("exit_handler_waits", MCPRUN_PROGRESS_INTERVAL_S="2")

    def test_exit_waits_for_a_destructor_the_collector_runs_on_the_reporters_thread(self):
        # The collector runs on the thread that allocates; a torch object freed there releases
        # the GIL in its destructor, and coming back once the interpreter finalises aborts.
        self.start_ranks("garbage_freed_by_the_reporter", 1)
        self.assertEqual(self.procs[0].wait(timeout=DEADLINE_S), 0, self.output(0))
        self.assertIn("exiting while the reporter frees garbage", self.output(0))
        self.assertTrue(os.path.exists(os.path.join(self.tmp, "freed")), self.output(0))

    def test_the_cpu_time_of_a_ranks_children_counts_as_its_own(self):
        self.start_ranks("busy_child", 1)
        pid = self.record(0)["pid"]

        def own_cpu_s():  # The rank's process alone, without its children.
            fields = proc_stat(pid)
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        # The rank itself sleeps, so what a record counts beyond its own CPU time is its child's.
        # That grows as fast as the box lets the child run, a twentieth of a CPU on a loaded one
        # (0.21 s in 4 s): wait for the amount, not for a clock.
        self.record(0, lambda record: record["cpu_s"] - own_cpu_s() > 0.3)

    def test_the_users_sitecustomize_still_runs_and_the_program_sees_no_watch_variable(self):
        user_site = os.path.join(self.tmp, "user_site")
        os.makedirs(user_site)
        with open(os.path.join(user_site, "sitecustomize.py"), "w") as f:
            f.write("print('user sitecustomize ran', flush=True)\n")
        self.start_ranks("single", 1,
                         PYTHONPATH=os.pathsep.join([os.path.join(REPO, "worker_helper"), user_site]))
        self.assertEqual(self.record(0)["rank"], 0)
        out = self.output(0)
        self.assertIn("user sitecustomize ran", out)
        self.assertIn(f"sitecustomize: {os.path.join(user_site, 'sitecustomize.py')}", out)
        self.assertIn("watch in program: None", out)
        self.assertIn("watch in child: None", out)

    def test_an_error_in_the_users_sitecustomize_reads_as_it_would_without_mcprun(self):
        user_site = os.path.join(self.tmp, "user_site")
        os.makedirs(user_site)
        with open(os.path.join(user_site, "sitecustomize.py"), "w") as f:
            f.write("raise RuntimeError('broken user sitecustomize')\n")
        program = ["-c", "import sys; print('program ran', 'sitecustomize' in sys.modules)"]

        def run(*path):
            env = dict(self.env, PYTHONPATH=os.pathsep.join(path), MCPRUN_COLLECTIVE_WATCH="1")
            return subprocess.run([PYTHON, *program], env=env, capture_output=True, text=True,
                                  timeout=30)
        alone, ours = run(user_site), run(os.path.join(REPO, "worker_helper"), user_site)
        self.assertIn("Error in sitecustomize", alone.stderr)
        self.assertEqual((ours.returncode, ours.stdout, ours.stderr),
                         (alone.returncode, alone.stdout, alone.stderr))

    def test_a_flight_recorder_size_the_user_set_is_kept(self):
        self.start_ranks("single", 1, TORCH_FR_BUFFER_SIZE="77")
        self.assertTrue(wait_for(lambda: "ready" in self.output(0), DEADLINE_S), self.output(0))
        self.assertIn("fr buffer: 77", self.output(0))
        if TORCH2:
            self.assertIn("fr entries: 77", self.output(0))

    def test_without_a_size_from_the_user_the_flight_recorder_gets_ours(self):
        self.start_ranks("single", 1)
        self.assertTrue(wait_for(lambda: "ready" in self.output(0), DEADLINE_S), self.output(0))
        self.assertIn("fr buffer: 256", self.output(0))
        if TORCH2:
            # Set at interpreter start, it sizes the recorder that torch creates much later.
            self.assertIn("fr entries: 256", self.output(0))
            self.record(0, lambda r: r["source"] == "flight_recorder" and r["completed"] >= 300)


if __name__ == "__main__":
    unittest.main()
