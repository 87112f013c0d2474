"""End-to-end tests of mcprun with real processes, signals and Debian's torch over gloo."""
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from harness import MCPRUN, PYTHON, REPO, TORCH2, TORCHRUN, TORCH_VERSION, LauncherTestCase, alive, wait_for
import fake_sysfs

# A worker that records its pid, then behaves as $BEHAVIOUR_<local rank> says (default: sleep).
SHELL_WORKER = r'''
echo $$ > "$MCPRUN_TEST_DIR/pid.$LOCAL_RANK"
eval "behaviour=\${BEHAVIOUR_$LOCAL_RANK:-sleep 60}"
eval "$behaviour"
'''


class DistributedTraining(LauncherTestCase):
    def test_ddp_allreduce_over_gloo_at_four_ranks(self):
        code, out, err = self.run_mcprun("-n", "4", os.path.join(REPO, "examples/ddp_train.py"))
        self.assertEqual(code, 0, err)
        for rank in range(4):
            self.assertIn(f"[rank{rank}]:rank {rank}/4 local_rank {rank}: done, replicas in sync", out)
        self.assertIn("[rank0]:step  40", out)

    # Variables mcprun adds on purpose, beyond torchrun's (docs/worker-environment.md).
    MCPRUN_ONLY = {"MCPRUN_AGENT_SOCKET", "TORCHELASTIC_TIMER_FILE", "PYTHONPATH", "PYTHONFAULTHANDLER",
                   "TORCH_DIST_INIT_BARRIER",
                   # The collective watchdog's (docs/worker-environment.md).
                   "MCPRUN_COLLECTIVE_WATCH", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_FR_BUFFER_SIZE"}
    ASYNC_ERROR_HANDLING = ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING")

    def test_environment_matches_torchrun_variable_by_variable(self):
        self.assert_environment_matches_torchrun({})

    def test_exported_async_error_handling_reaches_workers_as_under_torchrun(self):
        # Either name exported, or both: each worker sees what the torchrun of its torch gives it.
        for exported in ({"NCCL_ASYNC_ERROR_HANDLING": "0"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"},
                         {"NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}):
            with self.subTest(exported=exported):
                mine = self.assert_environment_matches_torchrun(exported)
                for name, value in exported.items():
                    self.assertEqual(mine[name], value)

    def assert_environment_matches_torchrun(self, exported):
        """Runs the same 2-rank job under both launchers with `exported` added to the environment
        and compares every variable; returns rank 0's environment under mcprun."""
        env = {k: v for k, v in self.env.items() if k not in self.ASYNC_ERROR_HANDLING}
        env.update(exported)
        dump = self.script("dump_env.py", r'''
import json, os, sys
import torch.distributed as dist
env = dict(os.environ)
env["is_torchelastic_launched"] = str(dist.is_torchelastic_launched())
env["unbuffered"] = str(not sys.stdout.buffer.__class__.__name__ == "BufferedWriter")
with open(os.path.join(sys.argv[1], "env.%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(env, f)
''')
        ours = tempfile.mkdtemp(prefix="mcprun.", dir=self.tmp)
        theirs = tempfile.mkdtemp(prefix="torchrun.", dir=self.tmp)
        code, _, err = self.run_mcprun("--nproc_per_node", "2", "--max-restarts", "1", dump, ours, env=env)
        self.assertEqual(code, 0, err)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        # Debian's torch 1.13 on Python 3.11 crashes with torchrun's default redirects.
        subprocess.run([TORCHRUN, "--nproc_per_node", "2", "--max_restarts", "1",
                        "--master_port", str(port), "-r", "1", "-t", "1", dump, theirs],
                       env=env, check=True, capture_output=True, timeout=120)
        for rank in range(2):
            with open(os.path.join(ours, f"env.{rank}.json")) as f:
                mine = json.load(f)
            with open(os.path.join(theirs, f"env.{rank}.json")) as f:
                reference = json.load(f)
            # Ports and paths differ by design; each must still be there and well formed.
            self.assertTrue(mine.pop("MASTER_PORT").isdigit())
            reference.pop("MASTER_PORT")
            self.assertTrue(mine.pop("TORCHELASTIC_ERROR_FILE").endswith(f"/attempt_0/{rank}/error.json"))
            reference.pop("TORCHELASTIC_ERROR_FILE")
            self.assertEqual(mine.pop("TORCHELASTIC_USE_AGENT_STORE"), "True")  # Both host the store.
            self.assertEqual(reference.pop("TORCHELASTIC_USE_AGENT_STORE"), "True")
            if not TORCH2:  # torchrun 2.x's variables, which mcprun sets for every torch.
                self.assertEqual(mine.pop("TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
            for name in self.MCPRUN_ONLY:
                mine.pop(name, None)
                reference.pop(name, None)
            if rank == 0:
                rank0 = dict(mine)
            for name in sorted(set(mine) | set(reference)):
                self.assertEqual(mine.get(name), reference.get(name), f"{name} (torch {TORCH_VERSION})")
        return rank0

    def test_a_taken_port_gets_a_hint_naming_its_holder(self):
        # The script serves a store on a port (as init_method="tcp://..." does on rank 0) that
        # another process, here the test, holds: torch's real error, then the hint.
        own_store = self.script("own_store.py", r'''
import datetime, os
import torch.distributed as dist
dist.TCPStore("127.0.0.1", int(os.environ.get("STORE_PORT", os.environ["MASTER_PORT"])), 1, True,
              timeout=datetime.timedelta(seconds=5))
''')
        summary = os.path.join(self.tmp, "summary.json")
        with socket.socket() as held:
            held.bind(("0.0.0.0", 0))
            held.listen()
            port = held.getsockname()[1]
            code, _, err = self.run_mcprun("-n", "1", "--summary-json", summary, own_store,
                                           env=dict(self.env, STORE_PORT=str(port)))
        self.assertEqual(code, 1, err)
        hint = f"port {port} is held by pid {os.getpid()} (python"
        self.assertIn("  hint:       " + hint, err)
        with open(summary) as f:
            self.assertTrue(json.load(f)["hint"].startswith(hint))
        if not TORCH2:  # torch 2.x ignores the failure under mcprun's (and torchrun's) agent store.
            code, _, err = self.run_mcprun("-n", "1", own_store)
            self.assertEqual(code, 1, err)
            self.assertRegex(err, r"  hint:       MASTER_PORT \d+ is where mcprun serves the job's store")

    def test_report_shows_the_recorded_python_traceback(self):
        failing = self.script("failing.py", r'''
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("bad shard 17")
    import time; time.sleep(60)

main()
''')
        code, _, err = self.run_mcprun("-n", "2", failing)
        self.assertEqual(code, 1, err)
        self.assertIn("rank:       1 (local rank 1)", err)
        self.assertIn("bad shard 17", err)
        self.assertIn("traceback:", err)
        self.assertIn('raise ValueError("bad shard 17")', err)


class Supervision(LauncherTestCase):
    def shell(self, *args, nproc=4, extra_env=None, **kwargs):
        env = dict(self.env, **(extra_env or {}))
        return self.start("-n", str(nproc), *args, "--no-python", "/bin/sh", "-c", SHELL_WORKER,
                          env=env, **kwargs)

    def test_first_failure_stops_everyone(self):
        # The others would wait 300 s: only mcprun's SIGTERM, which each records, ends them in time.
        waiter = ('trap \'echo TERM > "$MCPRUN_TEST_DIR/term.$LOCAL_RANK"; exit 143\' TERM; '
                  'touch "$MCPRUN_TEST_DIR/ready.$LOCAL_RANK"; sleep 300 & wait')
        # Rank 2 fails once the others are ready to record the stop.
        failing = ('for i in $(seq 400); do [ -e "$MCPRUN_TEST_DIR/ready.0" ] && [ -e "$MCPRUN_TEST_DIR/ready.1" ] && '
                   '[ -e "$MCPRUN_TEST_DIR/ready.3" ] && break; sleep 0.05; done; '
                   'echo "rank two gives up" >&2; exit 7')
        proc = self.shell(extra_env={"BEHAVIOUR_0": waiter, "BEHAVIOUR_1": waiter, "BEHAVIOUR_3": waiter,
                                     "BEHAVIOUR_2": failing})
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 7, err)
        self.assertEqual(self.files("term."), ["term.0", "term.1", "term.3"], err)
        self.assertEqual([p for p in self.pids() if alive(p)], [])
        self.assertIn("rank:       2 (local rank 2)", err)
        self.assertIn("exit code 7", err)
        self.assertIn("rank two gives up", err)
        self.assertIn("Stopped by mcprun: rank(s) 0,1,3", err)

    def test_sigkill_of_the_launcher_takes_every_worker_along(self):
        # Each worker also starts a child of its own: PDEATHSIG alone would not reach it.
        proc = self.shell(extra_env={f"BEHAVIOUR_{r}": 'sleep 60 & echo $! > "$MCPRUN_TEST_DIR/pid.child.$LOCAL_RANK"; wait'
                                     for r in range(4)})
        self.assertTrue(wait_for(lambda: len(self.files("pid.child.")) == 4 and len(self.pids()) == 8, 20),
                        "workers did not start")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        self.assertTrue(wait_for(lambda: not any(alive(p) for p in self.pids()), 5),
                        "a worker survived its launcher")

    def test_grandchildren_left_behind_are_killed(self):
        worker = ('setsid sleep 300 & echo $! > "$MCPRUN_TEST_DIR/pid.grandchild.$LOCAL_RANK"; '
                  'sleep 300 & echo $! >> "$MCPRUN_TEST_DIR/pid.grandchild.$LOCAL_RANK"; exit 0')
        code = self.shell(nproc=2, extra_env={"BEHAVIOUR_0": worker, "BEHAVIOUR_1": worker})
        code.communicate(timeout=30)
        self.assertEqual(code.returncode, 0)
        self.assertEqual(len(self.pids()), 6)
        self.assertEqual([p for p in self.pids() if alive(p)], [])

    def test_sigint_reaches_workers_and_exits_130(self):
        waiter = ('trap \'echo INT > "$MCPRUN_TEST_DIR/saw.$LOCAL_RANK"; exit 0\' INT; '
                  'touch "$MCPRUN_TEST_DIR/ready.$LOCAL_RANK"; while :; do sleep 0.05; done')
        proc = self.shell(nproc=3, extra_env={f"BEHAVIOUR_{r}": waiter for r in range(3)})
        self.assertTrue(wait_for(lambda: len(self.files("ready.")) == 3, 20))
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 130)
        self.assertEqual(self.files("saw."), ["saw.0", "saw.1", "saw.2"])

    def test_worker_ignoring_sigterm_is_killed_after_the_grace_period(self):
        stubborn = ('trap "" TERM; touch "$MCPRUN_TEST_DIR/ready"; '
                    'while :; do sleep 0.05; done')
        proc = self.shell("--term-timeout", "1", nproc=2,
                          extra_env={"BEHAVIOUR_0": stubborn,
                                     "BEHAVIOUR_1": 'while [ ! -f "$MCPRUN_TEST_DIR/ready" ]; do '
                                                    'sleep 0.05; done; exit 3'})
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 3, err)
        self.assertIn("sending SIGKILL", err)
        self.assertGreaterEqual(time.monotonic() - started, 1.0)
        self.assertEqual([p for p in self.pids() if alive(p)], [])

    def test_restarts_bump_the_restart_count(self):
        flaky = ('echo "$TORCHELASTIC_RESTART_COUNT" >> "$MCPRUN_TEST_DIR/attempts"; '
                 '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ] || exit 5')
        proc = self.shell("--max-restarts", "2", nproc=2,
                          extra_env={"BEHAVIOUR_0": "exit 0", "BEHAVIOUR_1": flaky})
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        with open(os.path.join(self.tmp, "attempts")) as f:
            self.assertEqual(f.read().split(), ["0", "1"])
        self.assertIn("restarting the worker group (1 of 2 restarts)", err)

    def test_workers_are_fresh_processes_with_a_clean_slate(self):
        probe = self.script("probe.py", r'''
import json, os, signal, sys
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
info = {"pgid_is_self": os.getpgid(0) == os.getpid(),
        "blocked": status["SigBlk"].strip(), "ignored": status["SigIgn"].strip(),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "argv0": sys.argv[0], "unbuffered": sys.flags.unbuffered if hasattr(sys.flags, "unbuffered") else None}
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "probe.%s" % os.environ["LOCAL_RANK"]), "w") as f:
    json.dump(info, f)
''')
        code, _, err = self.run_mcprun("-n", "2", probe)
        self.assertEqual(code, 0, err)
        for rank in range(2):
            with open(os.path.join(self.tmp, f"probe.{rank}")) as f:
                info = json.load(f)
            self.assertTrue(info["pgid_is_self"])
            self.assertEqual(info["blocked"], "0000000000000000")
            self.assertEqual(info["fds"][:3], [0, 1, 2])
            self.assertLessEqual(len(info["fds"]), 4)  # 0-2 plus the listing's own fd


    def test_job_timeout_stops_the_group_with_its_own_exit_code(self):
        proc = self.shell("--timeout", "1", "--term-timeout", "1", nproc=2)
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        self.assertEqual(proc.returncode, 124, err)
        self.assertLess(time.monotonic() - started, 5)
        self.assertIn("the job ran past --timeout 1 s", err)
        self.assertEqual([p for p in self.pids() if alive(p)], [])


class OutputAndLogs(LauncherTestCase):
    def test_prefix_filter_and_log_dir(self):
        logs = os.path.join(self.tmp, "logs")
        code, out, err = self.run_mcprun(
            "-n", "3", "--local-ranks-filter", "0,2", "--log-dir", logs, "--rdzv-id", "job9",
            "--no-python", "/bin/sh", "-c", 'echo "out of $RANK"; echo "err of $RANK" >&2')
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()), ["[rank0]:out of 0", "[rank2]:out of 2"])
        self.assertIn("[rank2]:err of 2", err)
        self.assertNotIn("[rank1]", out + err)
        [run_dir] = os.listdir(logs)
        self.assertTrue(run_dir.startswith("mcprun_job9_"))
        with open(os.path.join(logs, run_dir, "attempt_0", "1", "stdout.log")) as f:
            self.assertEqual(f.read(), "out of 1\n")

    def test_redirects_send_streams_to_files_only(self):
        logs = os.path.join(self.tmp, "logs")
        code, out, err = self.run_mcprun("-n", "2", "-r", "1", "--log-dir", logs, "--no-python",
                                         "/bin/sh", "-c", 'echo "hidden $RANK"; echo "shown" >&2')
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "")
        self.assertEqual(err.count("shown"), 2)

    def test_lines_never_interleave(self):
        code, out, err = self.run_mcprun(
            "-n", "4", "--no-python", PYTHON, "-c",
            "import os,sys\nr=os.environ['RANK']\nfor i in range(2000): sys.stdout.write(r*100+'\\n')")
        self.assertEqual(code, 0, err)
        lines = out.splitlines()
        self.assertEqual(len(lines), 8000)
        for line in lines:
            rank = line[5]
            self.assertEqual(line, f"[rank{rank}]:" + rank * 100)


