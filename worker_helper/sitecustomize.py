"""Runs at the start of every worker mcprun launches: mcprun puts this folder first on PYTHONPATH.

With MCPRUN_COLLECTIVE_WATCH=1 it starts the collective progress reporter (mcprun._progress) on a
thread that waits for the program to import torch.distributed; either way it then runs the
sitecustomize the user's sys.path holds after this one, as site would have.

Importing anything beyond os, sys and _thread here would slow every interpreter's start: json,
threading and the reporter are imported by the thread, once torch has imported them all anyway.
"""
import os
import sys

# Flight Recorder entries torch >= 2.x keeps per process when the user chose no size: enough for
# the oldest in-flight collective of a many-bucket DDP model, and reading them all costs ~5 ms
# (torch 2.13's own default, 2000, ~60 ms, holding the recorder's lock).
_FLIGHT_RECORDER_ENTRIES = "256"
_DEFAULT_INTERVAL_S = 1.0
_MIN_INTERVAL_S = 0.05
# How long exit waits for the reporter's thread to end: it ends within a store round trip (its
# socket timeouts are 2 s) unless a destructor it runs takes longer; past this the program exits.
_THREAD_END_WAIT_S = 30.0
# How long exit lets torch's gloo workers finish the collectives they completed, and how many
# looks 5 ms apart must find none of them running: see _settle_gloo_workers.
_GLOO_SETTLE_S = 2.0
_GLOO_QUIET_LOOKS = 3


def _debug(message):
    if os.environ.get("MCPRUN_PROGRESS_DEBUG") == "1":
        sys.stderr.write(f"mcprun progress: {message}\n")


def _interval_s():
    try:
        interval = float(os.environ.get("MCPRUN_PROGRESS_INTERVAL_S", _DEFAULT_INTERVAL_S))
    except ValueError:
        return _DEFAULT_INTERVAL_S
    return max(interval, _MIN_INTERVAL_S) if interval > 0 else _DEFAULT_INTERVAL_S


def _torch_distributed_imported():
    module = sys.modules.get("torch.distributed")
    spec = getattr(module, "__spec__", None)
    # Until threading is imported, the first thread to import it would become its main thread.
    return (spec is not None and not getattr(spec, "_initializing", False)
            and "threading" in sys.modules)


class _ExitHandoff:
    """Gives the interpreter's exit to the reporter, however late its thread makes it: the exit
    handler is registered at start, so it runs even when the program ends as the thread begins.
    Exit then waits for the thread itself to end, not only for the reporter to say it stopped: the
    garbage collector runs on whichever thread allocates, so the thread can be inside any
    object's destructor, torch's included, which release the GIL; coming back from one once the
    interpreter finalises ends the thread in pthread_exit, and pybind11's noexcept frames turn
    that into an abort of a rank that had finished its work."""

    def __init__(self, thread_module):
        self.thread_module = thread_module
        self.lock = thread_module.allocate_lock()
        self.exiting = False
        self.reporter = None
        self.owner_pid = os.getpid()
        self.thread_ended = None  # Its sentinel: a lock the interpreter releases as it ends.

    def start(self, function, args):
        start_joinable = getattr(self.thread_module, "start_joinable_thread", None)  # 3.13+
        if start_joinable is not None:
            handle = start_joinable(lambda: function(*args), daemon=True)
            self.thread_ended = lambda timeout: handle.join(timeout) or handle.is_done()
        else:
            self.thread_module.start_new_thread(self._track_then_run, (function, args))

    def _track_then_run(self, function, args):
        sentinel = self.thread_module._set_sentinel()  # Released as the thread's state goes.
        sentinel.acquire()
        self.thread_ended = lambda timeout: sentinel.acquire(timeout=timeout)
        function(*args)

    def adopt(self, reporter):
        """From the thread: False once exit has begun, when the reporter must not start."""
        with self.lock:
            if not self.exiting:
                self.reporter = reporter
            return not self.exiting

    def exit(self):
        # A forked child inherits this handler but not the thread it would wait for.
        if os.getpid() != self.owner_pid:
            return
        with self.lock:
            self.exiting = True
            reporter = self.reporter
        if reporter is None:
            # Not yet reporting: it idles in a sleep that waiting for would add to every exit of a
            # program that never imports torch.distributed.
            return
        reporter.request_stop()
        if self.thread_ended is None or not self.thread_ended(_THREAD_END_WAIT_S):
            reporter.abandon()


