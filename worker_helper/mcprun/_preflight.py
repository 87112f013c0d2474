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

from mcprun._preflight_verdict import (
    MIN_OTHER_PAIRS, SLOW_FACTOR, all_reduce_figures, attribute, attribute_pairs, first_error,
    format_report, human_bytes, nominal_faults, pcie_faults, slow_faults, step_summary,
    verdict_line)

KEY_PREFIX = "mcprun/preflight/"
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
