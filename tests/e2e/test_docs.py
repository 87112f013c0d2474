"""Every flag that `--help` shows, of mcprun, each of its subcommands and rendezvousd, is
documented somewhere under docs/."""
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


if __name__ == "__main__":
    unittest.main()
