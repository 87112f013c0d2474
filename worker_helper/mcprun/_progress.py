"""The collective progress reporter, run by every worker mcprun starts with
MCPRUN_COLLECTIVE_WATCH=1 (sitecustomize.py starts it once the program has imported
torch.distributed). It never imports torch and never raises into the program.

Once torch.distributed is initialised (and on, past destroy_process_group()), every interval it
sets the job store's key `mcprun/progress/<RANK>` (the store mcprun serves at
MASTER_ADDR:MASTER_PORT, through a connection of its own that speaks torch's TCPStore wire
protocol here, in Python) to one JSON record of under 4 KiB:

    {"v": 1, "rank": 2, "pid": 4242, "n": 17, "source": "flight_recorder", "completed": 52,
     "pending": [{"group": "0", "group_ranks": [0, 1, 2], "op": "all_reduce", "seq": 53,
                  "backend": "gloo", "pending_s": 12.5}],
     "cpu_s": 40.21, "frames": ["train.py:41 in main", "_tensor.py:626 in backward"]}

At interpreter exit it sets the last record again with "exiting": true (and the next n): the
rank has left its collectives, and the call that record caught pending stays for the failure
report, but is not read as a stall for as long as torch's teardown takes. Exit waits for that
record at most EXIT_WAIT_S, and for the thread to end (see sitecustomize's _ExitHandoff).

Why the store is spoken to in Python: the thread must never be inside torch's C++ when the
interpreter finalises. Python ends a thread that comes back from a call that released the GIL
then with pthread_exit, whose unwinding aborts the whole process in pybind11's noexcept frames
("terminate called without an active exception"), a finished rank's exit turned into a failure.
torch's store client blocks on the network (2.x's without bound on a store that stopped
answering), so any store it talks to, late, gone or its host exited first, could do that. The
torch calls left (the Flight Recorder's status, sequence numbers, group lookups) never block
on anything outside the process; exit waits for the thread to end, and should the thread
outlive that wait, takes and keeps the lock each of them runs under.

n counts the records this process built. source says where completed and pending come from:

- "flight_recorder" (torch >= 2.x): torch's in-process Flight Recorder, which also sees the
  collectives DDP issues from C++. completed is the sum over this rank's groups of the highest
  last completed collective sequence number seen; pending lists the collectives enqueued and not
  completed, oldest first, seq their collective sequence number, pending_s their age. They are
  read once a group's in-flight collective or the main thread's collective call has lasted two
  samples, so a healthy loop costs one small status query per interval. Until then, and for a
  call it does not record (gloo's send and recv), the stack's entry stands in.
- "stack" (torch 1.13, or a Flight Recorder that records nothing): the main thread's stack.
  Its collective call in distributed_c10d.py is pending (seq -1, pending_s since this reporter
  first saw the call); completed counts the collectives issued on this rank's groups (their
  sequence numbers, DDP's included) since the reporter first saw each, less the one pending, or
  where a backend numbers none, the calls seen to return. It compares across the records of one
  process, not across ranks. DDP's gradient all-reduce, issued from C++, is pending as
  {"op": "all_reduce", "in_backward": true, ...} while the main thread is in backward() and a
  group's sequence number moved since the sample before, or on an earlier sample of the same wait
  (DDP issued collectives in it); pending_s counts from the last move.

At most 4 pending entries are listed; group_ranks is [] for a group of more than 64 ranks.
cpu_s is the CPU time of this process, its reaped children and its live descendants (DataLoader
workers), from /proc. frames are the main thread's innermost 6 frames, innermost last.
run_delay_s is the main thread's wait for a CPU. loader_s is the main thread's wall time in
torch's DataLoader so far (mcprun._loader), absent where that cannot be timed. cpu_quota, where the process's cgroup has a CPU
quota, is [cores it allows, periods, periods in which the cgroup was throttled]: cgroup v2's
cpu.max and cpu.stat or v1's cpu.cfs_quota_us, cpu.cfs_period_us and cpu.stat, looked up anew
each record, since a rank may be moved into a cgroup while it runs.

Once mcprun sets `mcprun/flight_recorder/dump` (on a stall), each reporter with a Flight Recorder
writes its dump once, in the pickle torch's analyzer reads, to $TORCH_FR_DUMP_TEMP_FILE<RANK>.
"""

