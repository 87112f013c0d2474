"""Builds a fake sysfs tree that mirrors the real layout, for MCPRUN_SYSFS_ROOT.

bus/pci/devices/<bdf> is a relative symlink into devices/pci<domain>:00/[<switch>/]<bdf>,
exactly as on a real machine, so discovery reads the PCIe tree the same way. make_cpu_tree adds
devices/system/{cpu/cpuN,node/nodeN} for --numa-binding, make_driver_tree the driver's /proc
files that hold each GPU's UUID. Same layout as tests/fake_sysfs.hpp. build_fake_nvml compiles a
stand-in libnvidia-ml.so.1 that records whether anything loaded it.
"""
import os
import subprocess

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


def make_driver_tree(root, uuids):
    """Plants the driver's proc/driver/nvidia/gpus/<bus id>/information under `root` for each
    {bus_id: uuid}, in driver 580's layout, and returns the proc root for MCPRUN_PROC_ROOT."""
    proc = os.path.join(root, "proc")
    for minor, (bus_id, uuid) in enumerate(sorted(uuids.items())):
        _write(os.path.join(proc, "driver", "nvidia", "gpus", bus_id, "information"),
               f"Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t {uuid}\n"
               f"Video BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
               f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus_id}\n"
               f"Device Minor: \t {minor}\nGPU Excluded:\t No")
    return proc


# A stand-in libnvidia-ml.so.1 with the entry points mcprun calls, in nvml.h's ABI: it records
# every nvmlInit_v2 in $FAKE_NVML_LOG, and lists the processes $FAKE_NVML_PROCESSES names
# ("PID:BYTES,...") on one GPU at $FAKE_NVML_BUS_ID.
FAKE_NVML = r'''
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct { char legacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } Pci;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } Process;
int nvmlInit_v2(void) {
  FILE* log = fopen(getenv("FAKE_NVML_LOG"), "a");
  if (log) { fputs("nvmlInit_v2\n", log); fclose(log); }
  return 0;
}
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned* count) { *count = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) { *device = (void*)1; return index; }
int nvmlDeviceGetPciInfo_v3(void* device, Pci* pci) {
  memset(pci, 0, sizeof *pci);
  snprintf(pci->busId, sizeof pci->busId, "%s", getenv("FAKE_NVML_BUS_ID"));
  return device ? 0 : 1;
}
int nvmlDeviceGetUUID(void* device, char* uuid, unsigned size) {
  snprintf(uuid, size, "GPU-f00df00d-0000-4000-8000-000000000000");
  return device ? 0 : 1;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count, Process* out) {
  unsigned n = 0;
  char* list = strdup(getenv("FAKE_NVML_PROCESSES"));
  for (char* item = strtok(list, ","); item && n < *count; item = strtok(NULL, ",")) {
    out[n].pid = (unsigned)strtoul(item, &item, 10);
    out[n].used = strtoull(item + 1, NULL, 10);
    out[n].gi = out[n].ci = 0;
    ++n;
  }
  free(list);
  *count = n;
  return device ? 0 : 1;
}
'''


def build_fake_nvml(folder):
    """Compiles FAKE_NVML into folder/libnvidia-ml.so.1; returns the folder for LD_LIBRARY_PATH."""
    source = os.path.join(folder, "fake_nvml.c")
    with open(source, "w") as out:
        out.write(FAKE_NVML)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(folder, "libnvidia-ml.so.1"), source],
                   check=True)
    return folder
