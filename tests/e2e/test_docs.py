"""Every flag that `--help` shows, of mcprun, each of its subcommands and rendezvousd, is
documented somewhere under docs/; every script the repository runs or shows leaves its process
group the way torch 2.x survives."""
import glob
import os
import re
import subprocess
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
MCPRUN = os.environ.get("MCPRUN", os.path.join(REPO, "build/launcher/mcprun"))
RENDEZVOUSD = os.environ.get("RENDEZVOUSD", os.path.join(REPO, "build/rendezvousd/rendezvousd"))
# The subcommands that take flags (`topo` and `hostnames` take none).
SUBCOMMANDS = ("doctor", "store", "jobs", "status", "stop")
# A long flag, not a piece of a word or of a longer flag.
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]")


def help_text(*argv):
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def documented(flag, docs):
    """`flag` appears in `docs`, in the spelling --help shows or its dashed one."""
    spellings = {flag, "--" + flag[2:].replace("_", "-")}
    return any(re.search(r"(?<![\w-])" + re.escape(s) + r"(?![\w-])", docs) for s in spellings)


class EveryFlagIsDocumented(unittest.TestCase):
    def setUp(self):
        self.docs = ""
        for path in sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)):
            with open(path) as f:
                self.docs += f.read()
        self.assertTrue(self.docs, "docs/ has no .md files")

    def check(self, *argv):
        text = help_text(*argv)
        flags = sorted(set(FLAG.findall(text)))
        self.assertGreater(len(flags), 1, f"{' '.join(argv)} printed no flags:\n{text}")
        missing = [flag for flag in flags if not documented(flag, self.docs)]
        self.assertEqual(missing, [], f"{os.path.basename(argv[0])} {' '.join(argv[1:])}: "
                                      f"flags missing from docs/: {', '.join(missing)}")

    def test_mcprun(self):
        self.check(MCPRUN, "--help")

    def test_mcprun_subcommands(self):
        for subcommand in SUBCOMMANDS:
            with self.subTest(subcommand=subcommand):
                self.check(MCPRUN, subcommand, "--help")

    def test_rendezvousd(self):
        self.check(RENDEZVOUSD, "--help")


# Where the repository's scripts live: Python files, docs, scripts/, examples/ and the end-to-end
# tests' inline workers.
SCRIPT_GLOBS = ("**/*.py", "**/*.md", "scripts/*", "examples/*", "tests/e2e/*")
SKIPPED_TOP = (".git", ".venv", "build")
DESTROY = re.compile(r"\bdist\.destroy_process_group\(")


def repository_scripts():
    paths = set()
    for pattern in SCRIPT_GLOBS:
        for path in glob.glob(os.path.join(REPO, pattern), recursive=True):
            top = os.path.relpath(path, REPO).split(os.sep)[0]
            if os.path.isfile(path) and not top.startswith(SKIPPED_TOP):
                paths.add(path)
    return sorted(paths)


class EveryProcessGroupIsLeftTogether(unittest.TestCase):
    """torch 2.x can abort a rank ("terminate called without an active exception") whose
    destroy_process_group races a peer that already exited; a barrier just before it prevents
    that. Users copy these scripts, so each one must show the safe ending."""

    def test_a_barrier_comes_just_before_every_destroy(self):
        unsafe = []
        for path in repository_scripts():
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
            for number, line in enumerate(lines):
                match = DESTROY.search(line)
                if not match:
                    continue
                before = line[:match.start()]
                if "barrier(" not in before:
                    previous = next((l for l in reversed(lines[:number]) if l.strip()), "")
                    before = previous
                if "dist.barrier(" not in before:
                    unsafe.append(f"{os.path.relpath(path, REPO)}:{number + 1}")
        self.assertEqual(unsafe, [], "a process group destroyed without a dist.barrier() on "
                                     "the line before")


if __name__ == "__main__":
    unittest.main()
