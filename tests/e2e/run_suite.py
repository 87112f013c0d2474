"""Runs one end-to-end suite as `python -m unittest -v SUITE` does, then writes its wall and CPU
seconds to $MCPRUN_SUITE_TIMES/NAME: the CPU of this process and of every process it waited for
(the launcher, its workers, a daemon), so that scripts/test.sh can show where its time goes.

    python run_suite.py NAME SUITE
"""
import os
import resource
import sys
import time
import unittest

name, suite = sys.argv[1:3]
start = time.monotonic()
result = unittest.main(module=None, argv=[sys.argv[0], "-v", suite], exit=False).result
wall = time.monotonic() - start
times_dir = os.environ.get("MCPRUN_SUITE_TIMES")
if times_dir:
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(usage.ru_utime + usage.ru_stime for usage in used)
    os.makedirs(times_dir, exist_ok=True)
    with open(os.path.join(times_dir, name), "w") as f:
        f.write(f"{wall:.0f} {cpu:.0f} {name}\n")
sys.exit(0 if result.wasSuccessful() else 1)
