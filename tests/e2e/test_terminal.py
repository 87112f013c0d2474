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

# The idiom of every training loop: a bar on rank 0 only, tqdm's defaults, a barrier each step.
# Rank 1 prints a line halfway, while rank 0's bar is open, and says it is done as soon as its
# loop ends (rank 0's bar may still be open, or not). With MCPRUN_TEST_RESIZE=1 the bar reads the
# width at each update, and rank 0 waits at step 9 until its terminal's width is no longer the one
# it started with (the test resizes the window once it sees the bar): tqdm may draw 9/40 before the
# wait, on a slow box at once, so 10/40 (25 %) is the first state it can draw at the new width.
TQDM_ON_RANK_0 = """
import os, sys, time
import torch.distributed as dist
from tqdm import tqdm
dist.init_process_group("gloo")
rank = dist.get_rank()
dynamic = os.environ.get("MCPRUN_TEST_RESIZE") == "1"
width = os.get_terminal_size(sys.stderr.fileno()).columns
for step in tqdm(range(40), desc="epoch 0", disable=rank != 0, dynamic_ncols=dynamic):
    if dynamic and step == 9:
        deadline = time.monotonic() + 30
        while os.get_terminal_size(sys.stderr.fileno()).columns == width and time.monotonic() < deadline:
            time.sleep(0.02)
    if rank == 1 and step == 20:
        print("rank 1 halfway", flush=True)
    dist.barrier()
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

# The same with rich, whose bar erases its line before each redraw.
RICH_ON_RANK_0 = """
import time
import torch.distributed as dist
from rich.progress import track
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in track(range(40), description="epoch 0", disable=rank != 0):
    if rank == 1 and step == 20:
        print("rank 1 halfway", flush=True)
    dist.barrier()
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
dist.barrier()
dist.destroy_process_group()
"""

# A script that forgot disable=: every rank draws its bar.
TQDM_ON_EVERY_RANK = """
import time
import torch.distributed as dist
from tqdm import tqdm
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in tqdm(range(40), desc="epoch 0"):
    dist.barrier()
    time.sleep(0.05)
