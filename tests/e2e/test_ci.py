"""End-to-end tests of mcprun in CI: --summary-json and --junit for every ending, the --config job
file, and plain output on a pipe, with the real binary and real processes."""
import json
import os
import pty
import select
import signal
import socket
import subprocess
import xml.etree.ElementTree as ElementTree

from harness import MCPRUN, REPO, LauncherTestCase, wait_for
from test_launcher import SHELL_WORKER
from test_stall import WORKER as TORCH_WORKER


class CiTestCase(LauncherTestCase):
    def setUp(self):
        super().setUp()
        self.summary_file = os.path.join(self.tmp, "out", "summary.json")
        self.junit_file = os.path.join(self.tmp, "out", "junit.xml")
        self.reports = ["--summary-json", self.summary_file, "--junit", self.junit_file]

    def shell(self, *flags, nproc=2, behaviour=None):
        """Starts mcprun on SHELL_WORKER, each local rank doing what `behaviour` says."""
        env = dict(self.env, **{f"BEHAVIOUR_{rank}": what for rank, what in (behaviour or {}).items()})
        return self.start(*self.reports, "-n", str(nproc), *flags, "--no-python", "/bin/sh", "-c",
                          SHELL_WORKER, env=env)

    def reports_of(self, proc, timeout=60):
        """Waits for mcprun; returns its exit code, output, the summary and the JUnit test suite."""
        out, err = proc.communicate(timeout=timeout)
        with open(self.summary_file) as f:
            summary = json.load(f)
        # Parsing fails on anything that is not well-formed XML 1.0: the escaping is tested here too.
        suite = ElementTree.parse(self.junit_file).getroot()
        return proc.returncode, out, err, summary, suite

    @staticmethod
    def cases(suite):
        return {case.get("name"): case for case in suite.iter("testcase")}


