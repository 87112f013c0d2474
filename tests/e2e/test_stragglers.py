"""The straggler watch end to end, with real torch DDP over gloo on CPU and no mcprun code in the
scripts: a rank that holds the others back is named while the job runs, with where its time goes;
a balanced job, a rank 0 that evaluates now and then, and short steps name nobody. torch 1.13 has
no Flight Recorder: there it names nothing."""
import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import unittest
import zlib
import urllib.request
from xml.etree import ElementTree

from harness import TORCH2, LauncherTestCase, port_open, reserve_port, wait_for

WINDOW_S = 10
CGROUP_V1_CPU = "/sys/fs/cgroup/cpu"

# A DDP loop over a DataLoader for $DURATION_S; $SCENARIO decides who is slow and how.
TRAIN = r'''
import os, random, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
scenario = os.environ["SCENARIO"]
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], f"pid.{rank}"), "w") as f:
    f.write(str(os.getpid()))

class Shard(torch.utils.data.Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, index):
        if scenario == "slow_loader" and rank == int(os.environ.get("SLOW_RANK", "1")):
            time.sleep(0.02)  # This rank's shard is on a slower disk.
        return torch.randn(64)

# 66 KiB of gradients: large enough for the bandwidth watch to time every step's all-reduce.
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Shard(), batch_size=4)
end = time.monotonic() + float(os.environ["DURATION_S"])
stop_file = os.environ.get("STOP_FILE", "")  # Ends the job earlier, once the test has seen enough.
for step, batch in enumerate(loader):
    stop = torch.tensor([float(time.monotonic() > end or bool(stop_file) and os.path.exists(stop_file))])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # Every rank stops at the same step.
    if stop.item():
        break
    if scenario == "evaluates" and rank == 0 and step % 50 == 49:
        time.sleep(2)  # Rank 0 evaluates now and then while the others wait.
    if scenario == "uneven_work":  # Rank 1's batch is 2.5x the others': 25 ms of CPU to 10 ms.
        busy = time.thread_time() + (0.025 if rank == 1 else 0.01)
        while time.thread_time() < busy:
            pass
        time.sleep(0.01)
    elif scenario == "throttled":  # 10 ms of CPU a step, and rank 2 gets 15 % of a core once it runs.
        busy = time.thread_time() + 0.01
        while time.thread_time() < busy:
            pass
        time.sleep(0.02)
    elif scenario == "periodic":  # Rank 1 stalls 300 ms every tenth step (a sync to disk).
        time.sleep(0.03 + (0.3 if rank == 1 and step % 10 == 9 else 0))
    elif scenario == "rotating":  # Each rank in turn is 20 ms late for ten steps.
        time.sleep(0.03 + (0.02 if rank == (step // 10) % dist.get_world_size() else 0))
    elif scenario == "jitter":  # Every rank, every step, up to 20 ms late at random.
        time.sleep(0.03 + random.uniform(0, 0.02))
    elif scenario == "cpu_bound":
        busy = time.thread_time() + 0.02  # 20 ms of CPU: slower wherever the CPU is taken.
        while time.thread_time() < busy:
            pass
    elif scenario != "short_steps":
        time.sleep(0.03)  # The step's own compute, alike on every rank.
    optimizer.zero_grad()
    model(batch).sum().backward()
    optimizer.step()
dist.barrier()
print(f"rank {rank} done", flush=True)
'''

class StragglerCase(LauncherTestCase):
    def launch(self, scenario, duration_s, *flags, nproc=3):
        """Runs the job; returns (code, stderr, summary)."""
        summary_path = os.path.join(self.tmp, "summary.json")
        env = dict(self.env, SCENARIO=scenario, DURATION_S=str(duration_s))
        proc = self.start("-n", str(nproc), "--straggler-window", str(WINDOW_S), "--summary-json",
                          summary_path, *flags, self.script("train.py", TRAIN), env=env)
        _, err = proc.communicate(timeout=duration_s + 120)
        with open(summary_path) as f:
            return proc.returncode, err, json.load(f)

    def straggler_lines(self, err):
        return [line for line in err.splitlines() if "straggler" in line]


