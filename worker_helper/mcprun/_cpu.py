"""A rank's CPU as the progress reporter records it: the process's CPU time with its descendants'
(DataLoader workers), the main thread's wait for a CPU, and the CPU quota of its cgroup (v1 or v2),
all from /proc and /sys/fs/cgroup."""

import os
import time

from mcprun._debug import debug

# How often /proc is scanned for new descendants; known ones are read every interval.
DESCENDANT_SCAN_S = 10.0


def cgroup_cpu_dirs():
    """The folders of this process's cgroup that hold its CPU controller's files: (version, path)
    for each of v2 (the unified hierarchy) and v1's cpu controller that the box mounts."""
    mounts = {}  # "cpu" or "2" -> (mount root, mount point)
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], fields[-1].split(",")
            if fstype == "cgroup2":
                mounts.setdefault("2", (fields[3], fields[4]))
            elif fstype == "cgroup" and "cpu" in options:
                mounts.setdefault("cpu", (fields[3], fields[4]))
    dirs = []
    with open("/proc/self/cgroup") as cgroup:
        for line in cgroup:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            key = "2" if hierarchy == "0" else "cpu" if "cpu" in controllers.split(",") else None
            if key in mounts:
                root, point = mounts[key]
                relative = path[len(root):] if path.startswith(root) and root != "/" else path
                dirs.append((key, point + relative.rstrip("/")))
    return dirs


def read_fields(path):
    with open(path) as stat:
        return dict(line.split() for line in stat if len(line.split()) == 2)


def cpu_quota():
    """[quota in cores, periods, throttled periods] of this process's cgroup; None without a
    quota or where the files cannot be read."""
    try:
        for version, folder in cgroup_cpu_dirs():
            if version == "2":
                with open(os.path.join(folder, "cpu.max")) as cpu_max:
                    quota, period = cpu_max.read().split()
                if quota == "max":
                    continue
            else:
                with open(os.path.join(folder, "cpu.cfs_quota_us")) as quota_file:
                    quota = quota_file.read().strip()
                with open(os.path.join(folder, "cpu.cfs_period_us")) as period_file:
                    period = period_file.read().strip()
                if int(quota) < 0:
                    continue
            stat = read_fields(os.path.join(folder, "cpu.stat"))
            return [round(int(quota) / int(period), 3), int(stat["nr_periods"]), int(stat["nr_throttled"])]
    except (OSError, ValueError, KeyError, IndexError) as error:
        debug(f"no CPU quota read: {error!r}")
    return None


class CpuClock:
    """CPU seconds of this process, its reaped children and its live descendants, from /proc;
    and how long its main thread waited for a CPU it was ready to run on."""

    @staticmethod
    def run_delay_seconds():
        """/proc/<pid>/schedstat's run-queue wait of the main thread (0 where the kernel keeps
        no schedstats): a rank starved of CPU by another process waits there."""
        try:
            with open(f"/proc/{os.getpid()}/schedstat", "rb") as schedstat:
                return int(schedstat.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    def __init__(self):
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")
        self.descendants = []  # (pid, start time): a pid reused by a stranger is not ours.
        self.next_scan = 0.0

    def seconds(self):
        if time.monotonic() >= self.next_scan:
            self.descendants = self.scan_descendants()
            self.next_scan = time.monotonic() + DESCENDANT_SCAN_S
        ticks = self.process_ticks(os.getpid())[0]
        for pid, start in self.descendants:
            descendant_ticks, descendant_start = self.process_ticks(pid)
            if descendant_start == start:
                ticks += descendant_ticks
        return ticks / self.ticks_per_s

    @staticmethod
    def stat_fields(pid):
        """/proc/<pid>/stat's fields after the command name, or None for a process gone."""
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                return stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None

    def process_ticks(self, pid):
        """(utime + stime + cutime + cstime, start time) of `pid`; (0, None) once it is gone."""
        fields = self.stat_fields(pid)
        if fields is None:
            return 0, None
        return sum(int(field) for field in fields[11:15]), fields[19]

    def scan_descendants(self):
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = self.stat_fields(entry)
                if fields is not None:
                    children.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
        found, frontier = [], [os.getpid()]
        while frontier:
            for child in children.get(frontier.pop(), []):
                found.append(child)
                frontier.append(child[0])
        return found
