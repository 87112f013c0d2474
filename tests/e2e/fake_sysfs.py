"""Builds a fake sysfs tree that mirrors the real layout, for MCPRUN_SYSFS_ROOT.

bus/pci/devices/<bdf> is a relative symlink into devices/pci<domain>:00/[<switch>/]<bdf>,
exactly as on a real machine, so discovery reads the PCIe tree the same way. Same layout as
tests/fake_sysfs.hpp.
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
