"""mcprun's preflight: a bounded collective check over the job's own ranks, before its script.

mcprun starts `python -m mcprun._preflight` as every rank of the job (same spawn path, pinning,
binding and environment as the script) when --preflight is given. Each step has a deadline:

  init        a process group of the whole world (NCCL where the ranks have GPUs, else gloo);
  all-reduce  a few sizes, latency- to bandwidth-bound; bus bandwidth as nccl-tests reports it
              (busbw = size / time * 2(n-1)/n);
  pairs       every pair of ranks exchanges data, one round-robin round at a time (n-1 rounds):
              the comparison that names a slow or dead rank, node or link;
  liveness    after a failed step, who still answers through the job store.

Rank 0 judges and publishes the report under the store's "mcprun/preflight/" keys, which the
launcher erases before the script starts; local rank 0 of every node writes it to
$MCPRUN_PREFLIGHT_REPORT for its launcher. Nothing here touches the default process group, and the
process ends with os._exit: no process group, CUDA context or thread outlives it.
"""
import json
import os
import socket
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
# The pairs that do not touch a node (or rank) it takes to compare it with: with fewer, one noisy
# pair would decide, so 4 nodes (or 4 ranks in a node) are the least that can name one.
MIN_OTHER_PAIRS = 2
# How long rank 0 waits for the ranks' word through the store after a failed step: the store is
# a launcher's socket, so a rank that can answer does so within milliseconds.
LIVENESS_GRACE_S = 2.0
CPU_SIZES = [4 << 10, 256 << 10, 16 << 20]
GPU_SIZES = [4 << 10, 1 << 20, 64 << 20]
PAIR_BYTES = 1 << 20
# Each pair's figure is its best of this many exchanges: a busy core delays one, not all.
PAIR_REPEATS = 5
# Per all-reduce size: at most this many timed iterations, within about this many seconds.
MAX_ITERS = 10
SIZE_BUDGET_S = 0.4


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

    def get(self, key, timeout_s):
        timeout_s = max(timeout_s, 0.05)
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
        return self.put(f"info/{self.rank}", {"node": self.node, "local_rank": self.local_rank,
                                       "gpu": self.gpu, "interface": interface or "route",
                                       "address": address, "backend": self.backend})

    def init_world(self):
        start = time.monotonic()
        try:
            with self.bounded(self.deadline, "init"):
                self.pg = self.process_group("world", self.rank, self.world, self.deadline)
                # NCCL connects lazily: a first all-reduce makes the init step a real one.
                self.pg.allreduce([self.torch.ones(1, device=self.device)]).wait()
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
        results = []
        start = time.monotonic()
        try:
            for size in self.sizes():
                with self.bounded_op(3 * self.deadline, "all-reduce"):
                    results.append(self.time_all_reduce(size))
            self.steps.append({"step": "all-reduce", "ok": True, "sizes": results,
                               "seconds": time.monotonic() - start})
            return True
        except Exception as error:
            self.steps.append({"step": "all-reduce", "ok": False, "sizes": results,
                               "seconds": time.monotonic() - start, "error": one_line(error)})
            return False

    def time_all_reduce(self, size):
        data = self.torch.ones(size // 4, dtype=self.torch.float32, device=self.device)
        t0 = time.monotonic()
        self.pg.allreduce([data]).wait()
        self.sync()
        # Every rank must run as many iterations: they agree on the slowest warm-up.
        warmup = self.torch.tensor([time.monotonic() - t0], device=self.device)
        self.pg.allreduce([warmup], max_op(self.dist)).wait()
        iters = max(1, min(MAX_ITERS, int(SIZE_BUDGET_S / max(warmup.item(), 1e-6))))
        t0 = time.monotonic()
        for _ in range(iters):
            self.pg.allreduce([data]).wait()
        self.sync()
        return {"bytes": size, "seconds": (time.monotonic() - t0) / iters, "iters": iters}

    def pairs(self, live):
        """This rank's exchanges with each live partner, one round-robin round at a time."""
        results = []
        start = time.monotonic()
        data = self.torch.ones(PAIR_BYTES // 4, dtype=self.torch.float32, device=self.device)
        small = self.torch.ones(1, device=self.device)
        for number, round_pairs in enumerate(round_robin(live)):
            pair = next((p for p in round_pairs if self.rank in p), None)
            if pair is None:
                continue
            me = pair.index(self.rank)
            peer = pair[1 - me]
            t0 = time.monotonic()
            try:
                # A partner may come late by one deadline (its previous partner died): the
                # rendezvous waits for it that long again, the exchange itself only one deadline.
                self.store_patience(2 * self.deadline + LIVENESS_GRACE_S)
                try:
                    with self.bounded(2 * self.deadline + LIVENESS_GRACE_S):
                        pg = self.process_group(f"pair/{number}/{pair[0]}-{pair[1]}", me, 2,
                                                self.deadline)
                finally:
                    self.store_patience(self.deadline)
                with self.bounded_op(2 * self.deadline, "pairs"):
                    exchange(pg, small, me)  # Connects (NCCL lazily) before the timing.
                    self.sync()
                    best = None
                    for _ in range(PAIR_REPEATS):
                        t1 = time.monotonic()
                        exchange(pg, data, me)
                        self.sync()
                        elapsed = time.monotonic() - t1
                        best = elapsed if best is None else min(best, elapsed)
                results.append({"peer": peer, "ok": True, "bw": 2 * PAIR_BYTES / best})
            except Exception as error:
                results.append({"peer": peer, "ok": False, "seconds": time.monotonic() - t0,
                                "error": one_line(error)})
        ok = all(r["ok"] for r in results)
        self.steps.append({"step": "pairs", "ok": ok, "pairs": results,
                           "seconds": time.monotonic() - start})
        return ok

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
            # A rank whose partner died mid-round comes late by up to twice the deadline.
            results = self.gather("result", live, 2 * self.deadline + LIVENESS_GRACE_S)
            report = judge(self, live, results)
            self.put("report", report)
            # Every node's first local rank takes the report before rank 0 leaves.
            self.gather("taken", [r for r in sorted(results) if r != 0], self.deadline)
        else:
            report = self.get("report", 3 * self.deadline + 2 * LIVENESS_GRACE_S)
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


def exchange(pg, tensor, me):
    """A ping-pong: the lower rank sends first, the higher answers."""
    if me == 0:
        pg.send([tensor], 1, 0).wait()
        pg.recv([tensor], 1, 1).wait()
    else:
        pg.recv([tensor], 0, 0).wait()
        pg.send([tensor], 0, 1).wait()


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
    faults += pcie_faults(infos)

    allreduce = all_reduce_figures(steps, live, world)
    floor = allreduce[-1]["busbw"] if allreduce else None
    failed_steps = sorted({s["step"] for r in live for s in steps[r].values() if not s["ok"]})
    if failed_steps and not faults:
        faults.append({"kind": "dead", "what": "step", "name": failed_steps[0],
                       "detail": first_error(steps, failed_steps[0])})
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
    """Per size: the slowest rank's time, and nccl-tests' algbw and busbw from it."""
    per_size = {}
    for r in live:
        for entry in steps[r].get("all-reduce", {}).get("sizes", []):
            per_size[entry["bytes"]] = max(per_size.get(entry["bytes"], 0), entry["seconds"])
    figures = []
    for size, seconds in sorted(per_size.items()):
        algbw = size / seconds if seconds > 0 else None
        busbw = algbw * 2 * (world - 1) / world if algbw and world > 1 else algbw
        figures.append({"bytes": size, "seconds": seconds, "algbw": algbw, "busbw": busbw})
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
            if not touching or len(others) < MIN_OTHER_PAIRS or label in already:
                continue
            mine, theirs = median(touching), median(others)
            if mine * SLOW_FACTOR < theirs:
                ranks = sorted({r for k in group for r in k if key(r) == name})
                faults.append({"kind": "slow", "what": what, "name": label, "ranks": ranks,
                               "bw": mine, "others_bw": theirs})
    return faults


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
    figure = (f"all-reduce busbw {gbps(allreduce[-1]['busbw'])} GB/s at "
              f"{human_bytes(allreduce[-1]['bytes'])}" if allreduce else "no all-reduce figure")
    if not faults:
        return f"OK: no rank, GPU, node or link stands out (the {SLOW_FACTOR:g}x rule); {figure}"
    said = []
    for fault in faults:
        where = describe(fault, infos, node_of)
        if fault["what"] == "gpu":
            said.append(f"{where} is SLOW: its PCIe link is x{fault['width']} where the node's other "
                        f"GPUs have x{fault['others_width']}")
        elif fault["kind"] == "dead":
            detail = f" ({fault['detail']})" if fault.get("detail") else ""
            said.append(f"{where} is DEAD: no data within the {check.deadline:g} s deadline{detail}")
        else:
            said.append(f"{where} is SLOW: its pairs move {fault['bw'] / 1e6:.1f} MB/s, the others "
                        f"{fault['others_bw'] / 1e6:.1f} MB/s ({fault['others_bw'] / fault['bw']:.1f}x)")
    return "FAIL: " + "; ".join(said) + "; try: " + remedy(faults[0], check)


def describe(fault, infos, node_of):
    if fault["what"] == "step":
        return f"the {fault['name']} step"
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
    if fault["what"] in ("node", "link") and fault["kind"] == "slow":
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
            figure = (f"{median(measured) / 1e6:.0f}, {min(measured) / 1e6:.0f}" if measured else "none")
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
            f"{human_bytes(f['bytes'])} {gbps(f['busbw'])}" for f in report["all_reduce"]))
    else:
        lines.append("  all-reduce: no figure")
    lines.append("  steps (s): " + ", ".join(
        f"{name} {step['seconds']:.2f}" + ("" if step["ok"] else " FAILED")
        for name, step in report["steps"].items() if step.get("ran")))
    lines.append(f"mcprun preflight: {report['verdict']}")
    return "\n".join(lines) + "\n"


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