import json
import os
import pickle
import socket
import struct
import sys
import threading
import time

from mcprun._cpu import CpuClock, cpu_quota
from mcprun._debug import debug
from mcprun._flight_recorder import collective_bytes, element_count, pg_status, step_of
from mcprun._loader import LoaderClock

RECORD_VERSION = 1
KEY_PREFIX = "mcprun/progress/"
DUMP_REQUEST_KEY = "mcprun/flight_recorder/dump"
# Bounds the store connection's connect, each send and each answer: a slow store delays only
# this thread.
STORE_TIMEOUT_S = 2.0
# How long exit waits for the thread's exiting record: one round trip to the store, which a
# loaded machine can stretch past a tenth of a second.
EXIT_WAIT_S = 1.0
# How long exit waits for a torch call of a thread that outlived exit's wait for its end: each
# reads this process's own state (milliseconds); the bound is for a recorder lock held by a
# collective that never lets go.
TORCH_CALL_WAIT_S = 5.0
MAX_PENDING = 4
MAX_FRAMES = 6
MAX_GROUP_RANKS = 64
HOST = socket.gethostname()
# The straggler watch's arrivals: read every this many records, at most this many per group. A
# job of up to 64 ranks sends every collective its recorder holds: blocks of 64 left a 10 s window
# with one or two, which a lag rotating among three ranks could fill with one rank's turns. A
# larger job sends blocks of 64, so that the store's node reads no more than 64 ranks send.
ARRIVALS_EVERY = 4
WORLD_SIZE = os.environ.get("WORLD_SIZE", "")  # mcprun sets it for every worker.
MAX_ARRIVALS = 256 if not WORLD_SIZE.isdigit() or int(WORLD_SIZE) <= 64 else 64
MAX_NAME_CHARS = 80
# How often the reporter reads its groups' statuses between records, to time completions:
# gloo's recorder keeps no completion time, NCCL's only the watchdog's. A read costs ~7 us.
COMPLETION_POLL_S = float(os.environ.get("MCPRUN_COMPLETION_POLL_S", "0.02"))
MAX_COMPLETIONS = 512  # Per group: twice the recorder's entries.
# torch >= 2.x's Flight Recorder dumps: gloo and the other CPU backends, then NCCL (CUDA builds).
FLIGHT_RECORDER_DUMPS = ("_dump_fr_trace_json", "_dump_nccl_trace_json")
# The blocking calls of distributed_c10d.py, 1.13 and 2.13 (new_group: every rank must call it).
COLLECTIVES = frozenset({
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_multigpu",
    "all_gather_object", "all_gather_single", "all_reduce", "all_reduce_coalesced",
    "all_reduce_multigpu", "all_to_all", "all_to_all_single", "barrier", "broadcast",
    "broadcast_multigpu", "broadcast_object_list", "gather", "gather_object", "monitored_barrier",
    "new_group", "recv", "recv_object_list", "reduce", "reduce_multigpu", "reduce_scatter",
    "reduce_scatter_multigpu", "reduce_scatter_single", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "send_object_list", "_all_gather_base", "_reduce_scatter_base",
})


def run(main_thread_id, interval_s, adopt):
    """Reports until the interpreter exits; the body of the thread sitecustomize starts.
    `adopt(reporter)` hands the reporter to the exit handler, False once exit has begun."""
    reporter = Reporter(main_thread_id, interval_s)
    if adopt(reporter):
        reporter.run()


def clip(text):
    return text if len(text) <= MAX_NAME_CHARS else text[:MAX_NAME_CHARS - 3] + "..."


