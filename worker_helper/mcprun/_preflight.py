"""mcprun's preflight: a bounded collective check over the job's own ranks, before its script.

mcprun starts `python -m mcprun._preflight` as every rank of the job (same spawn path, pinning,
binding and environment as the script) when --preflight is given. Each step has a budget, and
every wait in it ends at the budget's end, however slow the link (a wait that makes a little
progress never runs into gloo's own timeout):

  init        a process group of the whole world (NCCL where the ranks have GPUs, else gloo);
  all-reduce  a few sizes, latency- to bandwidth-bound, each larger one only while the last one
              finished well inside the budget; bus bandwidth as nccl-tests reports it
              (busbw = size / time * 2(n-1)/n);
  pairs       every pair of ranks exchanges data, one round-robin round at a time (n-1 rounds),
              each round within its own budget: the comparison that names a slow or dead rank,
              node or link;
  liveness    after a failed step, who still answers through the job store.

The launcher passes the whole check's end ($MCPRUN_PREFLIGHT_END, on this node's monotonic clock)
and stops what is still running past it.

Rank 0 judges and publishes the report under the store's "mcprun/preflight/" keys, which the
launcher erases before the script starts; local rank 0 of every node writes it to
$MCPRUN_PREFLIGHT_REPORT for its launcher. Nothing here touches the default process group, and the
process ends with os._exit: no process group, CUDA context or thread outlives it.
"""
import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
import traceback
from datetime import timedelta

KEY_PREFIX = "mcprun/preflight/"
# A node or rank is slow when the median bandwidth of its pairs is below the median of the pairs
# that do not touch it divided by this. On a busy box one pair's figure moves by up to 4x from run
# to run; a bad link (an x8 slot, a 10 Gb/s port among 100) or a throttled host is further off.
SLOW_FACTOR = 4.0
# The pairs that do not touch a node (or rank) it takes to compare it with by medians; with fewer
# (3 nodes of one rank each), every pair that touches it must be slower than every pair that does not.
MIN_OTHER_PAIRS = 2
# A pair across nodes is slow when it moves less than this share of the slower end's interface
# speed (/sys/class/net/<if>/speed). gloo's 1 MiB ping-pong moves 60-150 % of a veth's stated
# 10 Gb/s on a 2-core box, and about 8 % beside CPU hogs; a link cut to 100 Mbit/s moves 1 %.
NOMINAL_SHARE = 0.02
# How long rank 0 waits for the ranks' word through the store after a failed step: the store is
# a launcher's socket, so a rank that can answer does so within milliseconds.
LIVENESS_GRACE_S = 2.0
CPU_SIZES = [4 << 10, 256 << 10, 16 << 20]
GPU_SIZES = [4 << 10, 1 << 20, 64 << 20]
PAIR_BYTES = 1 << 20
# A pair's first measure, which says whether PAIR_BYTES fits the round's budget.
PROBE_BYTES = 64 << 10
# Each pair's figure is its best of up to this many exchanges: a busy core delays one, not all.
PAIR_REPEATS = 5
# Per all-reduce size: at most this many timed iterations, within about this many seconds.
MAX_ITERS = 10
SIZE_BUDGET_S = 0.4
# A larger all-reduce size runs only when the last one, scaled by size, would take at most this
# share of the step's deadline: sizes grow while each finishes well inside it.
GROWTH_SHARE = 1 / 8
# A pair's exchanges use at most this share of what is left of its round.
PAIR_SHARE = 0.5


class StepTimeout(Exception):
    """A step's budget ran out while a collective was still moving (or waiting): a finding."""


def finish(work, until):
    """Waits for `work` until the monotonic time `until`, and no longer: StepTimeout past it.
    Other failures (a peer gone, gloo's own timeout) are raised as they are."""
    left = until - time.monotonic()
    if left <= 0 and not work.is_completed():
        raise StepTimeout("its budget ran out")
    try:
        work.wait(timedelta(seconds=max(left, 0.001)))
    except RuntimeError:
        if not work.is_completed() and time.monotonic() >= until - 0.01:
            raise StepTimeout("its budget ran out") from None
        raise