class StragglerTest(StragglerCase):
    def test_a_rank_with_a_slower_data_loader_is_named_with_its_loader(self):
        logs = os.path.join(self.tmp, "logs")
        code, err, summary = self.launch("slow_loader", 3 * WINDOW_S, "--log-dir", logs)
        self.assertEqual(code, 0, err)
        lines = self.straggler_lines(err)
        if not TORCH2:
            self.assertEqual(lines, [])  # No Flight Recorder: nothing is named rather than guessed.
            self.assertEqual(summary["stragglers"], [])
            return
        self.assertTrue(lines, err)
        self.assertRegex(lines[0], r"straggler: rank 1 \(node [^,]+, local rank 1\) arrives last at "
                                   r"\d+% of the steps on group 0, \d+ ms behind the others")
        self.assertIn("in its data loader", lines[0])
        straggler = summary["stragglers"][0]
        self.assertEqual((straggler["rank"], straggler["local_rank"]), (1, 1))
        self.assertGreater(straggler["median_lag_s"], 0.04)
        self.assertIn("data loader", straggler["cause"])
        self.assert_picture_marks_the_straggler(logs, 1, 3)

    def assert_picture_marks_the_straggler(self, logs, straggler, world):
        """collectives.html in the run folder: a row per rank, the straggler's marked, most
        collectives' last arrival on its row, and nothing loaded from anywhere."""
        [path] = glob.glob(os.path.join(logs, "*", "collectives.html"))
        with open(path) as f:
            text = f.read()
        for fetch in ("<script", "src=", "href=", "url(", "@import", "<link"):
            self.assertNotIn(fetch, text)
        # Each chart's SVG namespace, and nothing else a browser could fetch.
        self.assertEqual(set(re.findall(r"https?://[^\s\"]+", text)), {"http://www.w3.org/2000/svg"})
        svgs = list(ElementTree.fromstring(text).iter("{http://www.w3.org/2000/svg}svg"))
        # Who: the others waited for the straggler longest.
        [waits] = [s for s in svgs if s.get("class") == "waits"]
        bars = {int(r.get("data-rank")): float(r.get("width")) for r in waits.findall("{http://www.w3.org/2000/svg}rect")}
        self.assertEqual(max(bars, key=bars.get), straggler, bars)
        # Every arrival: a row per rank, most last arrivals on the straggler's.
        [svg] = [s for s in svgs if any(r.get("class") == "row" for r in s.findall("{http://www.w3.org/2000/svg}rect"))]
        rects = svg.findall("{http://www.w3.org/2000/svg}rect")
        rows = {int(r.get("data-rank")): r for r in rects if r.get("class") == "row"}
        self.assertEqual(sorted(rows), list(range(world)))
        labels = [t.text for t in svg.findall("{http://www.w3.org/2000/svg}text")]
        self.assertTrue(any(label.startswith(f"rank {straggler} (") and label.endswith(": straggler")
                            for label in labels), labels)
        band = float(rows[straggler].get("y")), float(rows[straggler].get("y")) + float(rows[straggler].get("height"))
        lasts = [float(r.get("y")) for r in rects if r.get("class") == "last"]
        self.assertGreater(len(lasts), 20)
        on_its_row = sum(band[0] <= y < band[1] for y in lasts)
        self.assertGreater(on_its_row, len(lasts) / 2, (on_its_row, len(lasts)))  # Most.
        self.assert_chromium_shows_it(path)

    def assert_chromium_shows_it(self, path):
        """As a person opens it: headless Chromium, offline, draws the straggler's band and the
        red marks of last arrivals."""
        shot = os.path.join(self.tmp, "shot.png")
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1300,1500", "--user-data-dir=" + os.path.join(self.tmp, "chromium"),
                        "--proxy-server=127.0.0.1:9", f"--screenshot={shot}", "file://" + path],
                       capture_output=True, timeout=120, check=True)
        colours = png_colours(shot)
        self.assertIn((0xff, 0xe0, 0xb2), colours)  # The straggler's row.
        self.assertIn((0xd3, 0x2f, 0x2f), colours)  # Last arrivals.

    def assert_nobody_named(self, scenario, duration_s):
        code, err, summary = self.launch(scenario, duration_s)
        self.assertEqual(code, 0, err)
        self.assertEqual(self.straggler_lines(err), [])
        self.assertEqual(summary["stragglers"], [])
        self.assertNotIn("slow collective", err)  # Its all-reduces were timed, and none slowed.
        self.assertEqual(summary["slow_collectives"], [])

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_every_node_of_a_two_node_job_names_a_straggler_on_the_other(self):
        # The store's host (node a) watches; rank 3 runs on node b, whose console must say so too.
        port = reserve_port(self)
        env = dict(self.env, SCENARIO="slow_loader", SLOW_RANK="3", DURATION_S=str(3 * WINDOW_S))
        script = self.script("train.py", TRAIN)
        common = ["--nnodes", "2", "-n", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                  f"127.0.0.1:{port}", "--rdzv-id", "crawl", "--straggler-window", str(WINDOW_S)]
        host = self.start(*common, "--node-name", "a", script, env=env)
        self.assertTrue(wait_for(lambda: host.poll() is not None or port_open(port), 30))
        other = self.start(*common, "--node-name", "b", "--rdzv-conf", "is_host=false", script, env=env)
        for node, proc in (("a", host), ("b", other)):
            _, err = proc.communicate(timeout=3 * WINDOW_S + 120)
            self.assertEqual(proc.returncode, 0, f"node {node}: {err}")
            lines = self.straggler_lines(err)
            self.assertTrue(lines, f"node {node} named no straggler: {err}")
            self.assertRegex(lines[0], r"straggler: rank 3 \(node [^,]+, local rank 1\) arrives last")
            self.assertIn("in its data loader", lines[0])

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_metrics_port_serves_the_straggler_and_every_ranks_wait(self):
        # The job runs until the metrics show all this test reads, or the deadline: a loaded box
        # times fewer collectives a second, and waiting for the count beats a fixed duration.
        stop_file = os.path.join(self.tmp, "stop")
        deadline_s = 3 * WINDOW_S + 120
        env = dict(self.env, SCENARIO="slow_loader", DURATION_S=str(deadline_s), STOP_FILE=stop_file)
        proc = self.start("-n", "3", "--straggler-window", str(WINDOW_S), "--metrics-port",
                          "127.0.0.1:0", self.script("train.py", TRAIN), env=env)
        url = wait_for(lambda: metrics_url(proc), 60)
        self.assertTrue(url, "no metrics line")
        kind = r'{group="0",op="all_reduce",size="64 KiB-256 KiB"}'

        def timed(metrics):
            found = re.search(r"^mcprun_collectives_timed_total" + re.escape(kind) + r" (\S+)$", metrics, re.M)
            return float(found.group(1)) if found else 0

        def seen_enough():
            metrics = scrape(url)
            # 150 collectives, some 75 steps: the others' waits for rank 1 outweigh how far
            # apart the ranks started, which the first collective's waits hold.
            enough = ('mcprun_straggler{rank="1",' in metrics and timed(metrics) > 5 and
                      sample(metrics, "mcprun_rank_collectives_total", 0) >= 150)
            return metrics if enough else None

        metrics = wait_for(lambda: seen_enough() or proc.poll() is not None, deadline_s, interval=0.5)
        last_scrape = scrape(url)
        metrics = metrics if isinstance(metrics, str) else None  # True: the job ended first.
        open(stop_file, "w").close()
        _, err = proc.communicate(timeout=deadline_s + 120)
        self.assertEqual(proc.returncode, 0, err)
        self.assertTrue(metrics, f"no straggler, or too few collectives timed, in {deadline_s} s:\n{last_scrape}")
        self.assertIn('mcprun_workers{state="running"} 3', metrics)
        waited = {rank: sample(metrics, "mcprun_rank_wait_seconds_total", rank) for rank in range(3)}
        last = {rank: sample(metrics, "mcprun_rank_arrived_last_total", rank) for rank in range(3)}
        # The straggler waits least and arrives last most; its peers wait for it.
        self.assertEqual(min(waited, key=waited.get), 1, metrics)
        self.assertEqual(max(last, key=last.get), 1, metrics)
        # Every step's gradient all-reduce, timed: its bus bandwidth.
        busbw = re.search(r"^mcprun_collective_bus_bandwidth_bytes_per_second" + re.escape(kind) + r" (\S+)$", metrics, re.M)
        self.assertTrue(busbw and float(busbw.group(1)) > 0, metrics)

    def test_metrics_port_in_use_is_one_line(self):
        taken = socket.socket()
        self.addCleanup(taken.close)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = self.run_mcprun("-n", "1", "--metrics-port", f"127.0.0.1:{port}",
                                       "--no-python", "/bin/true")
        self.assertEqual(code, 1, err)
        self.assertRegex(err, rf"mcprun: error: --metrics-port 127.0.0.1:{port}: cannot listen "
                              r"there: [Aa]ddress already in use\n")
        code, _, err = self.run_mcprun("-n", "1", "--metrics-port", "web", "--no-python", "/bin/true")
        self.assertEqual(code, 2, err)
        self.assertIn("--metrics-port", err)

    # torch 1.x has no Flight Recorder, so no arrivals: the slow loader above shows that nothing
    # is named there; the tests below guard against false names, which only 2.x could make.
    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_a_balanced_job_names_nobody(self):
        # Three windows where a straggler could be named; STRAGGLER_BALANCED_S=600 for a soak.
        self.assert_nobody_named("balanced", int(os.environ.get("STRAGGLER_BALANCED_S", str(3 * WINDOW_S))))

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_rank_0_evaluating_every_50_steps_names_nobody(self):
        self.assert_nobody_named("evaluates", 3 * WINDOW_S)

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_steps_under_20_ms_name_nobody(self):
        self.assert_nobody_named("short_steps", 2 * WINDOW_S)

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_a_lag_that_rotates_from_rank_to_rank_names_nobody(self):
        self.assert_nobody_named("rotating", 3 * WINDOW_S)

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_random_jitter_on_every_rank_names_nobody(self):
        self.assert_nobody_named("jitter", 3 * WINDOW_S)

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_a_rank_with_more_work_is_named_as_compute_with_what_it_costs(self):
        code, err, summary = self.launch("uneven_work", 3 * WINDOW_S)
        self.assertEqual(code, 0, err)
        lines = self.straggler_lines(err)
        self.assertTrue(lines, err)
        self.assertRegex(lines[0], r"straggler: rank 1 \(node [^,]+, local rank 1\) arrives last")
        self.assertRegex(lines[0], rf"the others spent \d+% of the last {WINDOW_S} s waiting for rank 1")
        self.assertIn("in its own compute", lines[0])
        self.assertGreater(summary["stragglers"][0]["cost_share"], 0.1)

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    def test_a_rank_that_stalls_every_tenth_step_is_named(self):
        code, err, _ = self.launch("periodic", 3 * WINDOW_S)
        self.assertEqual(code, 0, err)
        lines = self.straggler_lines(err)
        self.assertTrue(lines, err)
        self.assertRegex(lines[0], r"straggler: rank 1 \(node [^,]+, local rank 1\) arrives last")

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    @unittest.skipUnless(os.path.isdir(CGROUP_V1_CPU) and os.geteuid() == 0,
                         "needs root and cgroup v1's cpu controller")
    def test_a_rank_throttled_by_its_cgroups_cpu_quota_is_named_with_the_quota(self):
        # Once the job runs, rank 2 moves into a cgroup with 15 % of a core, as a Kubernetes CPU
        # limit puts a pod: it needs a third of a core, so CFS throttles it most periods.
        cgroup = os.path.join(CGROUP_V1_CPU, f"mcprun-test-{os.getpid()}")
        os.mkdir(cgroup)
        self.addCleanup(remove_cgroup, cgroup)
        with open(os.path.join(cgroup, "cpu.cfs_quota_us"), "w") as f:
            # Of the default 100 ms period: under the quarter of a core each rank gets beside a CPU
            # hog on 2 cores, so that the quota, not the box, is what the rank runs short of.
            f.write("15000")
        summary_path = os.path.join(self.tmp, "summary.json")
        env = dict(self.env, SCENARIO="throttled", DURATION_S=str(3 * WINDOW_S))
        proc = self.start("-n", "3", "--straggler-window", str(WINDOW_S), "--summary-json",
                          summary_path, self.script("train.py", TRAIN), env=env)
        pid_file = os.path.join(self.tmp, "pid.2")
        self.assertTrue(wait_for(lambda: os.path.exists(pid_file) or proc.poll() is not None, 60))
        with open(pid_file) as f, open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write(f.read().strip())
        _, err = proc.communicate(timeout=3 * WINDOW_S + 120)
        self.assertEqual(proc.returncode, 0, err)
        lines = self.straggler_lines(err)
        self.assertTrue(lines, err)
        self.assertRegex(lines[0], r"straggler: rank 2 \(node [^,]+, local rank 2\) arrives last")
        self.assertRegex(lines[0], r"throttled by its cgroup's CPU quota \(15% of a core\): "
                                   r"throttled in \d+% of its periods")


