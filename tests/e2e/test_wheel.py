"""The wheel as a user gets it: built by pip from this source tree, made self-contained by
auditwheel, installed into a fresh venv with PyPI's torch 2.13, and run from that venv without
activating it. Also the sdist, down to the one line that names a missing build dependency."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

from harness import REPO

# The tooling scripts/install-deps.sh puts in .venv: pip, scikit-build-core, auditwheel, build.
TOOLS_PYTHON = os.path.join(REPO, ".venv", "bin", "python")
TORCH = "2.13.0"
VERSION = re.search(r"project\(mcprun VERSION ([0-9.]+)", open(os.path.join(REPO, "CMakeLists.txt")).read())[1]
# What the C library is made of: the only libraries an installed program may load.
GLIBC = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2"}

# A real gloo DDP job: each rank trains a few synchronised steps and records what it ran on.
DDP_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
import mcprun

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(rank)
for _ in range(5):
    inputs = torch.randn(16, 4, generator=data)
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    mcprun.heartbeat()
weights = torch.cat([p.detach().flatten() for p in model.parameters()])
gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, weights)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as out:
    json.dump({"executable": sys.executable, "torch": torch.__version__, "mcprun": mcprun.__file__,
               "in_sync": all(torch.equal(weights, other) for other in gathered)}, out)
dist.barrier()
dist.destroy_process_group()
"""


def run(argv, **kwargs):
    """Runs `argv` to completion (a finite timeout), output captured as text."""
    kwargs.setdefault("timeout", 600)
    return subprocess.run(argv, capture_output=True, text=True, **kwargs)


