"""torchrun 2.x's command line against mcprun: PyTorch's own launcher tests
(test/distributed/launcher/test_run.py) with the same flags, and torchrun's habits users rely on:
argparse abbreviations, a quoted --rdzv-conf, --signals-to-handle with SIGUSR1, the static
backend's --rdzv-endpoint and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE."""
import os
import signal
import socket
import uuid

from harness import LauncherTestCase, wait_for

# torch's bin/test_script.py: each worker touches a file named for its global rank, or fails.
TOUCH_SCRIPT = r'''
import argparse, os, sys
parser = argparse.ArgumentParser()
parser.add_argument("--touch-file-dir")
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "pid." + os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
if args.fail:
    raise RuntimeError("raising exception since --fail flag was set")
open(os.path.join(args.touch_file_dir, os.environ["RANK"]), "w").close()
'''

# torch's bin/test_script.sh: the same from bash, announcing the file it creates.
TOUCH_SHELL = r'''#!/bin/bash
echo $$ > "$MCPRUN_TEST_DIR/pid.sh.$RANK"
echo "creating $1/$RANK"
touch "$1/$RANK"
'''

# torch's bin/test_script_is_torchelastic_launched.py.
IS_LAUNCHED_SCRIPT = r'''
import argparse, os
import torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--out-file")
args = parser.parse_args()
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "pid.launched"), "w") as f:
    f.write(str(os.getpid()))
with open(args.out_file, "w") as out:
    out.write(str(dist.is_torchelastic_launched()))
'''

