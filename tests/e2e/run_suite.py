"""Runs one end-to-end suite as `python -m unittest -v SUITE` does, then writes to $MCPRUN_SUITE_TIMES:
NAME, the suite's wall and CPU seconds (the CPU of this process and of every process it waited for:
the launcher, its workers, a daemon); and NAME.tests, each test's. scripts/test.sh shows from them
where the test command's time goes.

    python run_suite.py NAME SUITE
"""
import os
import resource
import sys
import time
import unittest


def cpu_seconds():
    """This process's CPU and that of every process it waited for, so far."""
    used = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(usage.ru_utime + usage.ru_stime for usage in used)


class TimedResult(unittest.TextTestResult):
    """unittest's verbose result, plus each test's wall and CPU seconds."""
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = {}
        self.seconds = {}  # Test id -> (wall, CPU).

    def startTest(self, test):
        self.started[test.id()] = (time.monotonic(), cpu_seconds())
        super().startTest(test)

    def stopTest(self, test):
        wall, cpu = self.started.pop(test.id())
        self.seconds[test.id()] = (time.monotonic() - wall, cpu_seconds() - cpu)
        super().stopTest(test)


name, suite = sys.argv[1:3]
start = time.monotonic()
runner = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult)
result = unittest.main(module=None, argv=[sys.argv[0], "-v", suite], testRunner=runner, exit=False).result
wall = time.monotonic() - start
times_dir = os.environ.get("MCPRUN_SUITE_TIMES")
if times_dir:
    cpu = cpu_seconds()
    os.makedirs(times_dir, exist_ok=True)
    with open(os.path.join(times_dir, name), "w") as f:
        f.write(f"{wall:.0f} {cpu:.0f} {name}\n")
    with open(os.path.join(times_dir, name + ".tests"), "w") as f:
        f.writelines(f"{wall:.0f} {cpu:.0f} {name} {test.rsplit('.', 1)[-1]}\n"
                     for test, (wall, cpu) in result.seconds.items())
sys.exit(0 if result.wasSuccessful() else 1)