class Reporter:
    """One record per interval into the job store, on a connection of its own."""

    def __init__(self, main_thread_id, interval_s):
        self.main_thread_id = main_thread_id
        self.interval_s = interval_s
        self.stop_requested = threading.Event()
        self.torch_calls = threading.Lock()  # Held through each torch call: see stop().
        self.abandoned = False  # Set by exit under torch_calls: no torch call after.
        self.store = None
        self.records = 0
        self.last_record = None  # The last one the store took.
        self.dump_prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
        self.dumped = False
        self.groups = Groups()
        self.flight_recorder = FlightRecorderProbe(self.groups)
        self.stack = StackProbe(self.groups)
        self.cpu = CpuClock()
        self.loader = LoaderClock(main_thread_id)

    def run(self):
        try:
            next_record = time.monotonic() + self.interval_s
            while not self.stop_requested.wait(self.pause_before(next_record)):
                if time.monotonic() < next_record:
                    self.safely(self.poll_completions)
                    continue
                next_record += self.interval_s
                self.safely(self.report)
            self.safely(self.report_exit)
        finally:
            self.close()

    def pause_before(self, next_record):
        """Until the next record, or the next completion poll: once collectives are recorded,
        through the interval before each record that reads arrivals (a quarter of the time, so
        a quarter of the collectives are timed, at a quarter of the polls' cost)."""
        pause = max(next_record - time.monotonic(), 0)
        timing = (self.flight_recorder.recording and COMPLETION_POLL_S > 0
                  and (self.records + 1) % ARRIVALS_EVERY == 0)
        return min(pause, COMPLETION_POLL_S) if timing else pause

    def poll_completions(self):
        self.in_torch(self.flight_recorder.stamp_completions)

    def request_stop(self):
        """At exit, from sitecustomize's handler, which then waits for the thread to end: the
        exiting record, on the open connection only, then the thread returns."""
        self.stop_requested.set()

    def abandon(self):
        """From the exit handler once the thread outlived its wait: no torch call after this
        one ends (a torch call blocks on nothing outside the process)."""
        in_time = self.torch_calls.acquire(timeout=TORCH_CALL_WAIT_S)
        self.abandoned = True
        if in_time:
            self.torch_calls.release()
        debug("exiting with the reporter's thread still running"
              + ("" if in_time else f", in a torch call for over {TORCH_CALL_WAIT_S} s"))

    def in_torch(self, step):
        """`step()`, a call into torch, unless exit has abandoned the thread (then None)."""
        with self.torch_calls:
            return None if self.abandoned else step()

    @staticmethod
    def safely(report):
        try:
            report()
        except Exception as error:
            debug(f"no report this interval: {error!r}")

    def close(self):
        if self.store is not None:
            self.store.close()
            self.store = None

    def report_exit(self):
        if self.last_record is None:
            return  # Nothing stale to replace.
        store = self.connected_store(new_connection=False)
        if store is None:
            return  # No connection to replace it on, and none is opened once exit waits.
        self.records += 1
        record = dict(self.last_record, n=self.records, exiting=True)
        store.socket.settimeout(EXIT_WAIT_S)  # The program's exit waits for this one.
        store.set(KEY_PREFIX + str(record["rank"]), json.dumps(record, separators=(",", ":")).encode())

    def report(self):
        rank = os.environ.get("RANK")
        if rank is None:
            return
        record = self.in_torch(lambda: self.record_if_initialised(int(rank)))
        # Once exit waits, no store call but the exiting record.
        if record is None or self.stop_requested.is_set():
            return
        store = self.connected_store(new_connection=True)
        if store is None:
            return
        try:
            store.set(KEY_PREFIX + rank, json.dumps(record, separators=(",", ":")).encode())
            self.last_record = record
            dump_requested = (not self.stop_requested.is_set()
                              and record["source"] == "flight_recorder" and self.dump_prefix
                              and not self.dumped and store.check([DUMP_REQUEST_KEY]))
        except OSError:
            self.close()  # Reconnects next interval.
            raise
        if dump_requested:
            self.dumped = True  # Once: a dump that fails is not retried every interval.
            self.in_torch(lambda: self.flight_recorder.write_dump(self.dump_prefix + rank))

    def record_if_initialised(self, rank):
        dist = sys.modules.get("torch.distributed")
        # Past destroy_process_group() too: a last record's pending call would read as a stall.
        if dist is None or not (self.records or dist.is_initialized()):
            return None
        return self.record(dist, rank)

    def connected_store(self, new_connection):
        if self.store is None and new_connection:
            host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
            if not host or not port:
                return None
            version = getattr(sys.modules.get("torch"), "__version__", "")
            try:
                self.store = StoreConnection(host, int(port), STORE_TIMEOUT_S,
                                             StoreConnection.validating(str(version)))
            except (OSError, ValueError) as error:
                debug(f"store unreachable: {error!r}")
                return None
        return self.store

    def record(self, dist, rank):
        frame = sys._current_frames().get(self.main_thread_id)
        source, (completed, pending) = self.progress(dist, frame)
        self.records += 1
        record = {"v": RECORD_VERSION, "rank": rank, "pid": os.getpid(), "n": self.records,
                  "host": HOST, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                  "source": source, "completed": completed, "pending": pending[:MAX_PENDING],
                  "cpu_s": round(self.cpu.seconds(), 2), "frames": innermost_frames(frame),
                  "run_delay_s": round(self.cpu.run_delay_seconds(), 3)}
        quota = cpu_quota()
        if quota:
            record["cpu_quota"] = quota
        loader_s = self.loader.seconds()
        if loader_s is not None:
            record["loader_s"] = loader_s
        if source == "flight_recorder" and self.records % ARRIVALS_EVERY == 0:
            try:
                arrivals = self.flight_recorder.arrivals()
                if arrivals:
                    record["arrivals"] = arrivals
            except Exception as error:
                debug(f"no arrivals: {error!r}")
        record["sent_ns"] = time.time_ns()  # The store's host reads this rank's clock offset.
        return record

    def progress(self, dist, frame):
        """(source, (completed, pending)): a torch internal that is missing or changed costs
        the Flight Recorder, then the stack, never the record."""
        call = outermost_collective(frame)
        try:
            in_call = self.stack.pending(dist, call)
        except Exception as error:
            debug(f"stack unreadable: {error!r}")
            in_call = []
        try:
            progress = self.flight_recorder.sample(call)
            if progress is not None:
                completed, pending = progress
                # A call it does not record (gloo's send and recv) is still a pending call.
                return "flight_recorder", (completed, pending or in_call)
        except Exception as error:
            debug(f"Flight Recorder unreadable: {error!r}")
        try:
            sequences = self.stack.sequences()
        except Exception as error:
            debug(f"no sequence numbers: {error!r}")
            return "stack", (-1, in_call)
        pending = in_call or self.stack.in_backward(dist, frame, sequences)
        return "stack", (self.stack.completed(sequences, len(pending)), pending)


