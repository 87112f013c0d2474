"""What a person at a terminal sees: each rank's output on a terminal of its own when mcprun's is
one, tqdm bars that move while the job runs, "\\r" updates relayed at once, and the window size."""
import os
import re
import select
import subprocess
import time
import unittest

from harness import LauncherTestCase, MCPRUN, REPO, wait_for

# tqdm comes from PyPI, in the venv that scripts/install-deps.sh makes.
VENV_PYTHON = os.path.join(REPO, ".venv", "bin", "python")

TTY_REPORT = """
import os, sys
print(f"rank {os.environ['RANK']} stdout tty={sys.stdout.isatty()} stderr tty={sys.stderr.isatty()}")
"""

TQDM_BAR = """
import os, sys, time
from tqdm import tqdm
print(f"rank {os.environ['RANK']} stdout tty={sys.stdout.isatty()}", flush=True)
if os.environ["RANK"] == "0":
    for _ in tqdm(range(40), file=sys.stdout, ncols=60, mininterval=0):
        time.sleep(0.15)
"""

# An update held back until the next one would arrive UPDATE_GAP_S late or more.
UPDATE_GAP_S = 1.0
PROGRESS_STAMPS = f"UPDATE_GAP_S = {UPDATE_GAP_S}\n" + """
import sys, time
for step in range(8):
    sys.stdout.write(f"\\rprogress {step} t={time.time():.6f}")
    sys.stdout.flush()
    time.sleep(UPDATE_GAP_S)
sys.stdout.write("\\n")
"""

WINDOW_SIZE = """
import os, signal, sys, time
def show(*_):
    size = os.get_terminal_size(sys.stdout.fileno())
    print(f"size={size.columns}x{size.lines}", flush=True)
signal.signal(signal.SIGWINCH, show)
show()
deadline = time.monotonic() + 30
while not os.path.exists(os.environ["MCPRUN_TEST_DIR"] + "/stop") and time.monotonic() < deadline:
    time.sleep(0.05)
"""


class TerminalTest(LauncherTestCase):
    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.tmux_socket, *args], capture_output=True,
                              text=True, env=self.env)

    def run_in_tmux(self, *mcprun_args, columns=120, lines=30):
        """Starts mcprun in a detached tmux window: a real terminal, as a person's would be."""
        self.tmux_socket = os.path.join(self.tmp, "tmux.sock")
        self.exit_file = os.path.join(self.tmp, "exit")
        self.env["TERM"] = "xterm-256color"
        command = " ".join([MCPRUN, *mcprun_args]) + f"; echo $? > {self.exit_file}; sleep 600"
        started = self.tmux("new-session", "-d", "-x", str(columns), "-y", str(lines), command)
        self.assertEqual(started.returncode, 0, started.stderr)

    def tearDown(self):
        # Before the temp folder, and the server's socket in it, is gone: nothing outlives a test.
        if getattr(self, "tmux_socket", None):
            self.tmux("kill-server")
            wait_for(lambda: not os.path.exists(self.tmux_socket), 5)
        super().tearDown()

    def screen(self):
        return self.tmux("capture-pane", "-p", "-J").stdout

    def exit_code(self):
        if not os.path.exists(self.exit_file):
            return None
        with open(self.exit_file) as f:
            text = f.read().strip()
        return int(text) if text else None

    def test_each_rank_sees_a_terminal_when_mcprun_has_one_and_a_pipe_when_it_has_a_pipe(self):
        script = self.script("tty.py", TTY_REPORT)
        self.run_in_tmux("-n", "2", script)
        self.assertTrue(wait_for(lambda: self.exit_code() is not None, 60), self.screen())
        self.assertEqual(self.exit_code(), 0, self.screen())
        for rank in (0, 1):
            self.assertIn(f"[rank{rank}]:rank {rank} stdout tty=True stderr tty=True", self.screen())
        code, out, err = self.run_mcprun("-n", "2", script)
        self.assertEqual(code, 0, err)
        for rank in (0, 1):
            self.assertIn(f"[rank{rank}]:rank {rank} stdout tty=False stderr tty=False", out)

    def test_a_tqdm_bar_moves_on_the_screen_while_the_job_runs(self):
        self.env["PYTHON_EXEC"] = VENV_PYTHON
        self.run_in_tmux("-n", "2", self.script("bar.py", TQDM_BAR))
        seen = set()

        def bar_states():
            for line in self.screen().splitlines():
                match = re.match(r"\[rank0\]:\s*(\d+)%\|", line)
                if match and self.exit_code() is None:
                    seen.add(int(match.group(1)))
            return len(seen) >= 3 or self.exit_code() is not None

        self.assertTrue(wait_for(bar_states, 60, interval=0.1), self.screen())
        self.assertGreaterEqual(len(seen), 3, f"bar states seen while running: {seen}\n{self.screen()}")
        self.assertLess(min(seen), 100)
        self.assertTrue(wait_for(lambda: self.exit_code() is not None, 60), self.screen())
        self.assertEqual(self.exit_code(), 0, self.screen())
        screen = self.screen()
        self.assertIn("[rank0]:rank 0 stdout tty=True", screen)
        self.assertIn("[rank1]:rank 1 stdout tty=True", screen)
        self.assertRegex(screen, r"\[rank0\]:100%\|")

    def test_the_window_size_is_the_terminals_and_follows_a_resize(self):
        self.run_in_tmux("-n", "2", self.script("size.py", WINDOW_SIZE), columns=120, lines=30)
        self.assertTrue(wait_for(lambda: self.screen().count("size=120x30") == 2, 30), self.screen())
        resized = self.tmux("resize-window", "-x", "100", "-y", "25")
        self.assertEqual(resized.returncode, 0, resized.stderr)
        self.assertTrue(wait_for(lambda: self.screen().count("size=100x25") == 2, 30), self.screen())
        open(os.path.join(self.tmp, "stop"), "w").close()
        self.assertTrue(wait_for(lambda: self.exit_code() is not None, 30), self.screen())
        self.assertEqual(self.exit_code(), 0, self.screen())

    def test_a_carriage_return_update_reaches_mcprun_output_at_once(self):
        """A reader that timestamps what it gets: each update's delay from the worker's write."""
        proc = self.start("-n", "2", self.script("stamps.py", PROGRESS_STAMPS))
        first_seen, buffer = {}, ""  # step -> delay of its first arrival
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536).decode()
            arrived = time.time()
            if not chunk:
                break
            buffer += chunk
            for step, stamp in re.findall(r"\[rank0\]:progress (\d+) t=(\d+\.\d+)", chunk):
                first_seen.setdefault(int(step), arrived - float(stamp))
        proc.wait(timeout=30)
        self.assertEqual(proc.returncode, 0, proc.stderr.read())
        self.assertEqual(sorted(first_seen), list(range(8)), buffer)
        delays = sorted(first_seen.values())
        median = delays[len(delays) // 2]
        print(f"relay delay of a carriage-return update: median {median * 1000:.1f} ms, "
              f"max {delays[-1] * 1000:.1f} ms")
        self.assertLess(median, 0.1, f"delays {delays}")
        self.assertLess(delays[-1], UPDATE_GAP_S, f"delays {delays}: an update waited for the next one")


if __name__ == "__main__":
    unittest.main()