class GpuPinning(LauncherTestCase):
    # What a GPU script's set_device(int(os.environ["LOCAL_RANK"])) would select, per rank.
    REPORT_DEVICE = ("import os; visible = os.environ['CUDA_VISIBLE_DEVICES'].split(','); "
                     "print(os.environ['LOCAL_RANK'], ','.join(visible), "
                     "visible[int(os.environ['LOCAL_RANK'])], os.environ['CUDA_DEVICE_ORDER'], "
                     "sorted(os.sched_getaffinity(0)))")

    def setUp(self):
        super().setUp()
        root = os.path.join(self.tmp, "sys")
        fake_sysfs.make_tree(root, [
            dict(bus_id="0000:1a:00.0", numa_node=0, local_cpulist="0", switch="0000:16:00.0"),
            dict(bus_id="0000:3b:00.0", numa_node=1, local_cpulist="1", switch="0000:3a:00.0"),
            dict(bus_id="0000:5e:00.0", numa_node=0, local_cpulist="0", switch="0000:5d:00.0"),
            dict(bus_id="0000:86:00.0", numa_node=1, local_cpulist="1", switch="0000:85:00.0"),
        ])
        self.env = dict(self.env, MCPRUN_SYSFS_ROOT=root)

    def devices(self, *flags, env=None):
        """Per rank: (LOCAL_RANK, CUDA_VISIBLE_DEVICES, the device cuda:LOCAL_RANK is, order, cpus)."""
        code, out, err = self.run_mcprun(*flags, "--no-python", PYTHON, "-c", self.REPORT_DEVICE,
                                         env=env)
        self.assertEqual(code, 0, err)
        return {int(line[5]): line.split(":", 1)[1].split(" ", 4) for line in out.splitlines()}

    def test_cuda_local_rank_is_each_ranks_gpu_in_topology_order(self):
        ranks = self.devices("-n", "4", "--bind", "numa")
        # NUMA node 0's GPUs (PCI indices 0 and 2) first, then node 1's; cuda:LOCAL_RANK picks one.
        self.assertEqual(ranks, {
            0: ["0", "0,2,1,3", "0", "PCI_BUS_ID", "[0]"], 1: ["1", "0,2,1,3", "2", "PCI_BUS_ID", "[0]"],
            2: ["2", "0,2,1,3", "1", "PCI_BUS_ID", "[1]"], 3: ["3", "0,2,1,3", "3", "PCI_BUS_ID", "[1]"]})
        code, out, _ = self.run_mcprun("topo")
        self.assertEqual(code, 0)
        self.assertIn("every worker: CUDA_VISIBLE_DEVICES=0,2,1,3", out)
        self.assertIn("local rank 1 -> cuda:1 = 0000:5e:00.0", out)
        code, _, err = self.run_mcprun("-n", "5", "--no-python", "/bin/true")
        self.assertEqual(code, 2)
        self.assertIn("--no-pin", err)

    def test_a_subset_of_gpus_is_still_indexed_by_local_rank(self):
        for flags, env, chosen in (
                (["--gpus", "3,0"], None, ["0", "3"]),
                ([], dict(self.env, CUDA_VISIBLE_DEVICES="1,2"), ["2", "1"]),
                (["--gpus", "1,2,3"], None, ["2", "1"])):
            ranks = self.devices("-n", "2", *flags, env=env)
            self.assertEqual([ranks[r][2] for r in range(2)], chosen, (flags, env))
            self.assertEqual({ranks[r][1] for r in range(2)}, {",".join(chosen)}, (flags, env))

    def test_numa_binding_sets_each_workers_cpus_from_the_cpu_tree(self):
        # Two sockets of one single-threaded core each: the CPUs this 2-core machine really has,
        # so the affinity the workers report is the one mcprun set.
        fake_sysfs.make_cpu_tree(self.env["MCPRUN_SYSFS_ROOT"], sockets=2, nodes_per_socket=1,
                                 cores_per_node=1, threads_per_core=1, cores_per_l3=1)
        for mode in ("node", "socket", "core-complex"):
            ranks = self.devices("-n", "4", "--numa-binding", mode)
            self.assertEqual({r: ranks[r][4] for r in ranks}, {0: "[0]", 1: "[0]", 2: "[1]", 3: "[1]"}, mode)
        # Two GPUs per NUMA node but one core each: no disjoint core sets, one clear line.
        code, _, err = self.run_mcprun("-n", "4", "--numa-binding", "exclusive", "--no-python", "/bin/true")
        self.assertEqual(code, 2, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn("--numa-binding exclusive", err)

    def test_virtual_local_rank_shows_each_worker_only_its_gpu(self):
        ranks = self.devices("-n", "4", "--virtual-local-rank")
        self.assertEqual({r: ranks[r][:3] for r in ranks},
                         {0: ["0", "0", "0"], 1: ["0", "2", "2"], 2: ["0", "1", "1"], 3: ["0", "3", "3"]})


    UUIDS = {"0000:1a:00.0": "GPU-1a1a1a1a-0000-4000-8000-000000000001",
             "0000:3b:00.0": "GPU-3b3b3b3b-0000-4000-8000-000000000002",
             "0000:5e:00.0": "GPU-5e5e5e5e-0000-4000-8000-000000000003",
             "0000:86:00.0": "GPU-86868686-0000-4000-8000-000000000004"}

    def with_driver(self, processes=""):
        """The driver's /proc files for the fake GPUs, and a stand-in NVML on the library path
        that logs each load; returns (environment, the NVML log)."""
        nvml_log = os.path.join(self.tmp, "nvml.log")
        folder = fake_sysfs.build_fake_nvml(os.path.join(self.tmp))
        env = dict(self.env, MCPRUN_PROC_ROOT=fake_sysfs.make_driver_tree(self.tmp, self.UUIDS),
                   LD_LIBRARY_PATH=folder, FAKE_NVML_LOG=nvml_log, FAKE_NVML_BUS_ID="00000000:1A:00.0",
                   FAKE_NVML_PROCESSES=processes)
        return env, nvml_log

    def test_uuids_come_from_the_drivers_proc_files_and_a_launch_never_loads_nvml(self):
        env, nvml_log = self.with_driver()
        ranks = self.devices("-n", "4", env=env)
        order = [self.UUIDS[bus] for bus in ("0000:1a:00.0", "0000:5e:00.0", "0000:3b:00.0", "0000:86:00.0")]
        self.assertEqual({r: ranks[r][:3] for r in ranks},
                         {r: [str(r), ",".join(order), order[r]] for r in range(4)})
        code, out, _ = self.run_mcprun("topo", env=env)
        self.assertEqual(code, 0)
        self.assertIn("uuid GPU-5e5e5e5e-0000-4000-8000-000000000003", out)
        self.assertFalse(os.path.exists(nvml_log), "a launch or topo loaded NVML")

    def test_out_of_memory_hint_lists_the_other_processes_on_the_gpu_from_nvml(self):
        # A rank that fails as torch 2.x does when its GPU is full, while the test's own process
        # holds 8 GiB on that GPU as another job would.
        env, nvml_log = self.with_driver(f"{os.getpid()}:{8 << 30}")
        oom = ("import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
               "400.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 139.29 GiB is free.', "
               "file=sys.stderr); sys.exit(1)")
        summary = os.path.join(self.tmp, "summary.json")
        code, _, err = self.run_mcprun("-n", "1", "--summary-json", summary, "--no-python", PYTHON, "-c",
                                       oom, env=env)
        self.assertEqual(code, 1, err)
        hint = ("rank 0 ran out of memory on its cuda:0, GPU 0000:1a:00.0 "
                "(GPU-1a1a1a1a-0000-4000-8000-000000000001), asking for 400.00 GiB; other processes "
                f"hold memory on it (NVML), another job on a shared GPU: pid {os.getpid()} (python")
        self.assertIn("  hint:       " + hint, err)
        with open(summary) as f:
            self.assertTrue(json.load(f)["hint"].startswith(hint))
        with open(nvml_log) as f:
            self.assertEqual(f.read(), "nvmlInit_v2\n")  # Once, for the hint.


class BadInput(LauncherTestCase):
    def test_each_gets_one_line_and_exit_code_2(self):
        script = self.script("t.py", "pass\n")
        cases = [["--bogus", script], ["-n", "0", script], ["-n", "-1", script],
                 ["-n", "2", os.path.join(self.tmp, "missing.py")], ["-r", "0:7", script],
                 ["--nproc-per-node", "gpu", script]]
        for args in cases:
            code, out, err = self.run_mcprun(*args)
            self.assertEqual(code, 2, (args, err))
            self.assertEqual(len(err.strip().splitlines()), 1, (args, err))
            self.assertTrue(err.startswith("mcprun: error: "), err)

    def test_standalone_is_one_node(self):
        worker = ["--no-python", "/bin/sh", "-c", 'touch "$MCPRUN_TEST_DIR/ran.$RANK"']
        for nnodes in ("2", "1:2"):
            code, _, err = self.run_mcprun("--standalone", "--nnodes", nnodes, *worker)
            self.assertEqual(code, 2, err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
            self.assertIn(f"error: --standalone is a one-node job, but --nnodes {nnodes}", err)
        self.assertEqual(self.files("ran."), [])
        for nnodes in ("1", "1:1"):  # As torchrun's docs write it, and its MIN:MAX form.
            code, _, err = self.run_mcprun("--standalone", "--nnodes", nnodes, "-n", "2", *worker)
            self.assertEqual(code, 0, err)
        self.assertEqual(self.files("ran."), ["ran.0", "ran.1"])

    def under_nofile_limit(self, soft, hard, *args):
        """mcprun started with RLIMIT_NOFILE soft:hard, as `ulimit -Sn soft -Hn hard` leaves it."""
        done = subprocess.run(["prlimit", f"--nofile={soft}:{hard}", MCPRUN, *args], env=self.env,
                              capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout, done.stderr

    def test_more_workers_than_the_open_file_limit_holds_are_refused_before_any_starts(self):
        worker = ["--no-python", "/bin/sh", "-c", 'touch "$MCPRUN_TEST_DIR/ran.$LOCAL_RANK"']
        code, _, err = self.under_nofile_limit(256, 256, "-n", "200", *worker)
        self.assertEqual(code, 2, err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertRegex(err, r"^mcprun: error: -n 200 needs up to \d+ open files in mcprun, more "
                              r"than its limit of 256 \(ulimit -n, raised to the hard limit, "
                              r"ulimit -Hn\)")
        self.assertEqual(self.files("ran."), [])
        # The soft limit is raised to the hard one at startup: 100 ranks need more than 64.
        code, _, err = self.under_nofile_limit(64, 4096, "-n", "100", *worker)
        self.assertEqual(code, 0, err)
        self.assertEqual(len(self.files("ran.")), 100)

    @unittest.skipUnless(os.geteuid() == 0, "runs mcprun as nobody: needs root")
    def test_paths_the_user_may_not_write_name_the_folder_and_the_reason(self):
        # A folder that nobody may enter but not write in.
        os.chmod(self.tmp, 0o755)
        locked = os.path.join(self.tmp, "locked")
        os.mkdir(locked, 0o755)
        worker = ["-n", "1", "--no-python", "/bin/true"]
        cases = [(["--log-dir", f"{locked}/logs"],
                  f"--log-dir {locked}/logs: cannot create {locked}/logs: Permission denied"),
                 (["--log-dir", locked],
                  f"--log-dir {locked}: cannot create a run folder in {locked}: Permission denied"),
                 (["--summary-json", f"{locked}/ci/summary.json"],
                  f"--summary-json {locked}/ci/summary.json: "
                  f"cannot create {locked}/ci: Permission denied"),
                 (["--junit", f"{locked}/junit.xml"],
                  f"--junit {locked}/junit.xml: cannot write in {locked}: Permission denied")]
        for flags, line in cases:
            code, out, err = self.run_mcprun(*flags, *worker, user="nobody")
            self.assertEqual(code, 2, err)
            self.assertEqual(err.splitlines(), ["mcprun: error: " + line])
        self.assertEqual(os.listdir(locked), [])
        # A file where the folder should be, for any user; a missing folder is made.
        blocked = self.script("blocked", "")
        code, _, err = self.run_mcprun("--summary-json", f"{blocked}/summary.json", *worker)
        self.assertEqual(code, 2, err)
        self.assertEqual(err.splitlines(), [f"mcprun: error: --summary-json {blocked}/summary.json:"
                                            f" cannot write in {blocked}: Not a directory"])
        code, _, err = self.run_mcprun("--junit", f"{self.tmp}/new/dir/junit.xml", *worker)
        self.assertEqual(code, 0, err)
        self.assertTrue(os.path.exists(f"{self.tmp}/new/dir/junit.xml"))

    def test_dry_run_starts_nothing(self):
        script = self.script("t.py", "open(__import__('os').environ['MCPRUN_TEST_DIR'] + '/ran', 'w')\n")
        code, out, err = self.run_mcprun("-n", "2", "--dry-run", script, "--lr", "1")
        self.assertEqual(code, 0, err)
        self.assertIn("local rank 1 (rank 1)", out)
        self.assertIn("WORLD_SIZE=2", out)
        self.assertIn(f"-u {script} --lr 1", out)
        code, out, err = self.run_mcprun("-n", "1", "--nccl-debug", "--dry-run", script)
        self.assertEqual(code, 0, err)
        for line in ("NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", "TORCH_DISTRIBUTED_DEBUG=DETAIL"):
            self.assertIn(line, out)
        self.assertEqual(self.files("ran"), [])

    def test_dry_run_prints_the_environment_a_worker_gets(self):
        dump = self.script("dump_env.py", r'''
import json, os, sys
with open(os.path.join(sys.argv[1], "env.%s.json" % os.environ["LOCAL_RANK"]), "w") as f:
    json.dump(dict(os.environ), f)
''')
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = ["-n", "2", "--master-port", str(port), "--nccl-debug",
                "--log-dir", os.path.join(self.tmp, "logs"), dump, self.tmp]
        code, out, err = self.run_mcprun("--dry-run", *args)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.files("env."), [])
        planned, rank = {}, None  # local rank -> the variables the dry run lists for it
        for line in out.splitlines():
            if line.startswith("local rank "):
                rank = int(line.split()[2])
                planned[rank] = {}
            elif line.startswith("    ") and rank is not None:
                name, _, value = line.strip().partition("=")
                planned[rank][name] = value
        code, _, err = self.run_mcprun(*args)
        self.assertEqual(code, 0, err)
        for rank in range(2):
            with open(os.path.join(self.tmp, f"env.{rank}.json")) as f:
                real = json.load(f)
            for name in ("TORCHELASTIC_TIMER_FILE", "MCPRUN_AGENT_SOCKET", "PYTHONPATH", "NCCL_DEBUG_FILE"):
                self.assertIn(name, planned[rank])
            # Each listed value is the worker's, but for the run's folder, which a dry run never makes.
            # The worker's sitecustomize takes the reporter's switch out as it starts the reporter,
            # and arms torch's Flight Recorder itself, before torch is imported.
            self.assertEqual(planned[rank].pop("MCPRUN_COLLECTIVE_WATCH"), "1")
            self.assertNotIn("MCPRUN_COLLECTIVE_WATCH", real)
            self.assertEqual(real.pop("TORCH_FR_BUFFER_SIZE"), "256")
            for name, value in planned[rank].items():
                before, placeholder, after = value.partition("<run dir>")
                got = real.get(name, "<unset>")
                if placeholder:
                    self.assertTrue(got.startswith(before) and got.endswith(after) and
                                    len(got) > len(before) + len(after), (name, value, got))
                else:
                    self.assertEqual(got, value, name)
            # And every variable mcprun set or changed for the worker is listed.
            changed = {name for name, value in real.items() if self.env.get(name) != value}
            changed.discard("LC_CTYPE")  # Python's own locale coercion (PEP 538), not mcprun's.
            self.assertEqual(changed - set(planned[rank]), set())