print(f"rank {rank} done", flush=True)
dist.barrier()
dist.destroy_process_group()
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
        if os.path.exists(self.exit_file):  # A window before this one's.
            os.remove(self.exit_file)
        self.env["TERM"] = "xterm-256color"
        command = " ".join([MCPRUN, *mcprun_args]) + f"; echo $? > {self.exit_file}; sleep 600"
        started = self.tmux("new-session", "-d", "-x", str(columns), "-y", str(lines), command)
        self.assertEqual(started.returncode, 0, started.stderr)

    def close_tmux(self):
        self.tmux("kill-server")
        wait_for(lambda: not os.path.exists(self.tmux_socket), 5)

    def tearDown(self):
        # Before the temp folder, and the server's socket in it, is gone: nothing outlives a test.
        if getattr(self, "tmux_socket", None):
            self.close_tmux()
        super().tearDown()

    def screen(self):
        return self.tmux("capture-pane", "-p", "-J").stdout

    def scrollback(self):
        """Every line the job wrote, the scrolled-off ones too; a wrapped line joined back."""
        return self.tmux("capture-pane", "-p", "-J", "-S", "-").stdout.splitlines()

    def run_bar_job(self, script, columns):
        """Runs a two-rank job with a bar in tmux until it exits; returns the scrollback."""
        self.env["PYTHON_EXEC"] = VENV_PYTHON
        self.run_in_tmux("-n", "2", script, columns=columns)
        self.assertTrue(wait_for(lambda: self.exit_code() is not None, 120), self.screen())
        self.assertEqual(self.exit_code(), 0, self.screen())
        return self.scrollback()

    def assert_one_rank_per_line(self, lines, columns):
        for line in lines:
            self.assertLessEqual(len(re.findall(r"\[rank\d\]:", line)), 1, "\n".join(lines))
            if line.startswith("[rank"):  # mcprun's own lines are not the workers' to fit.
                self.assertLessEqual(len(line.rstrip()), columns, f"a wrapped line: {line!r}")
            self.assertNotIn("\ufffd", line, "a garbled character")

    def assert_bar_on_one_line(self, lines, columns):
        bars = [line for line in lines if "epoch 0" in line]
        self.assertEqual(len(bars), 1, "\n".join(lines))
        self.assertTrue(bars[0].startswith("[rank0]:epoch 0"), bars[0])
        self.assertIn("100%", bars[0])  # The last state.
        for line in ("[rank1]:rank 1 halfway", "[rank1]:rank 1 done", "[rank0]:rank 0 done"):
            self.assertIn(line, lines, "\n".join(lines))
        self.assert_one_rank_per_line(lines, columns)

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

    def assert_bar_fills_the_line(self, lines, columns):
        """tqdm fills its terminal, the window less the prefix, but for the last column."""
        bar = next(line for line in lines if "epoch 0" in line)
        self.assertEqual(len(bar.rstrip()), columns - 1, bar)

    def test_a_default_tqdm_bar_on_rank_0_updates_on_one_line(self):
        script = self.script("bar.py", TQDM_ON_RANK_0)
        for columns in (80, 120):
            with self.subTest(columns=columns):
                lines = self.run_bar_job(script, columns)
                self.assert_bar_on_one_line(lines, columns)
                self.assert_bar_fills_the_line(lines, columns)
                self.close_tmux()

    def test_a_rich_progress_bar_on_rank_0_updates_on_one_line(self):
        script = self.script("rich_bar.py", RICH_ON_RANK_0)
        for columns in (80, 120):
            with self.subTest(columns=columns):
                self.assert_bar_on_one_line(self.run_bar_job(script, columns), columns)
                self.close_tmux()

    def test_a_resized_window_keeps_the_bar_updating_on_one_line_at_its_new_width(self):
        self.env["PYTHON_EXEC"] = VENV_PYTHON
        self.env["MCPRUN_TEST_RESIZE"] = "1"
        script = self.script("bar.py", TQDM_ON_RANK_0)
        for before, after in ((80, 120), (120, 80)):
            with self.subTest(before=before, after=after):
                self.run_in_tmux("-n", "2", script, columns=before)
                self.assertTrue(wait_for(lambda: "[rank0]:epoch 0:" in self.screen(), 60),
                                self.screen())
                resized = self.tmux("resize-window", "-x", str(after), "-y", "30")
                self.assertEqual(resized.returncode, 0, resized.stderr)
                self.assertTrue(wait_for(lambda: self.exit_code() is not None, 120), self.screen())
                self.assertEqual(self.exit_code(), 0, self.screen())
                # The screen's rows as drawn, a wrapped line's parts apart.
                rows = self.tmux("capture-pane", "-p", "-S", "-").stdout.splitlines()
                bars = [row for row in rows if "epoch 0" in row]
                states = [int(match.group(1)) for row in bars
                          if (match := re.match(r"\[rank0\]:epoch 0:\s*(\d+)%", row))]
                # Rank 0 passes step 10 (25%) only once its terminal has the new width: every
                # update from there on shares one line, which ends in the last state.
                self.assertEqual([state for state in states if state >= 25], [100], "\n".join(rows))
                if after > before:  # Nothing wraps: the bar never left its line.
                    self.assertEqual(len(bars), 1, "\n".join(rows))
                # A narrower window re-wraps what was drawn before it (tmux does, as most terminals
                # do): what is left above the bar is the terminal's.
                self.assertTrue(bars[-1].startswith("[rank0]:epoch 0: 100%"), bars[-1])
                self.assertEqual(len(bars[-1].rstrip()), after - 1, bars[-1])
                self.assertIn("[rank1]:rank 1 done", rows)
                self.close_tmux()

    def test_two_ranks_with_bars_never_share_a_line(self):
        lines = self.run_bar_job(self.script("bars.py", TQDM_ON_EVERY_RANK), 120)
        self.assert_one_rank_per_line(lines, 120)
        for rank in (0, 1):
            self.assertTrue(any(line.startswith(f"[rank{rank}]:epoch 0: 100%") for line in lines),
                            "\n".join(lines))
            self.assertIn(f"[rank{rank}]:rank {rank} done", lines)

    def test_the_window_size_is_the_terminals_less_the_prefix_and_follows_a_resize(self):
        script = self.script("size.py", WINDOW_SIZE)
        stop = os.path.join(self.tmp, "stop")
        # Two ranks: "[rankN]:" takes 8 columns of each line. One rank: no prefix, all of them.
        for ranks, prefix_columns in ((2, 8), (1, 0)):
            with self.subTest(ranks=ranks):
                self.run_in_tmux("-n", str(ranks), script, columns=120, lines=30)
                size = f"size={120 - prefix_columns}x30"
                self.assertTrue(wait_for(lambda: self.screen().count(size) == ranks, 30),
                                self.screen())
                resized = self.tmux("resize-window", "-x", "100", "-y", "25")
                self.assertEqual(resized.returncode, 0, resized.stderr)
                size = f"size={100 - prefix_columns}x25"
                self.assertTrue(wait_for(lambda: self.screen().count(size) == ranks, 30),
                                self.screen())
                open(stop, "w").close()
                self.assertTrue(wait_for(lambda: self.exit_code() is not None, 30), self.screen())
                self.assertEqual(self.exit_code(), 0, self.screen())
                self.close_tmux()
                os.remove(stop)

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
