"""The preflight's verdict from what every rank measured: which rank, GPU, node or link stands out,
what to do about it, and the report local rank 0 writes and prints: pure functions of the
measures, which rank 0 gathers."""

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
