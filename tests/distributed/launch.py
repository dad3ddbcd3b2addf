"""Start a real multi-process job with torchrun (`python -m torch.distributed.run`) under a hard time limit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    """A TCP port nobody listens on right now (each job gets its own rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(args: list[str], nproc: int, timeout: float) -> str:
    """Run `python -m torch.distributed.run --nproc_per_node=nproc <args>` from the repository root on CPU (gloo,
    one thread per process); returns its output.

    A job still running after `timeout` seconds (a rank waiting forever in a collective: unequal batch counts) is
    killed with its whole process group and the test fails, so a hang costs at most `timeout`.

    Raises:
        pytest.fail.Exception: on a non-zero exit or a timeout, with the end of the output.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", PYTHONUNBUFFERED="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
               f"--master_port={free_port()}", *args]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"torchrun job did not finish within {timeout:.0f} s (hang?): {' '.join(args)}\n{output[-4000:]}")
    if process.returncode != 0:
        pytest.fail(f"torchrun job failed with exit code {process.returncode}: {' '.join(args)}\n{output[-6000:]}")
    return output
