"""The box a benchmark ran on, printed first by every scripts/bench-*: its cores, its NVIDIA GPUs
(from the driver's /proc files, as mcprun reads them) and each torch the benchmark runs, with the
CUDA that torch was built for. Figures from a GPU box and a CPU box differ (a CUDA build of torch
is heavier to import), so a figure without its box cannot be compared."""
import glob
import os
import socket
import subprocess


def gpus():
    """The model of every NVIDIA GPU the driver lists; empty without one."""
    models = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        models.append(fields.get("Model", "unknown").strip())
    return models


def torch_of(python):
    """'torch 2.13.0+cpu (no CUDA)' for an interpreter, or why it has none."""
    try:
        probe = subprocess.run(
            [python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
            capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"no torch ({error})"
    if probe.returncode != 0:
        return "no torch"
    version, cuda = probe.stdout.split()[-2:]
    return f"torch {version} ({'no CUDA' if cuda == 'None' else 'CUDA ' + cuda})"


def interpreter_of(script):
    """The interpreter a script's shebang names (torchrun's), else the script itself."""
    try:
        with open(script, "rb") as f:
            first = f.readline().decode(errors="replace")
    except OSError:
        return script
    return first[2:].split()[0] if first.startswith("#!") else script


def describe(pythons):
    """Lines that say which box this is and which torch each given interpreter has."""
    models = gpus()
    gpu_text = (f"{len(models)} NVIDIA GPU(s): {', '.join(sorted(set(models)))}" if models
                else "no NVIDIA GPU")
    lines = [f"box: {socket.gethostname()}, {os.cpu_count()} cores, {gpu_text}"]
    for python in dict.fromkeys(pythons):  # Each once, in order.
        lines.append(f"  {python}: {torch_of(python)}")
    return lines


def print_box(pythons):
    for line in describe(pythons):
        print(line, flush=True)