def remove_cgroup(path):
    """Moves what is left in a test's cgroup back to the root one, then removes it."""
    with open(os.path.join(path, "cgroup.procs")) as f:
        pids = f.read().split()
    for pid in pids:
        try:
            with open(os.path.join(CGROUP_V1_CPU, "cgroup.procs"), "w") as root:
                root.write(pid)
        except OSError:
            pass  # It exited meanwhile.
    os.rmdir(path)


def png_colours(path):
    """The set of (r, g, b) in a non-interlaced 8-bit RGB or RGBA PNG, as Chromium writes them."""
    with open(path, "rb") as f:
        data = f.read()
    position, chunks, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        body = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        position += 12 + length
    width, height, depth, colour_type, _, _, interlace = header
    assert depth == 8 and colour_type in (2, 6) and not interlace, header
    channels = 3 if colour_type == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * channels
    previous, colours = bytearray(stride), set()
    for row in range(height):
        kind = raw[row * (stride + 1)]
        line = bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                guess = left + up - up_left
                nearest = min((abs(guess - left), 0, left), (abs(guess - up), 1, up),
                              (abs(guess - up_left), 2, up_left))[2]
                line[i] = (line[i] + nearest) & 0xFF
        colours.update(tuple(line[i:i + 3]) for i in range(0, stride, channels))
        previous = line
    return colours