# torch's bin/test_script_init_method.py: init_process_group by the given method, one all_reduce.
INIT_METHOD_SCRIPT = r'''
import argparse, os
import torch, torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--init-method")
args = parser.parse_args()
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "pid.%d" % rank), "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo", init_method=args.init_method, world_size=world_size, rank=rank)
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
assert t.item() == world_size * (world_size + 1) / 2, t
dist.barrier()  # Leave together: torch 2.x may abort a teardown racing a departed peer.
dist.destroy_process_group()
print("rank %d: sum %d, %s:%s" % (rank, t.item(), os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]))
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchRunTests(LauncherTestCase):
    """PyTorch's test_run.py scenarios that are a command line, with the same flags."""

    def setUp(self):
        super().setUp()
        self.test_dir = os.path.join(self.tmp, "touched")
        os.makedirs(self.test_dir)
        self.touch_py = self.script("test_script.py", TOUCH_SCRIPT)
        self.touch_sh = self.script("test_script.sh", TOUCH_SHELL)
        os.chmod(self.touch_sh, 0o755)

    def assert_touched(self, world_size):
        self.assertSetEqual({str(i) for i in range(world_size)}, set(os.listdir(self.test_dir)))

    def launch_ok(self, *args, env=None):
        code, out, err = self.run_mcprun(*args, env=env)
        self.assertEqual(code, 0, err)
        return out, err

    def test_launch_user_script_python(self):
        self.launch_ok("--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={uuid.uuid4().int}",
                       "--monitor-interval=1", "--start-method=spawn", self.touch_py,
                       f"--touch-file-dir={self.test_dir}")
        self.assert_touched(4)

    def test_launch_user_script_python_caffe2_bc(self):
        self.launch_ok("--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1",
                       "--start-method=spawn", "--master-addr=localhost",
                       f"--master-port={free_port()}", "--node-rank=0", self.touch_py,
                       f"--touch-file-dir={self.test_dir}")
        self.assert_touched(4)

    def test_launch_user_script_bash(self):
        args = ["--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={uuid.uuid4().int}",
                "--monitor-interval=1", "--start-method=spawn", "--no-python"]
        # --no-python cannot be used with --module: torchrun's ValueError is mcprun's usage error.
        code, _, err = self.run_mcprun(*args, "--module", self.touch_sh, self.test_dir)
        self.assertEqual(code, 2, err)
        self.assertIn("--no-python", err)
        self.assertEqual(os.listdir(self.test_dir), [])
        self.launch_ok(*args, self.touch_sh, self.test_dir)
        self.assert_touched(4)

    def test_launch_user_script_default_nproc(self):
        self.launch_ok("--nnodes=1", f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
                       "--start-method=spawn", "--no-python", self.touch_sh, self.test_dir)
        self.assert_touched(1)

    def test_launch_with_env_vars(self):
        env = dict(self.env, PET_NNODES="1", PET_NPROC_PER_NODE="4",
                   PET_RDZV_ID=str(uuid.uuid4().int), PET_MONITOR_INTERVAL="1",
                   PET_START_METHOD="spawn", PET_NO_PYTHON="1", PET_MODULE="1")
        code, _, err = self.run_mcprun(self.touch_sh, self.test_dir, env=env)
        self.assertEqual(code, 2, err)
        env["PET_MODULE"] = "0"
        self.launch_ok(self.touch_sh, self.test_dir, env=env)
        self.assert_touched(4)

    def test_nproc_launch_number_configurations(self):
        self.launch_ok("--nnodes=1", "--nproc-per-node=4", f"--rdzv-id={uuid.uuid4().int}",
                       "--monitor-interval=1", "--start-method=spawn", "--no-python",
                       self.touch_sh, self.test_dir)
        self.assert_touched(4)

    def test_nproc_launch_auto_configurations(self):
        # No GPU: auto is the CPU count, as with torch.accelerator unavailable.
        env = dict(self.env, MCPRUN_SYSFS_ROOT=os.path.join(self.tmp, "no-sysfs"))
        self.launch_ok("--nnodes=1", "--nproc-per-node=auto", f"--rdzv-id={uuid.uuid4().int}",
                       "--monitor-interval=1", "--start-method=spawn", "--no-python",
                       self.touch_sh, self.test_dir, env=env)
        self.assert_touched(os.cpu_count())

    def test_nproc_launch_unknown_configurations(self):
        code, _, err = self.run_mcprun("--nnodes=1", "--nproc-per-node=unknown", "--no-python",
                                       self.touch_sh, self.test_dir)
        self.assertEqual(code, 2, err)
        self.assertIn("--nproc-per-node unknown", err)

    def test_nproc_xpu_launch_configurations(self):
        # torchrun counts Intel XPUs; mcprun pins NVIDIA GPUs only and says so.
        code, _, err = self.run_mcprun("--nnodes=1", "--nproc-per-node=xpu", "--no-python",
                                       self.touch_sh, self.test_dir)
        self.assertEqual(code, 2, err)
        self.assertIn("NVIDIA", err)
        self.assertEqual(os.listdir(self.test_dir), [])

    def test_launch_elastic(self):
        # The quotes reach mcprun as they reach torchrun's argparse: no shell strips them.
        self.launch_ok("--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                       f"--rdzv-endpoint=localhost:{free_port()}",
                       "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
                       f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1",
                       "--start-method=spawn", self.touch_py, f"--touch-file-dir={self.test_dir}")
        self.assert_touched(4)

    def test_launch_elastic_worker_raise_exception(self):
        code, _, err = self.run_mcprun(
            "--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=localhost:{free_port()}",
            "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'",
            f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1", "--max-restarts=0",
            "--start-method=spawn", self.touch_py, "--fail")
        self.assertEqual(code, 1, err)
        self.assertIn("raising exception since --fail flag was set", err)

    def test_launch_standalone(self):
        self.launch_ok("--nnodes=1", "--nproc-per-node=4", "--standalone", "--monitor-interval=1",
                       "--start-method=spawn", self.touch_py, f"--touch-file-dir={self.test_dir}")
        self.assert_touched(4)

    def test_launch_run_path(self):
        self.launch_ok("--run-path", "--nnodes=1", "--nproc-per-node=4", "--monitor-interval=1",
                       "--start-method=spawn", self.touch_py, f"--touch-file-dir={self.test_dir}")
        self.assert_touched(4)

    def test_launch_elastic_multiple_agents(self):
        args = ["--nnodes=1:2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=localhost:{free_port()}", "--rdzv_conf=timeout=5",
                f"--rdzv-id={uuid.uuid4().int}", "--monitor-interval=1", "--start-method=spawn",
                self.touch_py, f"--touch-file-dir={self.test_dir}"]
        first = self.start(*args)
        second = self.start(*args)
        for proc in (first, second):
            _, err = proc.communicate(timeout=120)
            self.assertEqual(proc.returncode, 0, err)
        self.assert_touched(8)

    def test_min_max_nodes_parse(self):
        code, _, err = self.run_mcprun("--nnodes=2:20:30", self.touch_py)
        self.assertEqual(code, 2, err)
        self.assertIn("--nnodes 2:20:30", err)

    def is_torchelastic_launched(self, *flags):
        script = self.script("test_script_is_torchelastic_launched.py", IS_LAUNCHED_SCRIPT)
        out_file = os.path.join(self.tmp, "out")
        self.launch_ok("--run-path", "--nnodes=1", "--nproc-per-node=1", "--monitor-interval=1",
                       *flags, script, f"--out-file={out_file}")
        with open(out_file) as fp:
            return fp.readline()

    def test_is_torchelastic_launched(self):
        self.assertEqual("True", self.is_torchelastic_launched())

    def test_is_torchelastic_launched_with_logs_spec_defined(self):
        self.assertEqual("True", self.is_torchelastic_launched("--logs_specs=default"))

    def test_logs_logs_spec_entrypoint_must_be_defined(self):
        code, _, err = self.run_mcprun("--run-path", "--nnodes=1", "--nproc-per-node=1",
                                       "--monitor-interval=1", "--logs_specs=DOESNOT_EXIST",
                                       self.touch_py)
        self.assertEqual(code, 2, err)
        self.assertIn("--logs-specs DOESNOT_EXIST", err)

    def init_method(self, method_for_port):
        script = self.script("test_script_init_method.py", INIT_METHOD_SCRIPT)
        port = free_port()
        out, _ = self.launch_ok("--run-path", "--nnodes=1", "--nproc-per-node=4",
                                "--master-addr=localhost", f"--master-port={port}",
                                "--monitor-interval=1", script,
                                f"--init-method={method_for_port(port)}")
        for rank in range(4):
            self.assertIn(f"rank {rank}: sum 10, localhost:{port}", out)

    def test_init_method_tcp_with_torchelastic(self):
        self.init_method(lambda port: f"tcp://localhost:{port}")

    def test_init_method_env_with_torchelastic(self):
        self.init_method(lambda port: "env://")

    def test_capture_logs_using_default_logs_specs(self):
        # "--redirect=3" is argparse's abbreviation of --redirects.
        env = dict(self.env, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]: ")
        out, err = self.launch_ok("--nnodes=1", "--nproc-per-node=4",
                                  f"--rdzv-id={uuid.uuid4().int}", "--redirect=3", "--tee=3",
                                  "--monitor-interval=1", "--start-method=spawn", "--no-python",
                                  self.touch_sh, self.test_dir, env=env)
        for i in range(4):
            self.assertIn(f"[rank{i}]: creating ", out)
        self.assertNotIn("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", err)  # Honoured, not warned of.


class TorchrunHabits(LauncherTestCase):
    """What users type with torchrun 2.x and expect to work the same under mcprun."""

    def test_sigusr1_is_forwarded_and_the_job_continues(self):
        worker = self.script("checkpointer.py", r'''
