"""The wall time a rank's main thread spends in torch's DataLoader, for the straggler watch.

A rank whose steps wait on its loader (a slow disk, a heavy transform, too few loader workers) is
named "in its data loader" by the share of the wall clock its loader took. A stack sampled once a
record is too coarse for that: a window holds ten such samples a rank, and on a loaded box they
land in the loader's waits less often than those waits last (38 % of the samples for a loader
that took two thirds of every step, beside a CPU hog).

The clock wraps _BaseDataLoaderIter.__next__, the one method every DataLoader iterator of torch
1.13 and 2.x runs per batch (single- and multi-process), once torch.utils.data is imported. A
torch without it costs only the figure: the record then carries no loader_s, and the watch falls
back on the sampled stacks."""

import functools
import sys
import threading
import time

from mcprun._debug import debug


class LoaderClock:
    """Seconds the main thread spent in DataLoader batches so far; None until it is installed."""

    def __init__(self, main_thread_id):
        self.main_thread_id = main_thread_id
        self.total_s = 0.0
        self.installed = False

    def seconds(self):
        if not self.installed:
            self.install()
        return round(self.total_s, 3) if self.installed else None

    def install(self):
        # Never an import from this thread: the program imports torch, which imports the loader.
        module = sys.modules.get("torch.utils.data.dataloader")
        iterator = getattr(module, "_BaseDataLoaderIter", None)
        original = getattr(iterator, "__next__", None)
        if original is None:
            return
        if getattr(original, "mcprun_loader_clock", None) is not None:  # A second reporter.
            self.installed = True
            return
        clock = self

        @functools.wraps(original)
        def timed_next(batches):
            if threading.get_ident() != clock.main_thread_id:
                return original(batches)
            start = time.monotonic()
            try:
                return original(batches)
            finally:
                clock.total_s += time.monotonic() - start

        timed_next.mcprun_loader_clock = clock
        try:
            iterator.__next__ = timed_next
        except (AttributeError, TypeError) as error:
            debug(f"no data loader clock: {error!r}")
            return
        self.installed = True
