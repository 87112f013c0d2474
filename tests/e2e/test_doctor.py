"""End-to-end tests of `mcprun doctor`: the real binary on this machine, fake sysfs trees, a port
something listens on, a small /dev/shm, and a real rendezvousd for the clock."""
import json
import os
import re
import resource
import signal
import socket
import subprocess

from fake_sysfs import make_tree
from harness import PYTHON, LauncherTestCase, wait_for
from test_rendezvous import RENDEZVOUSD

LINE = re.compile(r"^(OK  |WARN|FAIL)  ([a-z-]+): (.+)$")
MIB = 1 << 20


def read_text(path):
    with open(path) as f:
        return f.read()


def has_nvidia_device():
    devices = "/sys/bus/pci/devices"
    return os.path.isdir(devices) and any(
        read_text(os.path.join(devices, d, "vendor")).strip() == "0x10de" for d in os.listdir(devices))


def parse_report(out):
    """[(status, check, finding, remedy)] from the plain report; asserts its shape as it goes."""
    lines = out.splitlines()
    assert lines and re.fullmatch(r"mcprun doctor: \d+ OK, \d+ WARN, \d+ FAIL", lines[-1]), out
    checks = []
    for line in lines[:-1]:
        if line.startswith("      "):
            assert checks and checks[-1][0] != "OK", "a remedy under an OK line:\n" + out
            checks[-1][3] = line.strip()
            continue
        match = LINE.match(line)
        assert match, f"not a check line: {line!r}"
        checks.append([match.group(1).strip(), match.group(2), match.group(3), ""])
    return checks