import os, signal, sys, time
d, rank = os.environ["MCPRUN_TEST_DIR"], os.environ["RANK"]
def checkpoint(signum, frame):
    with open(os.path.join(d, "checkpoint.%s" % rank), "w") as f:
        f.write("step saved")
signal.signal(signal.SIGUSR1, checkpoint)
with open(os.path.join(d, "pid.%s" % rank), "w") as f:
    f.write(str(os.getpid()))
open(os.path.join(d, "ready.%s" % rank), "w").close()
# Keep training until told to finish: the checkpoint must not have stopped us.
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(d, "finish")) and time.monotonic() < deadline:
    time.sleep(0.05)
print("rank %s finished after checkpoint=%s" % (rank, os.path.exists(os.path.join(d, "checkpoint.%s" % rank))))
''')
        # Unlisted too: the default list is torchrun's, and SIGUSR1 must still not end the job.
        proc = self.start("--nproc-per-node", "2", worker)
        self.assertTrue(wait_for(lambda: len(self.files("ready.")) == 2, 60), "workers never started")
        proc.send_signal(signal.SIGUSR1)
        self.assertTrue(wait_for(lambda: len(self.files("checkpoint.")) == 2, 30),
                        "SIGUSR1 did not reach every worker")
        self.assertIsNone(proc.poll(), "mcprun stopped on SIGUSR1")
        open(os.path.join(self.tmp, "finish"), "w").close()
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        for rank in range(2):
            self.assertIn(f"[rank{rank}]:rank {rank} finished after checkpoint=True", out)

    def test_unknown_signal_name_is_a_usage_error(self):
        code, _, err = self.run_mcprun("--signals-to-handle", "SIGTERM,SIGBOGUS", "true")
        self.assertEqual(code, 2, err)
        self.assertIn("SIGBOGUS", err)

    def test_log_line_prefix_template_on_the_console(self):
        worker = self.script("hello.py", 'import os; print("hello from", os.environ["RANK"])\n')
        env = dict(self.env, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="<${role_name}:${rank}/${local_rank}> ")
        code, out, err = self.run_mcprun("-n", "2", "--role", "trainer", worker, env=env)
        self.assertEqual(code, 0, err)
        self.assertIn("<trainer:0/0> hello from 0", out)
        self.assertIn("<trainer:1/1> hello from 1", out)
        self.assertNotIn("[rank0]:", out)
        self.assertNotIn("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", err)
        # Unset: mcprun's own prefix.
        code, out, err = self.run_mcprun("-n", "2", worker)
        self.assertEqual(code, 0, err)
        self.assertIn("[rank1]:hello from 1", out)

    def test_static_rdzv_endpoint_is_the_master(self):
        script = self.script("gloo.py", INIT_METHOD_SCRIPT)
        port = free_port()
        # --master-addr/--master-port lose to the endpoint, as in torchrun's get_rdzv_endpoint.
        out, err = self.run_ok("--nproc-per-node", "2", "--rdzv-backend", "static",
                               "--rdzv-endpoint", f"127.0.0.1:{port}", "--master-port",
                               str(free_port()), script, "--init-method=env://")
        for rank in range(2):
            self.assertIn(f"rank {rank}: sum 3, 127.0.0.1:{port}", out)
        self.assertIn("--master-port", err)  # One warning that it was ignored.

    def test_static_rdzv_endpoint_ipv6(self):
        script = self.script("gloo.py", INIT_METHOD_SCRIPT)
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
            port = s.getsockname()[1]
        out, _ = self.run_ok("--nproc-per-node", "2", "--rdzv-endpoint", f"[::1]:{port}", script,
                             "--init-method=env://")
        for rank in range(2):
            self.assertIn(f"rank {rank}: sum 3, ::1:{port}", out)

    def test_abbreviated_flags_and_quoted_rdzv_conf(self):
        worker = self.script("env.py", r'''