def human_bytes(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def gbps(value):
    """Bytes/s as GB/s, as nccl-tests prints it."""
    return f"{value / 1e9:.3g}" if value is not None else "-"


def median(values):
    values = sorted(values)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def round_robin(ranks):
    """The circle method: every pair of `ranks` meets once, in len(ranks)-1 rounds (one more when
    odd, where each round one rank sits out)."""
    players = list(ranks) + ([None] if len(ranks) % 2 else [])
    rounds = []
    for _ in range(len(players) - 1):
        half = len(players) // 2
        pairs = [(players[i], players[-1 - i]) for i in range(half)]
        rounds.append([tuple(sorted(p)) for p in pairs if None not in p])
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


class Check:
    """One rank's preflight."""

    def __init__(self):
        env = os.environ
        self.rank = int(env["RANK"])
        self.world = int(env["WORLD_SIZE"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.deadline = float(env.get("MCPRUN_PREFLIGHT_TIMEOUT", "10"))
        self.round_s = float(env.get("MCPRUN_PREFLIGHT_ROUND_TIMEOUT", str(max(2.0, self.deadline / 4))))
        # The whole check's end, which the launcher enforces: every wait here ends before it.
        self.end = float(env.get("MCPRUN_PREFLIGHT_END", str(time.monotonic() + 3600)))
        self.min_busbw = float(env.get("MCPRUN_PREFLIGHT_MIN_BUSBW", "0")) * 1e9
        # Process groups with an exchange still pending are kept: their destructor would wait.
        self.groups = []
        self.report_path = env.get("MCPRUN_PREFLIGHT_REPORT", "")
        node = {}
        if env.get("MCPRUN_PREFLIGHT_NODE"):
            with open(env["MCPRUN_PREFLIGHT_NODE"]) as f:
                node = json.load(f)
        self.node = node.get("node", socket.gethostname())
        self.gpu = node.get("gpus", {}).get(str(self.local_rank))
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.backend = ("nccl" if self.gpu is not None and torch.cuda.is_available()
                        and dist.is_nccl_available() else "gloo")
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank if torch.cuda.device_count() > self.local_rank else 0)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.steps = []
        # No world size: a client given one counts itself in the script's "init/" key.
        with self.bounded(self.deadline):
            self.tcp_store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]),
                                           is_master=False, timeout=timedelta(seconds=self.deadline))
        # Each pass (the NCCL retries are passes too) has keys of its own.
        self.store = dist.PrefixStore(KEY_PREFIX + env.get("MCPRUN_PREFLIGHT_PASS", "0"),
                                      self.tcp_store)

    # -- the store: small JSON values, every wait bounded ------------------------------------
    def bounded(self, seconds, step=None):
        """A watchdog over one blocking call: torch 2.x's store client waits on a link that went
        dead without its timeout (and an NCCL collective may never return), so past `seconds`
        and a grace this rank gives up for good, with a report of its own."""
        return _Watchdog(seconds + LIVENESS_GRACE_S, lambda: self.finish_without_store(step))

    def bounded_op(self, seconds, step):
        """gloo's collectives keep their own deadline; NCCL's get the watchdog."""
        return self.bounded(seconds, step) if self.backend == "nccl" else _NoWatchdog()

    def put(self, key, value):
        """False when the store no longer answers."""
        try:
            with self.bounded(self.deadline):
                self.store.set(key, json.dumps(value))
            return True
        except Exception:
            return False

    def left(self, reserve_s=0.0):
        """Seconds until the check's end, less `reserve_s`."""
        return self.end - reserve_s - time.monotonic()

    def get(self, key, timeout_s):
        timeout_s = max(min(timeout_s, self.left(0.5)), 0.05)
        try:
            with self.bounded(timeout_s):
                self.store.wait([key], timedelta(seconds=timeout_s))
                return json.loads(self.store.get(key))
        except Exception:  # A timeout or a lost store: the caller says what it means.
            return None

    def store_patience(self, seconds):
        """How long the store's own waits last (a process group's rendezvous uses them)."""
        self.tcp_store.set_timeout(timedelta(seconds=seconds))

    def gather(self, prefix, ranks, timeout_s):
        """Each of `ranks`' value under prefix/<rank>, as far as they came within `timeout_s`."""
        end = time.monotonic() + timeout_s
        found = {}
        for rank in ranks:
            value = self.get(f"{prefix}/{rank}", end - time.monotonic())
            if value is not None:
                found[rank] = value
        return found

    # -- process groups, never the default one ---------------------------------------------
    def process_group(self, name, rank, size, timeout_s):
        store = self.dist.PrefixStore(name, self.store)
        timeout = timedelta(seconds=timeout_s)
        if self.backend == "gloo":
            return self.dist.ProcessGroupGloo(store, rank, size, timeout)
        try:  # torch 2.x
            options = self.dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return self.dist.ProcessGroupNCCL(store, rank, size, options)
        except (AttributeError, TypeError):  # torch 1.13
            return self.dist.ProcessGroupNCCL(store, rank, size, timeout)

    def sync(self):
        if self.backend == "nccl":
            self.torch.cuda.synchronize()

    # -- the steps -------------------------------------------------------------------------
    def identify(self):
        """What the report's table shows of this rank: node, GPU, link, interface."""
        interface = os.environ.get("NCCL_SOCKET_IFNAME" if self.backend == "nccl"
                                   else "GLOO_SOCKET_IFNAME", "")
        address = ""
        try:  # The route to the store, as the doctor finds it: no packet is sent.
            probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            probe.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
            address = probe.getsockname()[0]
            probe.close()
        except OSError:
            pass
        device = interface or interface_of(address)
        return self.put(f"info/{self.rank}", {"node": self.node, "local_rank": self.local_rank,
                                       "gpu": self.gpu, "interface": interface or "route",
                                       "address": address, "backend": self.backend,
                                       "speed_mbps": interface_speed(device)})

    def init_world(self):
        start = time.monotonic()
        try:
            with self.bounded(self.deadline, "init"):
                self.pg = self.process_group("world", self.rank, self.world, self.deadline)
                # NCCL connects lazily: a first all-reduce makes the init step a real one.
                finish(self.pg.allreduce([self.torch.ones(1, device=self.device)]), start + self.deadline)
                self.sync()
            self.steps.append({"step": "init", "ok": True, "seconds": time.monotonic() - start})
        except Exception as error:  # A timeout, a refused peer: the step failed, and why.
            self.steps.append({"step": "init", "ok": False, "seconds": time.monotonic() - start,
                               "error": one_line(error)})
            return False
        if self.rank == 0:
            print(f"mcprun preflight: process group of {self.world} ranks ({self.backend}) in "
                  f"{time.monotonic() - start:.2f} s", file=sys.stderr, flush=True)
        return True

    def sizes(self):
        if self.backend != "nccl":
            return CPU_SIZES
        free, _ = self.torch.cuda.mem_get_info()
        # Two buffers must fit in an eighth of the free memory, whatever the others use.
        return [s for s in GPU_SIZES if 2 * s <= free // 8] or GPU_SIZES[:1]

    def all_reduce(self):
        """Each size in turn while the last, scaled by size, would finish well inside the
        deadline; every wait ends at the step's end. The ranks decide alike: on agreed figures."""
        results = []
        start = time.monotonic()
        until = start + self.deadline
        last = None
        size = None
        try:
            for size in self.sizes():
                if last is not None:
                    predicted = last["seconds"] * size / last["bytes"]
                    if predicted > GROWTH_SHARE * self.deadline:
                        results.append({"bytes": size, "skipped": True, "predicted_s": predicted})
                        break
                with self.bounded_op(self.deadline, "all-reduce"):
                    last = self.time_all_reduce(size, until)
                results.append(last)
            self.steps.append({"step": "all-reduce", "ok": True, "sizes": results,
                               "seconds": time.monotonic() - start})
            return True
        except Exception as error:
            timed_out = isinstance(error, StepTimeout)
            if timed_out:
                results.append({"bytes": size, "unfinished": True})
                error = f"{human_bytes(size)} did not finish within the {self.deadline:g} s deadline"
            self.steps.append({"step": "all-reduce", "ok": False, "sizes": results, "timed_out": timed_out,
                               "seconds": time.monotonic() - start, "error": one_line(error)})
            return False

    def agree(self, value, until):
        """The largest of every rank's `value`."""
        tensor = self.torch.tensor([value], device=self.device)
        finish(self.pg.allreduce([tensor], max_op(self.dist)), until)
        return tensor.item()

    def time_all_reduce(self, size, until):
        data = self.torch.ones(size // 4, dtype=self.torch.float32, device=self.device)
        t0 = time.monotonic()
        finish(self.pg.allreduce([data]), until)
        self.sync()
        # Every rank must run as many iterations: they agree on the slowest warm-up.
        warmup = self.agree(time.monotonic() - t0, until)
        iters = max(1, min(MAX_ITERS, int(SIZE_BUDGET_S / max(warmup, 1e-6))))
        t0 = time.monotonic()
        for _ in range(iters):
            finish(self.pg.allreduce([data]), until)
        self.sync()
        seconds = self.agree((time.monotonic() - t0) / iters, until)
        return {"bytes": size, "seconds": seconds, "iters": iters}

    def pairs(self, live):
        """This rank's exchanges with each live partner, one round-robin round at a time, each
        round within round_s; rounds that would end past the check's end are left out."""
        results = []
        start = time.monotonic()
        for number, round_pairs in enumerate(round_robin(live)):
            pair = next((p for p in round_pairs if self.rank in p), None)
            if pair is None:
                continue
            if self.left(self.reserve_s()) < self.round_s:
                results.append({"peer": pair[1 - pair.index(self.rank)], "ok": True, "bw": None,
                                "skipped": True})
                continue
            results.append(self.measure_pair(number, pair))
        ok = all(r["ok"] for r in results)
        self.steps.append({"step": "pairs", "ok": ok, "pairs": results,
                           "seconds": time.monotonic() - start})
        return ok

    def timed_exchange(self, pg, tensor, me, until):
        t0 = time.monotonic()
        exchange(pg, tensor, me, until)
        self.sync()
        return max(time.monotonic() - t0, 1e-9)

    def reserve_s(self):
        """What the check keeps after the pairs: the results' gathering and the report."""
        return self.round_s + 2 * LIVENESS_GRACE_S

    def measure_pair(self, number, pair):
        """A ping-pong with one partner within one round: a small one (which connects), a probe of
        PROBE_BYTES, then as many PAIR_BYTES exchanges as fit (the probe's size where even one
        would not). Whatever finished in time is the figure; none at all is a dead pair."""
        me = pair.index(self.rank)
        peer = pair[1 - me]
        t0 = time.monotonic()
        until = t0 + self.round_s
        best = None
        try:
            self.store_patience(self.round_s)
            try:
                with self.bounded(self.round_s):
                    pg = self.process_group(f"pair/{number}/{pair[0]}-{pair[1]}", me, 2, self.round_s)
            finally:
                self.store_patience(self.deadline)
            self.groups.append(pg)
            with self.bounded_op(self.round_s, "pairs"):
                exchange(pg, self.torch.ones(1, device=self.device), me, until)
                probe = self.torch.ones(PROBE_BYTES // 4, dtype=self.torch.float32, device=self.device)
                took = self.timed_exchange(pg, probe, me, until)
                best = 2 * PROBE_BYTES / took
                size, repeats = self.plan_pair(pg, me, took, until)
                data = probe if size == PROBE_BYTES else self.torch.ones(
                    size // 4, dtype=self.torch.float32, device=self.device)
                for _ in range(repeats):
                    best = max(best, 2 * size / self.timed_exchange(pg, data, me, until))
            return {"peer": peer, "ok": True, "bw": best}
        except Exception as error:
            if best is not None:  # Slow, not dead: what finished is the figure.
                return {"peer": peer, "ok": True, "bw": best}
            if isinstance(error, StepTimeout):
                error = f"no exchange within the round's {self.round_s:g} s"
            return {"peer": peer, "ok": False, "seconds": time.monotonic() - t0,
                    "error": one_line(error)}

    def plan_pair(self, pg, me, probe_s, until):
        """The lower rank decides the size and count of the timed exchanges from its probe, and
        sends them: both sides must post the same ones."""
        plan = self.torch.zeros(2, dtype=self.torch.float32, device=self.device)
        if me == 0:
            budget = PAIR_SHARE * (until - time.monotonic())
            full = probe_s * PAIR_BYTES / PROBE_BYTES
            size, each = (PAIR_BYTES, full) if full <= budget / 2 else (PROBE_BYTES, probe_s)
            plan[0], plan[1] = size, min(PAIR_REPEATS, int(budget / max(each, 1e-6)))
        exchange(pg, plan, me, until)
        return int(plan[0].item()), int(plan[1].item())

    def liveness(self, step, started):
        """After a failed step: who still answers through the store. Every rank that timed out
        has by the step's deadline; rank 0 waits that long and a grace, then publishes the
        ranks that go on, and the others wait for that word."""
        if not self.put(f"alive/{step}/{self.rank}", True):
            return None
        if self.rank == 0:
            patience = started + self.deadline + LIVENESS_GRACE_S - time.monotonic()
            live = sorted(self.gather(f"alive/{step}", range(self.world), max(patience, LIVENESS_GRACE_S)))
            return live if self.put(f"live/{step}", live) else None
        return self.get(f"live/{step}", self.deadline + 2 * LIVENESS_GRACE_S)

    def run(self):
        if not self.identify():
            return self.finish_without_store()
        live = list(range(self.world))
        started = time.monotonic()
        if not self.init_world():
            live = self.liveness("init", started)
        else:
            started = time.monotonic()
            if not self.all_reduce():
                live = self.liveness("all-reduce", started)
        if live is None or self.rank not in live:  # Not heard by rank 0: no verdict to hear.
            return self.finish_without_store()
        self.pairs(live)
        if not self.put(f"result/{self.rank}", {"steps": self.steps}):
            return self.finish_without_store()
        if self.rank == 0:
            # A rank comes late by its last round's budget at most; the report needs a moment.
            results = self.gather("result", live, min(self.round_s + LIVENESS_GRACE_S,
                                                      self.left(LIVENESS_GRACE_S)))
            report = judge(self, live, results)
            self.put("report", report)
            # Every node's first local rank takes the report before rank 0 leaves.
            self.gather("taken", [r for r in sorted(results) if r != 0], self.deadline)
        else:
            report = self.get("report", self.round_s + 3 * LIVENESS_GRACE_S)
            if report is None:
                return self.finish_without_store()
            self.put(f"taken/{self.rank}", True)
        self.write(report)
        return 0

    def finish_without_store(self, hung_step=None):
        """This rank lost the job store (or rank 0), or a step hung past every deadline: it
        cannot hear the verdict, so its own is that this node cannot reach the job."""
        if hung_step:
            verdict = (f"FAIL: {self.node} (rank {self.rank}): the {hung_step} step hung past its "
                       f"{self.deadline:g} s deadline ({self.backend})")
            fault = {"kind": "dead", "what": "step", "name": hung_step}
        else:
            master = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
            failed = next((s for s in self.steps if not s["ok"]), None)
            what = f"the {failed['step']} step failed ({failed.get('error', '')}) and " if failed else ""
            verdict = (f"FAIL: {self.node} (rank {self.rank}) lost the job: {what}the job store at "
                       f"{master} (rank 0's node) no longer answers; check this node's link to it")
            fault = {"kind": "dead", "what": "node", "name": self.node}
        self.write({"ok": False, "dead": True, "backend": getattr(self, "backend", "gloo"),
                    "verdict": verdict, "faults": [fault], "text": f"mcprun preflight: {verdict}\n"})
        return 0

    def write(self, report):
        if self.local_rank != 0 or not self.report_path:
            return
        tmp = self.report_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f)
        os.replace(tmp, self.report_path)


class _NoWatchdog:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Watchdog:
    """Calls `give_up` and ends the process unless the block it guards ends within `seconds`."""

    def __init__(self, seconds, give_up):
        self.timer = threading.Timer(seconds, self.expire, args=(give_up,))
        self.timer.daemon = True

    @staticmethod
    def expire(give_up):
        try:
            give_up()
        finally:
            sys.stderr.flush()
            os._exit(0)

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        return False



def max_op(dist):
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    return options


def exchange(pg, tensor, me, until):
    """A ping-pong: the lower rank sends first, the higher answers; each wait ends by `until`."""
    if me == 0:
        finish(pg.send([tensor], 1, 0), until)
        finish(pg.recv([tensor], 1, 1), until)
    else:
        finish(pg.recv([tensor], 0, 0), until)
        finish(pg.send([tensor], 0, 1), until)


def interface_of(address):
    """The interface that holds IPv4 `address`, or "" (SIOCGIFADDR on each interface)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    finally:
        probe.close()
    return ""


def interface_speed(name):
    """The interface's nominal speed in Mb/s, as its driver states it; None where it states none
    (loopback, bridges, a link that is down)."""
    if not name or name == "lo":
        return None
    try:
        with open(f"/sys/class/net/{name}/speed") as f:
            speed = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def one_line(error):
    text = " ".join(str(error).split())
    return text[:300]


# -- judging: rank 0 only ------------------------------------------------------------------
def judge(check, live, results):
    world = check.world
    infos = check.gather("info", range(world), LIVENESS_GRACE_S)
    live = sorted(results)  # A rank with no result in time is as good as dead.
    node_of = {r: infos.get(r, {}).get("node", f"rank{r}") for r in range(world)}
    steps = {r: {s["step"]: s for s in results.get(r, {}).get("steps", [])} for r in range(world)}

    # Pair bandwidths, from the lower rank's side (both measured the same exchange).
    pairs = {}
    for r in live:
        for p in steps[r].get("pairs", {}).get("pairs", []):
            if p.get("skipped"):
                continue
            a, b = sorted((r, p["peer"]))
            if (a, b) not in pairs or r == a:
                pairs[(a, b)] = p.get("bw") if p["ok"] else None

    faults = []
    dead_ranks = [r for r in range(world) if r not in live]
    faults += attribute(dead_ranks, node_of, range(world), "dead")
    # Pairs with a rank already dead say nothing more about it.
    dead_pairs = [k for k, v in pairs.items() if v is None and k[0] in live and k[1] in live]
    faults += attribute_pairs(dead_pairs, pairs, node_of, "dead")
    faults += slow_faults(pairs, node_of, [f["name"] for f in faults], check.backend == "nccl")
    if check.backend == "gloo":  # NCCL's pairs travel NVLink or InfiniBand, not the socket's NIC.
        faults += nominal_faults(pairs, infos, node_of, [f["name"] for f in faults])
    faults += pcie_faults(infos)

    allreduce = all_reduce_figures(steps, live, world)
    measured = [f for f in allreduce if f.get("busbw")]
    floor = measured[-1]["busbw"] if measured else None
    if check.min_busbw and floor is not None and floor < check.min_busbw:
        faults.append({"kind": "slow", "what": "job", "name": "all-reduce", "busbw": floor,
                       "bytes": measured[-1]["bytes"], "min_busbw": check.min_busbw})
    failed_steps = sorted({s["step"] for r in live for s in steps[r].values() if not s["ok"]})
    if failed_steps and not faults:
        step = failed_steps[0]
        # Past its budget with every rank alive and every pair measured: slow, not dead.
        slow = all(steps[r].get(step, {}).get("timed_out", True) for r in live if step in steps[r])
        faults.append({"kind": "slow" if slow else "dead", "what": "step", "name": step,
                       "detail": first_error(steps, step)})
    verdict = verdict_line(faults, allreduce, infos, node_of, check)
    report = {
        "ok": not faults,
        "dead": any(f["kind"] == "dead" for f in faults),
        "backend": check.backend,
        "world_size": world,
        "nodes": sorted(set(node_of.values())),
        "deadline_s": check.deadline,
        "ranks": [dict(rank=r, **infos.get(r, {"node": node_of[r]})) for r in range(world)],
        "steps": {name: step_summary(steps, live, name) for name in ("init", "all-reduce", "pairs")},
        "all_reduce": allreduce,
        "pairs": [{"ranks": [a, b], "bw": v} for (a, b), v in sorted(pairs.items())],
        "slow_rule": f"a node (or, on GPUs, a rank within its node) is slow when its pairs' median "
                     f"bandwidth is below 1/{SLOW_FACTOR:g} of the median of the "
                     f"{MIN_OTHER_PAIRS} or more pairs that do not touch it; a GPU when its PCIe "
                     f"link is narrower than its node's other GPUs'",
        "faults": faults,
        "floor_busbw": floor,
        "floor_bytes": measured[-1]["bytes"] if measured else None,
        "pairs_not_measured": sum(1 for r in live for p in steps[r].get("pairs", {}).get("pairs", [])
                                  if p.get("skipped") and r < p["peer"]),
        "verdict": verdict,
    }
    report["text"] = format_report(report, infos, pairs, node_of)
    return report


def first_error(steps, name):
    for per_rank in steps.values():
        if name in per_rank and not per_rank[name]["ok"]:
            return per_rank[name].get("error", "")
    return ""


def step_summary(steps, live, name):
    seen = [steps[r][name] for r in live if name in steps[r]]
    if not seen:
        return {"ran": False}
    return {"ran": True, "ok": all(s["ok"] for s in seen),
            "seconds": max(s["seconds"] for s in seen)}


def all_reduce_figures(steps, live, world):
    """Per size: the slowest rank's time, and nccl-tests' algbw and busbw from it; a size left
    out (its predecessor was too slow to grow) or unfinished at the deadline says so instead."""
    per_size, unmeasured = {}, {}
    for r in live:
        for entry in steps[r].get("all-reduce", {}).get("sizes", []):
            if "seconds" in entry:
                per_size[entry["bytes"]] = max(per_size.get(entry["bytes"], 0), entry["seconds"])
            elif entry.get("bytes") is not None:
                unmeasured.setdefault(entry["bytes"], entry)
    figures = []
    for size, seconds in sorted(per_size.items()):
        algbw = size / seconds if seconds > 0 else None
        busbw = algbw * 2 * (world - 1) / world if algbw and world > 1 else algbw
        figures.append({"bytes": size, "seconds": seconds, "algbw": algbw, "busbw": busbw})
    for size, entry in sorted(unmeasured.items()):
        if size not in per_size:
            figures.append({"bytes": size, "seconds": None, "algbw": None, "busbw": None,
                            "skipped" if entry.get("skipped") else "unfinished": True,
                            **({"predicted_s": entry["predicted_s"]} if "predicted_s" in entry else {})})
    return figures


def attribute(bad_ranks, node_of, all_ranks, kind):
    """Dead ranks, grouped: a node whose every rank is bad is named as the node."""
    faults = []
    by_node = {}
    for r in all_ranks:
        by_node.setdefault(node_of[r], []).append(r)
    named = set()
    for node, ranks in by_node.items():
        if ranks and all(r in bad_ranks for r in ranks) and len(by_node) > 1:
            faults.append({"kind": kind, "what": "node", "name": node, "ranks": ranks})
            named.update(ranks)
    for r in bad_ranks:
        if r not in named:
            faults.append({"kind": kind, "what": "rank", "name": f"rank {r}", "ranks": [r],
                           "node": node_of[r]})
    return faults


def attribute_pairs(bad_pairs, pairs, node_of, kind):
    """Bad pairs, explained by the fewest things they share: a node (every pair across it bad,
    some other pair good), a rank, else each link."""
    if not bad_pairs:
        return []
    faults = []
    left = set(bad_pairs)
    good = [k for k, v in pairs.items() if v is not None]
    for what, key in (("node", lambda r: node_of[r]), ("rank", lambda r: r)):
        members = {}
        for a, b in pairs:
            for side, other in ((a, b), (b, a)):
                if key(side) != key(other):
                    members.setdefault(key(side), set()).add((a, b))
        for name, touching in members.items():
            bad = touching & left
            if bad and bad == touching and any(k not in touching for k in good):
                ranks = sorted({r for k in touching for r in k if key(r) == name})
                faults.append({"kind": kind, "what": what,
                               "name": name if what == "node" else f"rank {name}", "ranks": ranks})
                left -= touching
    for a, b in sorted(left):
        faults.append({"kind": kind, "what": "link", "name": f"rank {a} - rank {b}",
                       "ranks": [a, b], "nodes": [node_of[a], node_of[b]]})
    return faults


def slow_faults(pairs, node_of, already, judge_ranks):
    """The slow rule, first for nodes across the network, then (GPUs only) ranks within a node.
    CPU ranks of one node share its memory: what sets them apart is only what else the cores
    run (on a busy box up to 7x between two loopback pairs), never a link."""
    faults = []
    measured = {k: v for k, v in pairs.items() if v is not None}
    across = {k: v for k, v in measured.items() if node_of[k[0]] != node_of[k[1]]}
    within = {k: v for k, v in measured.items() if node_of[k[0]] == node_of[k[1]]}
    rules = [("node", across, lambda r: node_of[r])]
    if judge_ranks:
        rules.append(("rank", within, lambda r: r))
    for what, group, key in rules:
        names = sorted({key(r) for k in group for r in k}, key=str)
        for name in names:
            touching = [v for k, v in group.items() if name in (key(k[0]), key(k[1]))]
            others = [v for k, v in group.items() if name not in (key(k[0]), key(k[1]))]
            label = name if what == "node" else f"rank {name}"
            if not touching or label in already:
                continue
            if len(others) >= MIN_OTHER_PAIRS:
                slow = median(touching) * SLOW_FACTOR < median(others)
            else:  # Three nodes of one rank each: the one pair without it outruns all of its own.
                slow = bool(others) and what == "node" and len(names) >= 3 and \
                    max(touching) * SLOW_FACTOR < min(others)
            if slow:
                ranks = sorted({r for k in group for r in k if key(r) == name})
                faults.append({"kind": "slow", "what": what, "name": label, "ranks": ranks,
                               "bw": median(touching), "others_bw": median(others)})
    return faults


def nominal_faults(pairs, infos, node_of, already):
    """Pairs across nodes that move less than NOMINAL_SHARE of their interfaces' stated speed,
    explained by the fewest things they share: a node whose every such pair is slow while a pair
    without it is not, else the link between two nodes (with two nodes, always the link)."""
    across = {k: v for k, v in pairs.items() if v is not None and node_of[k[0]] != node_of[k[1]]}
    nominal = {}
    for a, b in across:
        speeds = [infos.get(r, {}).get("speed_mbps") for r in (a, b)]
        if all(speeds):
            nominal[(a, b)] = min(speeds) * 1e6 / 8
    slow = {k for k, bps in nominal.items() if across[k] < NOMINAL_SHARE * bps}
    faults = []
    nodes = sorted({node_of[r] for k in across for r in k})
    for node in nodes if len(nodes) >= 3 else []:
        touching = {k for k in across if node in (node_of[k[0]], node_of[k[1]])}
        if node not in already and touching and touching <= slow and (set(across) - touching) - slow:
            faults.append(slow_link_fault("node", node, touching, across, nominal, node_of))
            slow -= touching
    links = {}
    for k in slow:
        links.setdefault(tuple(sorted((node_of[k[0]], node_of[k[1]]))), set()).add(k)
    for (a, b), keys in sorted(links.items()):
        if a not in already and b not in already:
            faults.append(slow_link_fault("link", f"{a} - {b}", keys, across, nominal, node_of))
    return faults


def slow_link_fault(what, name, keys, across, nominal, node_of):
    ranks = sorted({r for k in keys for r in k} if what == "link" else
                   {r for k in keys for r in k if node_of[r] == name})
    return {"kind": "slow", "what": what, "name": name, "ranks": ranks, "rule": "nominal",
            "bw": median([across[k] for k in keys]), "nominal_bw": min(nominal[k] for k in keys),
            "nodes": sorted({node_of[r] for k in keys for r in k})}


def pcie_faults(infos):
    """A GPU whose PCIe link is narrower than its node's other GPUs' links: its neighbours are
    the yardstick, not a spec sheet (an idle GPU lowers its speed, never its width)."""
    by_node = {}
    for rank, info in sorted(infos.items()):
        gpu = info.get("gpu") or {}
        if gpu.get("link_width"):
            by_node.setdefault(info.get("node"), {})[gpu["bus_id"]] = (rank, gpu)
    faults = []
    for node, gpus in by_node.items():
        widest = max(gpu["link_width"] for _, gpu in gpus.values())
        for bus_id, (rank, gpu) in gpus.items():
            if gpu["link_width"] < widest:
                faults.append({"kind": "slow", "what": "gpu", "name": f"GPU {bus_id}", "ranks": [rank],
                               "node": node, "width": gpu["link_width"], "others_width": widest})
    return faults


def verdict_line(faults, allreduce, infos, node_of, check):
    measured = [f for f in allreduce if f.get("busbw")]
    figure = (f"all-reduce busbw {gbps(measured[-1]['busbw'])} GB/s at "
              f"{human_bytes(measured[-1]['bytes'])}" if measured else "no all-reduce figure")
    if not faults:
        return f"OK: no rank, GPU, node or link stands out (the {SLOW_FACTOR:g}x rule); {figure}"
    said = []
    for fault in faults:
        where = describe(fault, infos, node_of)
        if fault["what"] == "gpu":
            said.append(f"{where} is SLOW: its PCIe link is x{fault['width']} where the node's other "
                        f"GPUs have x{fault['others_width']}")
        elif fault["what"] == "job":
            said.append(f"{where} is SLOW: busbw {gbps(fault['busbw'])} GB/s at "
                        f"{human_bytes(fault['bytes'])}, under --preflight-min-busbw "
                        f"{gbps(fault['min_busbw'])} GB/s")
        elif fault["what"] == "step" and fault["kind"] == "slow":
            said.append(f"{where} is SLOW: {fault.get('detail') or 'it ran past its deadline'}")
        elif fault["kind"] == "dead":
            detail = f" ({fault['detail']})" if fault.get("detail") else ""
            said.append(f"{where} is DEAD: no data within the {check.deadline:g} s deadline{detail}")
        elif fault.get("rule") == "nominal":
            said.append(f"{where} is SLOW: its pairs move {fault['bw'] / 1e6:.2g} MB/s, "
                        f"{100 * fault['bw'] / fault['nominal_bw']:.2g}% of the "
                        f"{fault['nominal_bw'] * 8 / 1e6:g} Mb/s its interfaces state")
        else:
            said.append(f"{where} is SLOW: its pairs move {fault['bw'] / 1e6:.1f} MB/s, the others "
                        f"{fault['others_bw'] / 1e6:.1f} MB/s ({fault['others_bw'] / fault['bw']:.1f}x)")
    return "FAIL: " + "; ".join(said) + "; try: " + remedy(faults[0], check)


def describe(fault, infos, node_of):
    if fault["what"] == "step":
        return f"the {fault['name']} step"
    if fault["what"] == "job":
        return "the job's all-reduce"
    if fault.get("rule") == "nominal" and fault["what"] == "link":
        ends = []
        for node in fault["nodes"]:
            rank = next(r for r in fault["ranks"] if node_of[r] == node)
            ends.append(f"{node} ({infos.get(rank, {}).get('address', '?')} on "
                        f"{infos.get(rank, {}).get('interface', '?')})")
        return "the link between " + " and ".join(ends)
    ranks = fault.get("ranks", [])
    info = infos.get(ranks[0], {}) if ranks else {}
    if fault["what"] == "gpu":
        return f"{fault['name']} (rank {ranks[0]} on {fault['node']})"
    if fault["what"] == "node":
        return (f"node {fault['name']} (ranks {','.join(map(str, ranks))}, {info.get('address', '?')} "
                f"on {info.get('interface', '?')})")
    if fault["what"] == "rank":
        gpu = (info.get("gpu") or {}).get("bus_id")
        return f"rank {ranks[0]} on {node_of[ranks[0]]}" + (f" (GPU {gpu})" if gpu else "")
    a, b = ranks
    ia, ib = infos.get(a, {}), infos.get(b, {})
    return (f"the link between rank {a} ({node_of[a]}, {ia.get('address', '?')} on "
            f"{ia.get('interface', '?')}) and rank {b} ({node_of[b]}, {ib.get('address', '?')} on "
            f"{ib.get('interface', '?')})")


def remedy(fault, check):
    if fault["what"] == "gpu":
        return ("move it to a full-width slot, or check the slot's bifurcation setting and riser "
                "(mcprun doctor shows every GPU's link)")
    if fault["what"] in ("job", "step") and fault["kind"] == "slow":
        return ("compare the links' speeds (ethtool, tc qdisc show) and the pairs above; "
                "NCCL_DEBUG=INFO shows which transport NCCL picked")
    if fault["what"] == "link" and fault["kind"] == "slow":
        return "check both ends' NICs, cables and switch ports (ethtool, tc qdisc show)"
    if fault["what"] == "node" and fault["kind"] == "slow":
        return "check that node's NIC, cable and switch port (ethtool, tc qdisc show), or leave it out"
    if fault["what"] in ("node", "link"):
        return "check that node's network (ip link, firewall rules, the route to the others), or leave it out"
    if check.backend == "nccl":
        return ("check that GPU's PCIe link (mcprun doctor), then run with NCCL_P2P_DISABLE=1 or "
                "NCCL_SHM_DISABLE=1 to see which transport fails")
    return "check that rank's CPU binding and what else runs there"


def format_report(report, infos, pairs, node_of):
    lines = [f"mcprun preflight: {report['world_size']} ranks on {len(report['nodes'])} node(s), "
             f"{report['backend']}, step deadline {report['deadline_s']:g} s"]
    per_rank = {}
    for (a, b), v in pairs.items():
        for r in (a, b):
            per_rank.setdefault(r, []).append(v)
    rows = [("rank", "node", "gpu", "pcie", "numa", "interface", "pairs MB/s (median, min)")]
    for entry in report["ranks"]:
        gpu = entry.get("gpu") or {}
        pcie = "-"
        if gpu.get("link_width"):
            pcie = f"x{gpu['link_width']}/x{gpu.get('max_link_width', '?')} {gpu.get('link_speed', '')}".strip()
        values = per_rank.get(entry["rank"], [])
        measured = [v for v in values if v is not None]
        figure = "-"
        if values:
            figure = (f"{megabytes(median(measured))}, {megabytes(min(measured))}" if measured else "none")
            if len(measured) < len(values):
                figure += f" ({len(values) - len(measured)} dead)"
        rows.append((str(entry["rank"]), entry.get("node", "?"), gpu.get("bus_id", "-"), pcie,
                     str(gpu.get("numa_node", "-")) if gpu else "-",
                     f"{entry.get('interface', '?')} {entry.get('address', '')}".strip(), figure))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    if report["all_reduce"]:
        lines.append("  all-reduce busbw (GB/s): " + ", ".join(
            f"{human_bytes(f['bytes'])} " + size_figure(f) for f in report["all_reduce"]))
    else:
        lines.append("  all-reduce: no figure")
    lines.append("  steps (s): " + ", ".join(
        f"{name} {step['seconds']:.2f}" + ("" if step["ok"] else " FAILED")
        for name, step in report["steps"].items() if step.get("ran")))
    if report["pairs_not_measured"]:
        lines.append(f"  pairs: {report['pairs_not_measured']} not measured within the check's bound")
    lines.append(f"mcprun preflight: {report['verdict']}")
    return "\n".join(lines) + "\n"


def megabytes(bps):
    """MB/s, two digits at least: a slow link's 0.62 is no 1."""
    return f"{bps / 1e6:.0f}" if bps >= 10e6 else f"{bps / 1e6:.2g}"


def size_figure(figure):
    if figure.get("skipped"):
        return f"not run (it would take ~{figure.get('predicted_s', 0):.2g} s)"
    if figure.get("unfinished"):
        return "unfinished at the deadline"
    return gbps(figure["busbw"])


def main():
    try:
        Check().run()
    except Exception as error:  # Still a report: the launcher reads it, never the exit code.
        traceback.print_exc()
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("MCPRUN_PREFLIGHT_REPORT"):
            verdict = f"FAIL: the preflight could not run on rank {os.environ.get('RANK')}: {one_line(error)}"
            with open(os.environ["MCPRUN_PREFLIGHT_REPORT"], "w") as f:
                json.dump({"ok": False, "verdict": verdict, "faults": [],
                           "text": f"mcprun preflight: {verdict}\n"}, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # No teardown: a process group whose peer died may block in its destructor.
    os._exit(0)


if __name__ == "__main__":
    main()
