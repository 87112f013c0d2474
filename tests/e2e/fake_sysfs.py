"""Builds a fake sysfs tree that mirrors the real layout, for MCPRUN_SYSFS_ROOT.

bus/pci/devices/<bdf> is a relative symlink into devices/pci<domain>:<bus>/[<switch>/]<bdf>,
exactly as on a real machine, so discovery reads the PCIe tree the same way.
"""
import os


def make_tree(root, gpus):
    """Each gpu: bus_id, numa_node, local_cpulist, switch (a bridge bus id or None), and
    optionally vendor, class, current_link_width, max_link_width."""
    devices = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(devices, exist_ok=True)
    for gpu in gpus:
        bus_id = gpu["bus_id"]
        domain, bus = bus_id.split(":")[:2]
        parts = [f"pci{domain}:00"]
        if gpu.get("switch"):
            parts.append(gpu["switch"])
        parts.append(bus_id)
        device_dir = os.path.join(root, "devices", *parts)
        os.makedirs(device_dir, exist_ok=True)
        attributes = {
            "vendor": gpu.get("vendor", "0x10de"),
            "class": gpu.get("class", "0x030200"),
            "numa_node": str(gpu.get("numa_node", -1)),
            "local_cpulist": gpu.get("local_cpulist", ""),
            "current_link_width": str(gpu.get("current_link_width", 16)),
            "max_link_width": str(gpu.get("max_link_width", 16)),
            "current_link_speed": gpu.get("current_link_speed", "16.0 GT/s PCIe"),
            "max_link_speed": gpu.get("max_link_speed", "16.0 GT/s PCIe"),
        }
        for name, value in attributes.items():
            with open(os.path.join(device_dir, name), "w") as out:
                out.write(value + "\n")
        link = os.path.join(devices, bus_id)
        os.symlink(os.path.relpath(device_dir, devices), link)
    return root
