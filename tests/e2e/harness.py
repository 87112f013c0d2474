"""Shared pieces of the end-to-end tests: the built binary, temp dirs, and waits with deadlines."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

MCPRUN = os.environ.get("MCPRUN", os.path.join(os.path.dirname(__file__), "../../build/launcher/mcprun"))
PYTHON = os.environ.get("PYTHON_EXEC", "/usr/bin/python3")
# torchrun of the same torch as PYTHON: the side-by-side reference.
TORCHRUN = os.path.join(os.path.dirname(PYTHON), "torchrun")
TORCH_VERSION = subprocess.run([PYTHON, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                               capture_output=True, text=True).stdout.strip()
TORCH2 = TORCH_VERSION.split(".")[0] == "2"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))


def wait_for(condition, timeout, interval=0.02):
    """Polls `condition` until it is truthy or `timeout` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def port_open(port):
    """Something listens on the loopback `port` (a server that came up)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def reserve_port(test):
    """A loopback port held until `test` ends, as mcprun reserves its own: bound with SO_REUSEADDR
    and never listened on, so no bind(0) is handed it and a connect is refused, while a server
    that sets SO_REUSEADDR (mcprun, rendezvousd) can still listen there. No close-and-hope gap."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    test.addCleanup(sock.close)
    return sock.getsockname()[1]


def proc_stat(pid):
    """The fields of /proc/<pid>/stat after the command name: [0] is the state, [11] and [12]
    utime and stime in clock ticks."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def alive(pid):
    """True while `pid` exists and is not a zombie."""
    try:
        return proc_stat(pid)[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class LauncherTestCase(unittest.TestCase):
    """Gives each test a temp dir and kills whatever a failed test left behind."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="mcprun-e2e-")
        self.procs = []
        # TMPDIR: the run folders a stall keeps for its user go with the test's own.
        self.env = dict(os.environ, PYTHON_EXEC=PYTHON, MCPRUN_TEST_DIR=self.tmp, TMPDIR=self.tmp,
                        PATH="/usr/bin:/bin:" + os.environ.get("PATH", ""))
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                     "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"):
            self.env.pop(name, None)

    def tearDown(self):
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()
        # A killed launcher's guardian reaps its workers asynchronously: give it a moment.
        wait_for(lambda: not any(alive(pid) for pid in self.pids()), 5)
        leftover = [pid for pid in self.pids() if alive(pid)]
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", self.tmp], check=False)
        self.assertEqual(leftover, [], "processes outlived the test")

    def script(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as out:
            out.write(text)
        return path

    def start(self, *args, env=None, user=None):
        """Starts mcprun in its own session, as a terminal job would be (as `user`, if given)."""
        proc = subprocess.Popen([MCPRUN, *args], env=env or self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                user=user)
        self.procs.append(proc)
        return proc

    def run_mcprun(self, *args, env=None, timeout=120, user=None):
        proc = self.start(*args, env=env, user=user)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # What mcprun said before it hung is the whole diagnosis: fail with it, not without.
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            self.fail(f"mcprun {' '.join(args)} ran past {timeout} s\n--- stdout\n{out}\n--- stderr\n{err}")
        return proc.returncode, out, err

    def pids(self):
        """Pids that test workers wrote as <tmp>/pid.<anything>."""
        found = []
        for name in os.listdir(self.tmp):
            if name.startswith("pid."):
                with open(os.path.join(self.tmp, name)) as f:
                    found += [int(p) for p in f.read().split()]
        return found

    def files(self, prefix):
        return sorted(n for n in os.listdir(self.tmp) if n.startswith(prefix))


if __name__ == "__main__":
    sys.exit("run through unittest")