def innermost_frames(frame):
    frames = []
    while frame is not None and len(frames) < MAX_FRAMES:
        code = frame.f_code
        where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
        frames.append(clip(f"{where} in {code.co_name}"))
        frame = frame.f_back
    return frames[::-1]


class StoreConnection:
    """A client of the job store in torch's TCPStore wire protocol, in the dialect the rank's own
    torch speaks, so that any store its torch could talk to understands it (mcprun's speaks
    both): only the two queries the reporter needs, each bounded by the socket's timeout."""

    # torch >= 2.1 (TCPStoreBackend.hpp) opens with VALIDATE and the magic, and numbers SET 1 and
    # CHECK 5; torch 1.x and 2.0 open with the first query, SET 0 and CHECK 4.
    VALIDATE, VALIDATION_MAGIC = 0, 0x3C85F7CE
    QUERIES = {True: {"set": 1, "check": 5}, False: {"set": 0, "check": 4}}
    READY = b"\x00"
    # torch's client puts "/" before every key it is given.
    KEY_PREFIX = "/"

    def __init__(self, host, port, timeout_s, validating):
        self.queries = self.QUERIES[validating]
        self.socket = socket.create_connection((host, port), timeout=timeout_s)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if validating:
            self.socket.sendall(struct.pack("<BI", self.VALIDATE, self.VALIDATION_MAGIC))

    @staticmethod
    def validating(torch_version):
        """Whether a torch of `torch_version` ("2.13.0+cpu") opens with VALIDATE."""
        try:
            major, minor = (int(part) for part in torch_version.split(".")[:2])
        except ValueError:
            return True  # A version torch itself would not print: the current dialect.
        return (major, minor) >= (2, 1)

    @classmethod
    def _bytes(cls, data):
        return struct.pack("<Q", len(data)) + data

    @classmethod
    def _key(cls, key):
        return cls._bytes((cls.KEY_PREFIX + key).encode())

    def set(self, key, value):
        self.socket.sendall(bytes([self.queries["set"]]) + self._key(key) + self._bytes(value))

    def check(self, keys):
        """Whether every key is set."""
        self.socket.sendall(struct.pack("<BQ", self.queries["check"], len(keys))
                            + b"".join(self._key(key) for key in keys))
        answer = self.socket.recv(1)
        if not answer:
            raise ConnectionError("the store closed the connection")
        return answer == self.READY

    def close(self):
        self.socket.close()


