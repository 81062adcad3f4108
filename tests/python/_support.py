"""Shared by the Python tests: where the package and library are, and the
subprocess runner for workloads that must choose their allocator before CUDA
starts (tests/python/_workloads.py)."""

import importlib.util
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "integrations", "python")

if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)


def have(module):
    return importlib.util.find_spec(module) is not None


def cuda_device_count():
    """GPUs torch sees, without initialising CUDA in this process (0 without torch)."""
    if not have("torch"):
        return 0
    r = subprocess.run([sys.executable, "-c",
                        "import torch; print(torch.cuda.device_count() if "
                        "torch.cuda.is_available() else 0)"],
                       capture_output=True, text=True, timeout=120)
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


_gpus = None


def gpus():
    global _gpus
    if _gpus is None:
        _gpus = cuda_device_count()
    return _gpus


def worker_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_DIR, env.get("PYTHONPATH")) if p)
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the GPU machine
    if extra:
        env.update(extra)
    return env


def run_workload(*args, timeout=600, env=None):
    """Runs _workloads.py with `args` in a fresh interpreter; returns its result dict.

    The workload prints one line "GVM_RESULT <json>"; everything else it prints
    is passed through so that pytest -s shows it.
    """
    cmd = [sys.executable, os.path.join(HERE, "_workloads.py")] + [str(a) for a in args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=worker_env(env))
    sys.stdout.write(r.stdout)
    sys.stderr.write(r.stderr)
    if r.returncode != 0:
        raise AssertionError("%s exited %d; stderr tail:\n%s"
                             % (" ".join(cmd), r.returncode, r.stderr[-4000:]))
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("GVM_RESULT "):
            return json.loads(line[len("GVM_RESULT "):])
    raise AssertionError("%s printed no GVM_RESULT line" % " ".join(cmd))