class WheelTest(unittest.TestCase):
    """One build, one repair and one venv serve every test: each costs minutes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mcprun-wheel-")
        cls.build_dir = ""
        try:
            cls.build_and_install()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        shutil.rmtree(cls.build_dir, ignore_errors=True)

    @classmethod
    def build_and_install(cls):
        # The compile lines of scripts/build.sh, through ccache, from a build folder beside its build/:
        # with the paths under the repository relative to the folder (CCACHE_BASEDIR), the plain
        # build's objects serve this one, whose link (static libraries) is its own.
        # CXX: CMake's own pick, which scikit-build-core would replace with Python's build compiler.
        cls.build_env = dict(os.environ, CMAKE_GENERATOR="Unix Makefiles", CMAKE_BUILD_PARALLEL_LEVEL="2", CXX="c++",
                             CMAKE_CXX_COMPILER_LAUNCHER="ccache", CCACHE_NOHASHDIR="1", CCACHE_BASEDIR=REPO)
        cls.build_dir = tempfile.mkdtemp(prefix="build-wheel-", dir=REPO)
        dist = os.path.join(cls.tmp, "dist")
        built = run([os.path.join(REPO, "scripts", "build-wheel"), f"--config-settings=build-dir={cls.build_dir}",
                     "--config-settings=cmake.define.MCPRUN_WERROR=ON"],
                    cwd=cls.tmp, env=dict(cls.build_env, OUT_DIR=dist, TOOLS_PYTHON=TOOLS_PYTHON))
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        cls.shown = built.stdout
        [cls.wheel] = [os.path.join(dist, name) for name in os.listdir(dist) if name.endswith(".whl")]
        cls.sdist = os.path.join(dist, f"mcprun-{VERSION}.tar.gz")

        # A fresh venv as a user makes it: torch from PyPI, then the wheel; nothing of the source tree.
        cls.venv = os.path.join(cls.tmp, "venv")
        made = run(["/usr/bin/python3", "-m", "venv", cls.venv])
        assert made.returncode == 0, made.stderr
        pip = os.path.join(cls.venv, "bin", "pip")
        # torch without byte-compiling its thousands of modules: half the time, the same torch.
        for requirement in (["--no-compile", f"torch=={TORCH}"], [cls.wheel]):
            installed = run([pip, "install", "-q", "--disable-pip-version-check", *requirement], cwd=cls.tmp)
            assert installed.returncode == 0, installed.stdout + installed.stderr

    def user_env(self, **extra):
        """A shell where the venv is not activated: PATH's python3 is the system's (torch 1.13)."""
        env = {name: value for name, value in os.environ.items()
               if name not in ("PYTHON_EXEC", "PYTHONPATH", "VIRTUAL_ENV") and not name.startswith("MCPRUN")}
        return dict(env, PATH="/usr/bin:/bin", **extra)

    def test_auditwheel_shows_the_manylinux_tag_in_the_name(self):
        text = " ".join(self.shown.split())
        tag = re.search(r'consistent with the following platform tag: "(manylinux_\d+_\d+_x86_64)"', text)
        self.assertIsNotNone(tag, text)
        self.assertIn(f"mcprun-{VERSION}-py3-none-{tag[1]}", os.path.basename(self.wheel))

    def test_the_installed_programs_load_only_the_c_library(self):
        for program in ("mcprun", "rendezvousd"):
            path = os.path.join(self.venv, "bin", program)
            needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", run(["readelf", "-d", path]).stdout)
            self.assertTrue(needed, program)
            self.assertLessEqual(set(needed), GLIBC, program)
            resolved = run(["ldd", path]).stdout
            self.assertNotRegex(resolved, r"yaml-cpp|spdlog|fmt|stdc\+\+|gcc_s|not found", program)

    def test_the_installed_programs_run_in_a_root_that_holds_only_the_c_library(self):
        # A root with the programs and glibc's files and nothing else: no yaml-cpp, spdlog, fmt,
        # libstdc++ or libgcc_s for the loader to find.
        root = os.path.join(self.tmp, "root")
        libraries = re.findall(r"(/\S+) \(0x", run(["ldd", os.path.join(self.venv, "bin", "mcprun")]).stdout)
        for path in libraries + [os.path.join(self.venv, "bin", "mcprun"), os.path.join(self.venv, "bin", "rendezvousd")]:
            target = os.path.join(root, path.lstrip("/") if path in libraries else os.path.basename(path))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy(path, target)
        self.addCleanup(shutil.rmtree, root, True)
        for program in ("mcprun", "rendezvousd"):
            version = run(["chroot", root, f"/{program}", "--version"], timeout=30)
            self.assertEqual(version.returncode, 0, version.stderr)
            self.assertIn(VERSION, version.stdout)

    def test_rendezvousd_runs_from_the_venvs_bin(self):
        version = run([os.path.join(self.venv, "bin", "rendezvousd"), "--version"], env=self.user_env(),
                      cwd=self.tmp, timeout=30)
        self.assertEqual(version.returncode, 0, version.stderr)
        self.assertIn(VERSION, version.stdout)

    def test_ddp_workers_run_the_venvs_python_without_activating_it(self):
        job = os.path.join(self.tmp, "job")
        os.makedirs(job)
        self.addCleanup(shutil.rmtree, job, True)
        with open(os.path.join(job, "train.py"), "w") as script:
            script.write(DDP_SCRIPT)
        launched = run([os.path.join(self.venv, "bin", "mcprun"), "-n", "2", "train.py", job],
                       cwd=job, env=self.user_env(), timeout=300)
        self.assertEqual(launched.returncode, 0, launched.stdout + launched.stderr)
        for rank in (0, 1):
            with open(os.path.join(job, f"rank{rank}.json")) as record:
                worker = json.load(record)
            self.assertEqual(worker["executable"], os.path.join(self.venv, "bin", "python3"))
            self.assertTrue(worker["torch"].startswith(TORCH), worker["torch"])
            self.assertTrue(worker["mcprun"].startswith(self.venv + os.sep), worker["mcprun"])
            self.assertTrue(worker["in_sync"], f"rank {rank}'s replica diverged")

    def test_python_exec_still_wins_over_the_venv(self):
        job = os.path.join(self.tmp, "exec")
        os.makedirs(job)
        self.addCleanup(shutil.rmtree, job, True)
        with open(os.path.join(job, "which.py"), "w") as script:
            script.write("import sys; print('worker python', sys.executable)\n")
        launched = run([os.path.join(self.venv, "bin", "mcprun"), "-n", "1", "which.py"], cwd=job,
                       env=self.user_env(PYTHON_EXEC="/usr/bin/python3"), timeout=120)
        self.assertEqual(launched.returncode, 0, launched.stdout + launched.stderr)
        self.assertIn("worker python /usr/bin/python3", launched.stdout)

    def test_the_sdist_names_a_missing_build_dependency_in_one_line(self):
        self.assertTrue(os.path.exists(self.sdist), os.listdir(os.path.dirname(self.sdist)))
        # As on a machine without Debian's libyaml-cpp-dev: CMake finds no yaml-cpp.
        # The tools' pip (it has scikit-build-core), into a folder of the test's own.
        installed = run([TOOLS_PYTHON, "-m", "pip", "install", "--no-build-isolation", "--target",
                         os.path.join(self.tmp, "target"), self.sdist,
                         "--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON"],
                        cwd=self.tmp, env=self.build_env)
        self.assertNotEqual(installed.returncode, 0)
        output = installed.stdout + installed.stderr
        self.assertRegex(output, r"\n\s*mcprun needs yaml-cpp to build: install libyaml-cpp-dev \(Debian\)\n")


if __name__ == "__main__":
    unittest.main()