class Groups:
    """This rank's process groups: their names (the default group's is "0") and global ranks."""

    def __init__(self):
        self.ranks_by_name = {}

    @staticmethod
    def names():
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        world = getattr(c10d, "_world", None)  # torch 2.x; 1.13 keeps module globals.
        return dict(world.pg_names if world is not None else c10d._pg_names)

    def ranks(self, name, limit=MAX_GROUP_RANKS):
        """The group's global ranks; [] when unknown or more than `limit` (None: no limit)."""
        if name not in self.ranks_by_name:
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            for group, group_name in self.names().items():
                self.ranks_by_name[group_name] = c10d.get_process_group_ranks(group)
            self.ranks_by_name.setdefault(name, [])  # Unknown stays unknown: no rebuild per sample.
        ranks = self.ranks_by_name[name]
        return ranks if limit is None or len(ranks) <= limit else []


class FlightRecorderProbe:
    """Progress from torch's Flight Recorder; None where it has recorded nothing."""

    def __init__(self, groups):
        self.groups = groups
        self.recording = set()     # the dumps whose statuses named a group
        self.previous = {}         # (dump, pg id) -> its status at the previous sample
        self.nothing_pending = {}  # (dump, pg id) -> a status a full dump found nothing in flight
        self.highest_completed = {}
        self.previous_call = None  # id() of the collective frame the main thread was in
        self.arrivals_seen = {}    # group name -> the highest sequence number sent in arrivals
        self.completed_at = {}     # (dump, pg id) -> {seq: wall ns it was first seen completed}

    def sample(self, call):
        """`call`: the main thread's collective frame, if any; one it is still in since the
        previous sample is worth a full dump too (send and recv count in no group's status)."""
        c10d = sys.modules.get("torch._C._distributed_c10d")
        dumps = {name: getattr(c10d, name) for name in FLIGHT_RECORDER_DUMPS if hasattr(c10d, name)}
        statuses = {}
        for name, dump in dumps.items():
            # Statuses alone: a few microseconds, where entries cost milliseconds.
            for pg_id, status in pg_status(dump(False, True)).items():
                statuses[(name, pg_id)] = (int(status["last_enqueued_collective"]),
                                           int(status["last_completed_collective"]))
        if not statuses:
            return None
        self.stamp(statuses)
        self.recording = {name for name, _ in statuses}
        for key, (_, completed) in statuses.items():
            self.highest_completed[key] = max(self.highest_completed.get(key, 0), completed)
        # gloo completes out of order, so last_completed can trail last_enqueued while nothing is
        # in flight: a full dump settles it, once per such status.
        stuck = [key for key, status in statuses.items()
                 if status[0] > status[1] and self.previous.get(key) == status
                 and self.nothing_pending.get(key) != status]
        self.previous = statuses
        in_same_call = call is not None and id(call) == self.previous_call
        self.previous_call = id(call) if call is not None else None
        pending = []
        if stuck or in_same_call:
            # Every recorder for a call no status shows, else only those of the stuck groups.
            names = set(dumps) if in_same_call else {name for name, _ in stuck}
            pending = self.pending_entries({name: dumps[name] for name in names}, statuses, stuck)
        return sum(self.highest_completed.values()), pending

    def stamp_completions(self):
        c10d = sys.modules["torch._C._distributed_c10d"]
        statuses = {}
        for name in self.recording:
            for pg_id, status in pg_status(getattr(c10d, name)(False, True)).items():
                statuses[(name, pg_id)] = (0, int(status["last_completed_collective"]))
        self.stamp(statuses)

    def stamp(self, statuses):
        """The collective each group completed last was done by now. Only that one: gloo
        completes out of order, so one below it may still be running."""
        now = time.time_ns()
        for key, (_, completed) in statuses.items():
            stamps = self.completed_at.setdefault(key, {})
            if completed >= 0 and completed not in stamps:
                stamps[completed] = now
                if len(stamps) > MAX_COMPLETIONS:
                    del stamps[next(iter(stamps))]  # The oldest: dicts keep insertion order.

    def pending_entries(self, dumps, statuses, stuck):
        now_ns = time.time_ns()
        entries = []
        for name, dump in dumps.items():
            for entry in json.loads(dump(True, True)).get("entries", []):
                if not entry.get("retired") and entry.get("state") != "completed":
                    entries.append((name, entry))
        for key in stuck:
            if not any((name, str(entry.get("pg_id"))) == key for name, entry in entries):
                self.nothing_pending[key] = statuses[key]
        entries.sort(key=lambda item: item[1].get("time_created_ns", 0))
        return [self.describe(entry, now_ns) for _, entry in entries[:MAX_PENDING]]

    def arrivals(self):
        """When this rank enqueued and completed its collectives since the last call, for the
        straggler and bandwidth watches: {"t0_ns": wall clock, "groups": {name: {"ranks": [...],
        "ops": [op, ...], "c": [[seq, us after t0, elements, done us after t0 or -1, bytes,
        index in ops, GPU us or -1], ...], "step_us": its step}}}; None when nothing is new.
        A collective still running waits for the next call, so that its completion goes with
        it. Past MAX_ARRIVALS a group's are thinned to whole blocks of MAX_ARRIVALS consecutive
        sequence numbers, the blocks whose number is divisible by a power of two, so that every
        rank keeps the multiples of the largest stride and the same collectives line up; whole
        blocks keep whole steps (a step's collectives repeat with a period that a stride over
        single sequence numbers would thin by kind: every loop all-reduce kept, every gradient
        one dropped). The step is the period of the sizes of all the recorder holds (DDP's
        buckets repeat every step), and "period" how many collectives it holds. A full read
        without stack traces costs milliseconds for the recorder's 256 entries, hence only every
        ARRIVALS_EVERY records."""
        c10d = sys.modules["torch._C._distributed_c10d"]
        by_group = {}
        for name in self.recording:
            dump = pickle.loads(getattr(c10d, name.removesuffix("_json"))(True, False, False))
            for entry in dump.get("entries", []):
                if entry.get("is_p2p"):
                    continue
                group = str((entry.get("process_group") or [entry.get("pg_id", "")])[0])
                seq = entry.get("collective_seq_id", -1)
                done_ns = (entry.get("time_discovered_completed_ns")
                           or self.completed_at.get((name, str(entry.get("pg_id"))), {}).get(seq))
                finished = entry.get("retired") or entry.get("state") == "completed"
                gpu_ms = entry.get("duration_ms")  # Where TORCH_NCCL_ENABLE_TIMING is on.
                by_group.setdefault(group, {})[seq] = (
                    entry.get("time_created_ns", 0), element_count(entry.get("input_sizes")),
                    done_ns if finished else None, finished, collective_bytes(entry),
                    entry.get("profiling_name", "").partition(":")[2] or "?",
                    -1 if gpu_ms is None else int(gpu_ms * 1000))
        groups, t0 = {}, None
        for group, entries in by_group.items():
            new = []
            for seq in sorted(seq for seq in entries if seq > self.arrivals_seen.get(group, -1)):
                if not entries[seq][3]:
                    break  # Running: sent with its completion next time.
                new.append(seq)
            if not new:
                continue
            self.arrivals_seen[group] = new[-1]
            stride = 1
            while len(new) > MAX_ARRIVALS * stride:
                stride *= 2
            kept = [seq for seq in new if (seq // MAX_ARRIVALS) % stride == 0]
            t0 = min([entries[seq][0] for seq in kept] + ([t0] if t0 is not None else []))
            step_ns, period = step_of(entries)
            groups[group] = {"ranks": self.groups.ranks(group), "kept": kept, "entries": entries,
                             "step_us": step_ns // 1000, "period": period}
        if not groups:
            return None
        for group in groups.values():
            entries = group.pop("entries")
            ops = []
            group["c"] = []
            for seq in group.pop("kept"):
                created, elements, done, _, size, op, gpu_us = entries[seq]
                if op not in ops:
                    ops.append(op)
                group["c"].append([seq, (created - t0) // 1000, elements,
                                   -1 if done is None else max(done - t0, 0) // 1000, size,
                                   ops.index(op), gpu_us])
            group["ops"] = ops
        return {"t0_ns": t0, "groups": groups}

    def write_dump(self, path):
        """Writes the full pickled dump (NCCL's where it records) to `path`, whole or not at all."""
        if not self.recording:
            return
        c10d = sys.modules["torch._C._distributed_c10d"]
        name = max(self.recording, key=FLIGHT_RECORDER_DUMPS.index).removesuffix("_json")
        dump = pickle.loads(getattr(c10d, name)())
        # gloo's recorder files its groups' ranks under one blank name; torch's analyzer looks
        # them up by the entries' group names.
        for entry in dump.get("entries", []):
            group, description = entry["process_group"]
            dump["pg_config"].setdefault(group, {"name": group, "desc": description,
                                                 "ranks": str(self.groups.ranks(group, None))})
        folder = os.path.dirname(path) or os.curdir
        os.makedirs(folder, exist_ok=True)  # Whether or not mcprun has made it yet.
        # Not named like a dump: torch's analyzer reads every file in the folder with the prefix.
        partial = os.path.join(folder, f".mcprun-partial-{os.getpid()}")
        with open(partial, "wb") as out:
            pickle.dump(dump, out)
        os.replace(partial, path)

    def describe(self, entry, now_ns):
        backend, separator, op = entry.get("profiling_name", "").partition(":")
        if not separator:
            backend, op = "", backend
        group = str((entry.get("process_group") or [entry.get("pg_id", "")])[0])
        seq = entry.get("p2p_seq_id" if entry.get("is_p2p") else "collective_seq_id", -1)
        return {"group": group, "group_ranks": self.groups.ranks(group), "op": clip(op),
                "seq": seq, "backend": backend,
                "pending_s": round(max(now_ns - entry.get("time_created_ns", now_ns), 0) / 1e9, 3)}


class StackProbe:
    """Progress from the main thread's stack: the collective call it is in, and for a torch
    without a Flight Recorder, how many collectives it has issued."""

    def __init__(self, groups):
        self.groups = groups
        self.watched = None        # (frame id, group name, sequence number) of the pending call
        self.watched_since = 0.0
        self.finished = 0          # pending calls seen to return, where sequence numbers fail
        self.first_sequence = {}   # group name -> its sequence number when first seen
        self.highest_completed = 0
        self.previous_sequences = {}  # group name -> its sequence number at the sample before
        self.backward_group = None    # the group DDP's all-reduce moved in the backward() now
        self.backward_since = 0.0

    def pending(self, dist, call):
        """[the collective `call` (a frame) as a pending entry], or [] outside one."""
        watched, pending = None, []
        if call is not None:
            c10d = sys.modules["torch.distributed.distributed_c10d"]
            names = self.groups.names()
            group = call.f_locals.get("group")
            if group not in names:  # None or GroupMember.WORLD's placeholder: the default group.
                group = c10d._get_default_group()
            name = names.get(group, "0")
            # The sequence number tells a new call from an old one whose frame address it reuses.
            watched = (id(call), name, sequence_number(group))
            if watched != self.watched:
                self.watched_since = time.monotonic()
            pending.append({"group": name, "group_ranks": self.groups.ranks(name),
                            "op": call.f_code.co_name, "seq": -1,
                            "backend": backend_name(dist, group),
                            "pending_s": round(time.monotonic() - self.watched_since, 3)})
        if self.watched is not None and watched != self.watched:
            self.finished += 1
        self.watched = watched
        return pending

    def sequences(self):
        """Each group's sequence number by name; None for a backend that numbers none (MPI)."""
        return {name: sequence_number(group) for group, name in self.groups.names().items()}

    def in_backward(self, dist, frame, sequences):
        """[DDP's gradient all-reduce as a pending entry] while the main thread is in backward()
        and DDP issued collectives in it, else []: torch 1.x's reducer issues them from C++,
        where no stack shows them, but each moves its group's sequence number."""
        moved = [name for name, sequence in sequences.items()
                 if sequence is not None and sequence != self.previous_sequences.get(name)]
        self.previous_sequences = sequences
        if outermost_backward(frame) is None:
            self.backward_group = None
            return []
        if moved:
            # The sample before may have seen this same wait: it starts at the last move.
            self.backward_group = "0" if "0" in moved else moved[0]
            self.backward_since = time.monotonic()
        if self.backward_group is None:
            return []
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        group = {name: group for group, name in self.groups.names().items()}.get(self.backward_group)
        return [{"group": self.backward_group, "group_ranks": self.groups.ranks(self.backward_group),
                 "op": "all_reduce", "seq": -1,
                 "backend": backend_name(dist, group if group is not None else c10d._get_default_group()),
                 "pending_s": round(time.monotonic() - self.backward_since, 3), "in_backward": True}]

    def completed(self, sequences, pending_count):
        """Collectives issued on this rank's groups since first seen, less those pending; where a
        backend has no sequence numbers, the pending calls seen to return."""
        if None in sequences.values():
            completed = self.finished
        else:
            completed = sum(sequence - self.first_sequence.setdefault(name, sequence)
                            for name, sequence in sequences.items()) - pending_count
        self.highest_completed = max(self.highest_completed, completed)
        return self.highest_completed


def outermost_backward(frame):
    """The outermost frame of torch.autograd.backward() on the stack, or None."""
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "backward" and code.co_filename.endswith(
                os.path.join("autograd", "__init__.py")):
            found = frame
        frame = frame.f_back
    return found


def outermost_collective(frame):
    """The outermost frame of a torch.distributed collective on the stack (all_gather_object,
    not the all_gather it calls), or None."""
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_name in COLLECTIVES and code.co_filename.endswith("distributed_c10d.py"):
            found = frame
        frame = frame.f_back
    return found


def sequence_number(group):
    try:
        return group._get_sequence_number_for_group()
    except Exception:
        return None  # A backend without sequence numbers (MPI).


def backend_name(dist, group):
    try:
        return str(dist.get_backend(group))
    except Exception:
        return ""
