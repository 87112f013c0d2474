"""Builds a fake sysfs tree that mirrors the real layout, for MCPRUN_SYSFS_ROOT.

bus/pci/devices/<bdf> is a relative symlink into devices/pci<domain>:00/[<switch>/]<bdf>,
exactly as on a real machine, so discovery reads the PCIe tree the same way. make_cpu_tree adds
devices/system/{cpu/cpuN,node/nodeN} for --numa-binding. Same layout as tests/fake_sysfs.hpp.
"""
import os

_DEFAULTS = {
    "vendor": "0x10de",
    "class": "0x030200",
    "current_link_width": 16,
    "max_link_width": 16,
    "current_link_speed": "16.0 GT/s PCIe",
    "max_link_speed": "16.0 GT/s PCIe",
}


def make_tree(root, gpus):
    """Plants one PCI function per dict in `gpus` under `root` and returns `root`.

    Keys: bus_id ("0000:3b:00.0"), numa_node (None or absent: no numa_node file),
    local_cpulist ("0-3,8"), switch (a bridge bus id the device hangs under, or None for straight
    under the root complex), and optionally class, vendor, current_link_width, max_link_width,
    current_link_speed, max_link_speed (None leaves that file out).
    """
    devices = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(devices, exist_ok=True)
    for gpu in gpus:
        bus_id = gpu["bus_id"]
        domain = bus_id.split(":")[0]
        parts = [f"pci{domain}:00"]
        if gpu.get("switch"):
            parts.append(gpu["switch"])
        parts.append(bus_id)
        device_dir = os.path.join(root, "devices", *parts)
        os.makedirs(device_dir, exist_ok=True)
        attributes = dict(_DEFAULTS)
        attributes.update({k: v for k, v in gpu.items() if k in _DEFAULTS})
        attributes["numa_node"] = gpu.get("numa_node")
        attributes["local_cpulist"] = gpu.get("local_cpulist", "")
        for name, value in attributes.items():
            if value is None:
                continue
            with open(os.path.join(device_dir, name), "w") as out:
                out.write(f"{value}\n")
        os.symlink(os.path.relpath(device_dir, devices), os.path.join(devices, bus_id))
    return root


def _cpulist(cpus):
    """"0-1,16-17" for a sorted list, as the kernel writes it."""
    runs = []
    for cpu in cpus:
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _write(path, value):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        out.write(f"{value}\n")


def make_cpu_tree(root, sockets=2, nodes_per_socket=2, cores_per_node=4, threads_per_core=2,
                  cores_per_l3=2):
    """Plants a regular machine's CPUs and NUMA nodes under `root` and returns {node: [cpus]}.

    Linux numbering, as FakeSysfs::add_cpus: the first thread of every core (socket by socket,
    node by node), then every core's second thread; core c is CPUs c, c + cores, ... A node's
    cores share an L3 in runs of cores_per_l3; L1d, L1i and L2 are private to a core.
    """
    cores = sockets * nodes_per_socket * cores_per_node

    def threads_of(first_core, count):
        return sorted(t * cores + c for t in range(threads_per_core)
                      for c in range(first_core, first_core + count))

    system = os.path.join(root, "devices", "system")
    nodes = {}
    for node in range(sockets * nodes_per_socket):
        first = node * cores_per_node
        nodes[node] = threads_of(first, cores_per_node)
        _write(os.path.join(system, "node", f"node{node}", "cpulist"), _cpulist(nodes[node]))
        for core in range(first, first + cores_per_node):
            l3_first = first + (core - first) // cores_per_l3 * cores_per_l3
            l3_cores = min(cores_per_l3, first + cores_per_node - l3_first)
            l3 = _cpulist(threads_of(l3_first, l3_cores))
            siblings = _cpulist(threads_of(core, 1))
            for cpu in threads_of(core, 1):
                cpu_dir = os.path.join(system, "cpu", f"cpu{cpu}")
                _write(os.path.join(cpu_dir, "topology", "physical_package_id"),
                       node // nodes_per_socket)
                _write(os.path.join(cpu_dir, "topology", "thread_siblings_list"), siblings)
                caches = [("Data", 1, siblings), ("Instruction", 1, siblings),
                          ("Unified", 2, siblings), ("Unified", 3, l3)]
                for index, (kind, level, shared) in enumerate(caches):
                    cache = os.path.join(cpu_dir, "cache", f"index{index}")
                    _write(os.path.join(cache, "type"), kind)
                    _write(os.path.join(cache, "level"), level)
                    _write(os.path.join(cache, "shared_cpu_list"), shared)
    _write(os.path.join(system, "node", "possible"), _cpulist(sorted(nodes)))
    return nodes