def metrics_url(proc):
    """The URL mcprun's info line gives, once it has written it (stderr, read line by line)."""
    line = proc.stderr.readline()
    found = re.search(r"metrics: (http://\S+/metrics)", line)
    return found.group(1) if found else None


def scrape(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.read().decode()
    except OSError:
        return ""


def sample(metrics, name, rank):
    found = re.search(rf'^{name}{{rank="{rank}",[^}}]*}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else float("nan")


def load_tests(loader, tests, pattern):
    """The suite as `unittest test_stragglers` runs it. ctest runs CpuHogTest on its own, with
    nothing beside it: its busy loops would take the CPU from the suites beside it, and theirs
    the CPU its rank 0 must have to itself."""
    return loader.loadTestsFromTestCase(StragglerTest)


class CpuHogTest(StragglerCase):
    """A rank that another process starves of CPU, once the job runs."""

    @unittest.skipUnless(TORCH2, "torch 1.x names no straggler")
    @unittest.skipUnless(os.cpu_count() >= 2 and shutil.which("taskset"), "needs two CPUs and taskset")
    def test_a_rank_whose_cpu_a_hog_takes_is_named_starved_with_the_hog(self):
        # Once the job runs, rank 0 gets CPU 0 to itself; rank 1 shares CPU 1 with two busy loops.
        summary_path = os.path.join(self.tmp, "summary.json")
        env = dict(self.env, SCENARIO="cpu_bound", DURATION_S=str(4 * WINDOW_S))
        proc = self.start("-n", "2", "--straggler-window", str(WINDOW_S), "--summary-json",
                          summary_path, self.script("train.py", TRAIN), env=env)
        pid_files = [os.path.join(self.tmp, f"pid.{rank}") for rank in (0, 1)]
        self.assertTrue(wait_for(lambda: all(map(os.path.exists, pid_files)) or proc.poll() is not None, 60))
        pids = []
        for path in pid_files:
            with open(path) as f:
                pids.append(f.read().strip())
        for cpu, pid in zip("01", pids):
            subprocess.run(["taskset", "-a", "-p", "-c", cpu, pid], check=True, capture_output=True)
        hogs = [subprocess.Popen(["taskset", "-c", "1", "sh", "-c", "while :; do :; done"],
                                 start_new_session=True) for _ in range(2)]
        self.procs += hogs
        _, err = proc.communicate(timeout=4 * WINDOW_S + 120)
        self.assertEqual(proc.returncode, 0, err)
        lines = self.straggler_lines(err)
        self.assertTrue(lines, err)
        self.assertRegex(lines[0], r"straggler: rank 1 \(node [^,]+, local rank 1\) arrives last")
        self.assertRegex(lines[0], r"starved of CPU: it waited for a CPU \d+% of the time, the others \d+%")
        self.assertRegex(lines[0], r"busiest beside it: pid (%s) \(sh\)" % "|".join(str(h.pid) for h in hogs))
        with open(summary_path) as f:
            self.assertIn("starved of CPU", json.load(f)["stragglers"][0]["cause"])