def _gloo_workers():
    """The thread ids of torch's gloo workers: the threads named pt_gloo_runloop (torch 2.x), or,
    where torch names none (1.x), every thread but this one."""
    import _thread
    named, others = [], []
    me = str(_thread.get_native_id())
    try:
        for tid in os.listdir("/proc/self/task"):
            if tid == me:
                continue
            others.append(tid)
            with open(f"/proc/self/task/{tid}/comm") as comm:
                if comm.read().strip() == "pt_gloo_runloop":
                    named.append(tid)
    except OSError:
        pass  # A thread that ended meanwhile, or no /proc: what was seen so far.
    return named or others


def _running(tid):
    try:
        with open(f"/proc/self/task/{tid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "R"
    except (OSError, IndexError):
        return False


def _settle_gloo_workers():
    """At exit, before the interpreter finalises: lets torch's gloo workers finish with the
    collectives they completed. A worker drops a collective just after completing it, and the
    last reference to a tensor whose Python object the script has freed takes the GIL; once the
    interpreter finalises, Python ends that thread inside the work's noexcept destructor and the
    rank aborts with "terminate called without an active exception", under torchrun too (torch
    2.13: ~AsyncAllreduceWork -> decref_pyobject -> PyEval_AcquireThread -> pthread_exit; torch
    1.13 aborts the same way, 1 job in 14 beside CPU hogs). Waits, with the GIL free, until no
    worker runs (a preempted one is runnable: on a loaded box it is waited for too)."""
    if "torch.distributed" not in sys.modules:
        return
    workers = _gloo_workers()
    if not workers:
        return
    import time
    started = time.monotonic()
    quiet = 0
    while quiet < _GLOO_QUIET_LOOKS and time.monotonic() < started + _GLOO_SETTLE_S:
        time.sleep(0.005)  # The GIL free: a worker waiting for it takes it now.
        quiet = 0 if any(_running(tid) for tid in workers) else quiet + 1
    _debug(f"exit waited {time.monotonic() - started:.3f} s for {len(workers)} thread(s) to settle")


def _wait_then_report(main_thread_id, interval_s, handoff):
    """The reporter thread: idles on a dictionary lookup until the program has imported
    torch.distributed, then reports until the interpreter exits."""
    import time
    try:
        while not _torch_distributed_imported():
            time.sleep(interval_s)
        from mcprun import _progress
        _progress.run(main_thread_id, interval_s, handoff.adopt)
    except Exception as error:
        _debug(f"reporter stopped: {error!r}")


def _start_collective_watch():
    try:
        if not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & os.environ.keys():
            # Read by torch when the first process group records a collective, long after this.
            os.environ["TORCH_FR_BUFFER_SIZE"] = _FLIGHT_RECORDER_ENTRIES
        import _thread
        import atexit  # Built in, like _thread: nothing to load.
        handoff = _ExitHandoff(_thread)
        atexit.register(handoff.exit)
        handoff.start(_wait_then_report, (_thread.get_ident(), _interval_s(), handoff))
    except Exception as error:
        _debug(f"reporter not started: {error!r}")


def _chain_to_user_sitecustomize():
    """Imports the next sitecustomize on sys.path, leaving it as sys.modules['sitecustomize'].
    Its exceptions propagate: site reports them exactly as it would have without us."""
    ours = os.path.realpath(os.path.dirname(__file__))
    others = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != ours]
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        spec = find_spec(__name__, others) if find_spec else None
        if spec is not None:
            break
    else:
        return
    if not hasattr(spec.loader, "exec_module"):
        return
    # importlib's own, already loaded: importlib.util would cost ~9 ms of imports at every start.
    import _frozen_importlib
    module = _frozen_importlib.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


def _main():
    import atexit
    # First registered, so last to run: after the program's own handlers and the reporter's.
    atexit.register(_settle_gloo_workers)
    watch = os.environ.get("MCPRUN_COLLECTIVE_WATCH") == "1"
    if watch:
        # DataLoader workers and the user's subprocesses inherit no reporter of their own.
        del os.environ["MCPRUN_COLLECTIVE_WATCH"]
    try:
        _chain_to_user_sitecustomize()
    finally:
        # After the user's sitecustomize, so that a buffer size it sets is the one kept.
        if watch:
            _start_collective_watch()


_main()