import os
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "pid." + os.environ["RANK"]), "w") as f:
    f.write(str(os.getpid()))
print("world", os.environ["WORLD_SIZE"], "restarts", os.environ["TORCHELASTIC_MAX_RESTARTS"],
      "role", os.environ["ROLE_NAME"])
''')
        out, err = self.run_ok("--nproc_per=2", "--max-rest", "1", "--rol=trainer",
                               "--rdzv-conf='join_timeout=5,last_call_timeout=1'", worker, "--nproc=9")
        self.assertIn("[rank1]:world 2 restarts 1 role trainer", out)
        code, _, err = self.run_mcprun("--rdzv=static", worker)
        self.assertEqual(code, 2, err)
        self.assertIn("ambiguous option: --rdzv could match", err)

    def test_torchrun_2_flags_are_accepted(self):
        worker = self.script("ok.py", "print('ran')\n")
        out, err = self.run_ok("--numa-binding", "node", "--virtual-local-rank",
                               "--event-log-handler", "null", "--logs-specs", "default",
                               "--shutdown-timeout", "5", "--signals_to_handle=SIGTERM,SIGINT",
                               worker)
        self.assertIn("ran", out)

    def run_ok(self, *args, env=None):
        code, out, err = self.run_mcprun(*args, env=env)
        self.assertEqual(code, 0, err)
        return out, err


if __name__ == "__main__":
    import unittest
    unittest.main()