class Reports(CiTestCase):
    def test_a_failing_rank_is_the_root_cause_in_both_files(self):
        logs = os.path.join(self.tmp, "logs")
        fail = ('echo "loading shard 17"; printf \'odd: & <tag> "q" \\001\\033[31mred\\n\'; sleep 0.2; '
                'echo "ValueError: bad shard 17" >&2; exit 7')
        code, _, err, summary, suite = self.reports_of(self.shell("--log-dir", logs, behaviour={1: fail}))
        self.assertEqual(code, 7, err)
        cause = f"rank 1 on {socket.gethostname()} exited with exit code 7: ValueError: bad shard 17"
        self.assertEqual(summary["result"], "failed")
        self.assertEqual(summary["exit_code"], 7)
        self.assertEqual(summary["root_cause"], cause)
        self.assertEqual(summary["world_size"], 2)
        self.assertEqual(summary["restarts"], 0)
        self.assertEqual(summary["host"], socket.gethostname())
        self.assertGreater(summary["total_time_s"], 0)
        stopped, failed = summary["ranks"]
        self.assertEqual((failed["rank"], failed["local_rank"], failed["exit_code"]), (1, 1, 7))
        self.assertTrue(failed["root_cause"])
        self.assertFalse(failed["stalled"])
        with open(failed["log"]["stdout"]) as f:
            self.assertIn("loading shard 17", f.read())
        with open(failed["log"]["stderr"]) as f:
            self.assertIn("ValueError: bad shard 17", f.read())
        self.assertEqual(stopped["signal"], {"name": "SIGTERM", "number": 15})
        self.assertFalse(stopped["root_cause"])
        self.assertTrue(stopped["stopped_by_mcprun"])

        self.assertEqual(suite.get("name"), "mcprun.none")
        self.assertEqual((suite.get("tests"), suite.get("failures"), suite.get("skipped")), ("2", "1", "1"))
        self.assertEqual(suite.get("hostname"), socket.gethostname())
        cases = self.cases(suite)
        self.assertEqual(cases["rank 1"].get("classname"), "mcprun.none")
        failure = cases["rank 1"].find("failure")
        self.assertEqual(failure.get("message"), cause)
        self.assertIn("  loading shard 17\n", failure.text)
        self.assertIn('  odd: & <tag> "q" \\x01\\x1b[31mred\n', failure.text)
        self.assertTrue(failure.text.endswith("  ValueError: bad shard 17"), failure.text)
        self.assertIsNotNone(cases["rank 0"].find("skipped"))

    def test_a_stalled_job_marks_the_rank_the_others_waited_for(self):
        worker = self.script("worker.py", TORCH_WORKER)
        env = dict(self.env, BEHAVIOUR_1="late_init")
        proc = self.start(*self.reports, "-n", "2", "--init-timeout", "5", "--no-stack-dumps", worker, env=env)
        code, _, err, summary, suite = self.reports_of(proc, timeout=90)
        self.assertEqual(code, 3, err)
        self.assertEqual(summary["result"], "stalled")
        self.assertIn("init barrier was not passed within --init-timeout 5 s", summary["root_cause"])
        self.assertEqual([rank["stalled"] for rank in summary["ranks"]], [False, True])
        cases = self.cases(suite)
        failure = cases["rank 1"].find("failure")
        self.assertEqual(failure.get("message"), summary["root_cause"])
        self.assertEqual(failure.get("type"), "stalled")
        self.assertIn("at the stall: never connected to the store", failure.text)
        self.assertIn("  sleeping before init_process_group", failure.text)
        self.assertIsNotNone(cases["rank 0"].find("skipped"))

    def test_timeout_is_its_own_result(self):
        code, _, err, summary, suite = self.reports_of(self.shell("--timeout", "1"))
        self.assertEqual(code, 124, err)
        self.assertEqual(summary["result"], "timeout")
        self.assertEqual(summary["root_cause"], "the job ran past --timeout 1 s")
        self.assertTrue(all(rank["stopped_by_mcprun"] for rank in summary["ranks"]))
        # Nobody failed by itself, so every rank carries the timeout: CI must not see green.
        self.assertEqual(suite.get("failures"), "2")

    def test_an_interrupt_is_its_own_result(self):
        waiter = ('trap "exit 0" INT; touch "$MCPRUN_TEST_DIR/ready.$LOCAL_RANK"; '
                  'while :; do sleep 0.05; done')
        proc = self.shell(behaviour={0: waiter, 1: waiter})
        self.assertTrue(wait_for(lambda: len(self.files("ready.")) == 2, 20))
        os.kill(proc.pid, signal.SIGINT)
        code, _, err, summary, _ = self.reports_of(proc)
        self.assertEqual(code, 130, err)
        self.assertEqual(summary["result"], "interrupted")
        self.assertEqual(summary["root_cause"], "mcprun was interrupted by SIGINT (signal 2)")

    def test_a_rendezvous_failure_is_failed_with_that_root_cause(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = self.start(*self.reports, "--nnodes", "2", "-n", "1", "--rdzv-backend", "c10d",
                          "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=false",
                          "--no-python", "/bin/true")
        code, _, err, summary, suite = self.reports_of(proc)
        self.assertEqual(code, 75, err)
        self.assertEqual(summary["result"], "failed")
        self.assertTrue(summary["root_cause"].startswith("rendezvous failed: "), summary)
        self.assertIn("cannot reach rendezvous", summary["root_cause"])
        self.assertEqual(summary["ranks"], [])
        # No rank ran: the launch itself is the failing test case.
        self.assertEqual(self.cases(suite)["mcprun"].find("failure").get("message"), summary["root_cause"])


class JobFile(CiTestCase):
    def test_the_smoke_job_runs_from_the_repository_root(self):
        logs = os.path.join(self.tmp, "logs")
        # The command line moves its files out of the repository: flags beat the file.
        proc = subprocess.Popen([MCPRUN, "--config", "configs/ci-smoke.yaml", *self.reports,
                                 "--log-dir", logs], cwd=REPO, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.procs.append(proc)
        code, out, err, summary, suite = self.reports_of(proc, timeout=120)
        self.assertEqual(code, 0, err)
        self.assertIn("[rank1]:rank 1/2 local_rank 1: done, replicas in sync", out)
        self.assertEqual(summary["result"], "success")
        self.assertIsNone(summary["root_cause"])
        self.assertEqual([(rank["rank"], rank["exit_code"]) for rank in summary["ranks"]], [(0, 0), (1, 0)])
        for rank in summary["ranks"]:
            self.assertTrue(rank["log"]["stdout"].startswith(logs), rank)
        self.assertEqual((suite.get("tests"), suite.get("failures")), ("2", "0"))
        self.assertFalse(os.path.exists(os.path.join(REPO, "mcprun-ci")))

    def test_an_unknown_key_exits_2_naming_its_line(self):
        job = self.script("job.yaml", "nproc-per-node: 2\n# a comment\ntimeout: 60\nnprocs: 2\n")
        code, out, err = self.run_mcprun("--config", job, "/bin/true")
        self.assertEqual(code, 2)
        self.assertEqual(err, f"mcprun: error: {job}:4: unknown key 'nprocs' (did you mean nproc-per-node?)\n")
        self.assertEqual(out, "")
        job = self.script("job.yaml", "script: t.py\nnnodes:\n  min: 1\n")
        code, _, err = self.run_mcprun("--config", job)
        self.assertEqual(code, 2)
        self.assertEqual(err, f"mcprun: error: {job}:2: nnodes: expected a string, got a map\n")

    def test_the_command_line_beats_the_file(self):
        job = self.script("job.yaml", "nproc-per-node: 3\nno-python: true\nenv:\n  CI_MARK: from-file\n"
                                      "script: /bin/sh\n"
                                      "args: [-c, 'echo \"$CI_MARK rank $RANK of $WORLD_SIZE\"']\n")
        code, out, err = self.run_mcprun("--config", job)
        self.assertEqual(code, 0, err)
        self.assertEqual(sorted(out.splitlines()),
                         [f"[rank{r}]:from-file rank {r} of 3" for r in range(3)])
        code, out, err = self.run_mcprun("--config", job, "-n", "1")
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "from-file rank 0 of 1\n")
        code, out, err = self.run_mcprun("--config", job, "-n", "1", "/bin/echo", "own script")
        self.assertEqual(code, 0, err)
        self.assertEqual(out, "own script\n")


class PlainOutput(LauncherTestCase):
    def on_terminal(self, env):
        """Runs a two-rank mcprun with a terminal for every stream; returns all it wrote."""
        controller, terminal = pty.openpty()
        proc = subprocess.Popen([MCPRUN, "-n", "2", "--no-python", "/bin/true"], env=env, stdin=terminal,
                                stdout=terminal, stderr=terminal, start_new_session=True)
        self.procs.append(proc)
        os.close(terminal)
        seen = b""
        while select.select([controller], [], [], 20)[0]:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: every holder of the terminal's other end is gone.
                break
            if not chunk:
                break
            seen += chunk
        os.close(controller)
        self.assertEqual(proc.wait(timeout=30), 0, seen)
        return seen

    def test_a_pipe_gets_no_colour_and_a_terminal_does(self):
        code, out, err = self.run_mcprun("-n", "2", "--no-python", "/bin/true")
        self.assertEqual(code, 0, err)
        self.assertIn("mcprun: warning: OMP_NUM_THREADS", err)
        self.assertNotIn("\x1b", out + err)
        env = {k: v for k, v in self.env.items() if k != "NO_COLOR"}
        self.assertIn(b"mcprun: \x1b[", self.on_terminal(dict(env, TERM="xterm")))
        plain = self.on_terminal(dict(env, TERM="xterm", NO_COLOR="1"))
        self.assertIn(b"mcprun: warning: OMP_NUM_THREADS", plain)
        self.assertNotIn(b"\x1b", plain)