class Doctor(LauncherTestCase):
    def doctor(self, *args, env=None):
        code, out, err = self.run_mcprun("doctor", *args, env=env, timeout=60)
        return code, out, err

    def findings(self, checks, name):
        return [c for c in checks if c[1] == name]

    def test_this_machine_passes_or_warns_honestly(self):
        code, out, err = self.doctor()
        self.assertNotIn("\x1b[", out, "no colour when stdout is a pipe")
        checks = parse_report(out)
        fails = [c for c in checks if c[0] == "FAIL"]
        self.assertEqual(code, 1 if fails else 0, out + err)
        for status, name, finding, remedy in checks:
            if status != "OK":
                self.assertTrue(remedy, f"{name}: {status} without a remedy")
        # Each finding agrees with what Python sees of the same machine.
        shm = os.statvfs("/dev/shm")
        free = shm.f_bavail * shm.f_frsize
        expected = "FAIL" if free < 256 * MIB else "WARN" if free < 1024 * MIB else "OK"
        self.assertEqual(self.findings(checks, "shm")[0][0], expected, out)
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        memlock = self.findings(checks, "memlock")[0]
        self.assertEqual(memlock[0], "OK" if soft == resource.RLIM_INFINITY else "WARN", out)
        try:
            found = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
            # IPv4 first, as mcprun's store listens on IPv4.
            first = sorted(found, key=lambda entry: entry[0] != socket.AF_INET)[0][4][0]
            resolves_to_loopback = first.startswith("127.") or first == "::1"
        except socket.gaierror:
            resolves_to_loopback = True  # Not resolving at all warns as well.
        hostname = self.findings(checks, "hostname")[0]
        self.assertEqual(hostname[0], "WARN" if resolves_to_loopback else "OK", out)
        gpus = self.findings(checks, "gpus")
        if not has_nvidia_device():
            self.assertEqual(gpus, [["OK", "gpus", "no NVIDIA GPU found; workers run on CPU", ""]])
        self.assertEqual([c[1] for c in checks if c[1] in ("master-port", "rdzv-endpoint", "clock")], [],
                         "nothing to reach: no master or rendezvous given")

    def test_nccl_is_asked_of_the_workers_torch(self):
        import torch  # The workers' torch, as Python sees it.
        _, out, _ = self.doctor(env=dict(self.env, PYTHON_EXEC=PYTHON))
        nccl = self.findings(parse_report(out), "nccl")
        if not torch.version.cuda:
            self.assertEqual(nccl, [["OK", "nccl", f"torch {torch.__version__} is a CPU build: no NCCL (gloo only)", ""]])
        no_torch = self.script("python-without-torch", "#!/bin/sh\nexec /usr/bin/python3 -I -S \"$@\"\n")
        os.chmod(no_torch, 0o755)
        _, out, _ = self.doctor(env=dict(self.env, PYTHON_EXEC=no_torch))
        status, _, finding, remedy = self.findings(parse_report(out), "nccl")[0]
        self.assertEqual(status, "WARN", out)
        self.assertIn("cannot import torch", finding)
        self.assertIn("PYTHON_EXEC", remedy)
        _, out, _ = self.doctor("--no-torch")
        self.assertEqual(self.findings(parse_report(out), "nccl"), [])

    def test_json_is_the_same_report(self):
        code, out, err = self.doctor("--json")
        report = json.loads(out)
        self.assertEqual(set(report), {"checks", "summary"})
        for check in report["checks"]:
            self.assertEqual(set(check), {"check", "status", "finding", "remedy"})
            self.assertIn(check["status"], ("OK", "WARN", "FAIL"))
        statuses = [c["status"] for c in report["checks"]]
        summary = report["summary"]
        self.assertEqual((summary["ok"], summary["warn"], summary["fail"]),
                         (statuses.count("OK"), statuses.count("WARN"), statuses.count("FAIL")))
        self.assertEqual(summary["exit_code"], code)
        _, text, _ = self.doctor()
        self.assertEqual([(c[0], c[1], c[2]) for c in parse_report(text)],
                         [(c["status"], c["check"], c["finding"]) for c in report["checks"]])

    def test_a_gpu_in_an_x8_slot_warns(self):
        root = make_tree(os.path.join(self.tmp, "sysfs"), [
            {"bus_id": "0000:1a:00.0", "numa_node": 0, "local_cpulist": "0-7"},
            {"bus_id": "0000:41:00.0", "numa_node": 0, "local_cpulist": "0-7", "current_link_width": 8},
        ])
        env = dict(self.env, MCPRUN_SYSFS_ROOT=root)
        code, out, err = self.doctor(env=env)
        gpus = self.findings(parse_report(out), "gpus")
        self.assertEqual(gpus[0][:3], ["OK", "gpus", "2 GPUs: 0000:1a:00.0 (NUMA 0), 0000:41:00.0 (NUMA 0)"])
        self.assertEqual(gpus[1][:3], ["WARN", "gpus", "GPU 0000:41:00.0 runs at x8 of x16"])
        self.assertIn("slot", gpus[1][3])
        self.assertEqual(len(gpus), 2, out)
        code, out, err = self.doctor("--json", env=env)
        warned = [c for c in json.loads(out)["checks"] if c["check"] == "gpus" and c["status"] == "WARN"]
        self.assertEqual([c["finding"] for c in warned], ["GPU 0000:41:00.0 runs at x8 of x16"])

    def test_a_port_something_listens_on_fails_and_names_it(self):
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            port = listener.getsockname()[1]
            code, out, err = self.doctor("--master-addr", "127.0.0.1", "--master-port", str(port))
            checks = parse_report(out)
            self.assertEqual(code, 1, out + err)
            master = self.findings(checks, "master-port")
            self.assertEqual(master[0][0], "FAIL", out)
            self.assertIn(f"MASTER_PORT {port} is taken here: pid {os.getpid()} (", master[0][2])
            self.assertIn("--master-port", master[0][3])
            # The same from the inherited variables, which the environment check also names.
            env = dict(self.env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            code, out, err = self.doctor(env=env)
            checks = parse_report(out)
            self.assertEqual(code, 1)
            self.assertEqual(self.findings(checks, "master-port")[0][0], "FAIL")
            inherited = [c for c in self.findings(checks, "environment") if f"MASTER_PORT={port}" in c[2]]
            self.assertEqual(inherited[0][0], "WARN", out)
        code, out, err = self.doctor("--master-addr", "127.0.0.1", "--master-port", str(port))
        self.assertEqual(self.findings(parse_report(out), "master-port")[0][0], "OK", out)

    def test_a_missing_or_small_shm_fails_with_exit_1(self):
        code, out, err = self.doctor("--shm", os.path.join(self.tmp, "no-shm-here"))
        shm = self.findings(parse_report(out), "shm")[0]
        self.assertEqual((code, shm[0]), (1, "FAIL"), out)
        self.assertIn("No such file or directory", shm[2])
        if os.geteuid() != 0:
            self.skipTest("mounting a 64 MiB tmpfs needs root")
        small = os.path.join(self.tmp, "shm")
        os.mkdir(small)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", small],
                          capture_output=True).returncode != 0:
            self.skipTest("cannot mount a tmpfs here")
        try:
            code, out, err = self.doctor("--shm", small)
        finally:  # Before tearDown removes the folder it is mounted in.
            subprocess.run(["umount", small], check=False)
        shm = self.findings(parse_report(out), "shm")[0]
        self.assertEqual((code, shm[0]), (1, "FAIL"), out)
        self.assertEqual(shm[2].split(",")[0], f"{small}: 64 MiB free of 64 MiB")
        self.assertIn("--shm-size", shm[3])

    def test_nccl_variables_are_explained(self):
        env = dict(self.env, NCCL_P2P_DISABLE="1", NCCL_DEBUG="INFO", RANK="5",
                   CUDA_VISIBLE_DEVICES="1,0")
        env.pop("CUDA_DEVICE_ORDER", None)
        code, out, err = self.doctor(env=env)
        environment = {c[2].split(":")[0]: c for c in self.findings(parse_report(out), "environment")}
        self.assertEqual(environment["NCCL_P2P_DISABLE=1"][0], "WARN")
        self.assertIn("all-reduce goes through host memory", environment["NCCL_P2P_DISABLE=1"][2])
        self.assertEqual(environment["NCCL_DEBUG=INFO"][0], "OK")
        self.assertEqual(environment["inherited RANK=5"][0], "WARN")
        self.assertIn("CUDA_DEVICE_ORDER=PCI_BUS_ID", environment["CUDA_VISIBLE_DEVICES=1,0 without "
                                                               "CUDA_DEVICE_ORDER=PCI_BUS_ID"][2])

    def test_clock_against_a_real_rendezvousd(self):
        log_path = os.path.join(self.tmp, "rendezvousd.log")
        token = os.path.join(self.tmp, "token")
        with open(token, "w") as f:
            f.write("s3cret\n")
        with open(log_path, "w") as log:
            daemon = subprocess.Popen([RENDEZVOUSD, "--listen", "127.0.0.1:0", "--token-file", token],
                                      stdout=log, stderr=log, start_new_session=True)
        try:
            port = wait_for(lambda: re.search(r"listening on 127\.0\.0\.1:(\d+)", read_text(log_path)), 10)
            self.assertTrue(port, read_text(log_path))
            endpoint = "127.0.0.1:" + port.group(1)
            code, out, err = self.doctor("--rdzv-endpoint", endpoint)
            checks = parse_report(out)
            self.assertEqual(self.findings(checks, "rdzv-endpoint")[0][0], "OK", out)
            clock = self.findings(checks, "clock")
            self.assertEqual(clock[0][0], "OK", out)
            self.assertRegex(clock[0][2], r"^this node's clock is [0-9.]+ ms (behind|ahead of) the "
                                          r"rendezvous's \(\+- [0-9.]+ ms, half the round trip\)$")
            self.assertEqual(daemon.poll(), None, "the daemon survives a doctor's visit")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=10)

    def test_a_local_endpoint_nothing_listens_on_is_hosted_by_mcprun(self):
        with socket.socket() as holder:  # Bound, never listening: a port nothing answers on.
            holder.bind(("127.0.0.1", 0))
            endpoint = "127.0.0.1:%d" % holder.getsockname()[1]
            code, out, err = self.doctor("--rdzv-endpoint", endpoint)
        checks = parse_report(out)
        rdzv = self.findings(checks, "rdzv-endpoint")[0]
        self.assertEqual(rdzv[0], "OK", out)
        self.assertIn("host the rendezvous itself", rdzv[2])
        self.assertEqual(self.findings(checks, "clock")[0][0], "OK", out)

    def test_bad_flags_are_usage_errors(self):
        for args in (["--master-port", "0"], ["--rdzv-endpoint", "head"], ["--bogus"]):
            code, out, err = self.doctor(*args)
            self.assertEqual(code, 2, args)
            self.assertEqual(out, "")
            self.assertEqual(len(err.splitlines()), 1, err)
            self.assertTrue(err.startswith("mcprun: error: "), err)
