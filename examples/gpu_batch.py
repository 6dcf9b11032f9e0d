"""GPU container jobs: batched matrix products, one call per seed, in one (emulated) array job.

    python examples/gpu_batch.py            # offline: a local emulator runs each call as a process
    python examples/gpu_batch.py --check    # exit 1 unless every call ran on a CUDA GPU
    python examples/gpu_batch.py --cloud    # real AWS Batch (after `fnmap deploy batch deploy`)

``gpu=1`` sends the calls to the ``batch`` backend.  Offline, the example
starts ``fnmap emulator`` (as fnmap itself does for ``gpu=`` when no AWS region
or Batch endpoint is configured), whose Batch API runs each child of the array job
as a local process that holds GPUs of its own among those ``nvidia-smi -L``
lists (``CUDA_VISIBLE_DEVICES``; others wait until GPUs are free).  Each call multiplies a batch of random
matrices with torch on the GPU when one is visible, and with NumPy on the CPU
otherwise, and reports the device it saw.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import fnmap


def batched_matmul(seed: int) -> dict:
    """Multiply a batch of random matrices on the device this call sees; report it and the speed."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        batch, n = 32, 2048
        device = torch.device("cuda")
        generator = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn(batch, n, n, device=device, generator=generator)
        b = torch.randn(batch, n, n, device=device, generator=generator)
        torch.bmm(a, b)  # warm-up: CUDA context and kernels
        torch.cuda.synchronize()
        started = time.perf_counter()
        c = torch.bmm(a, b)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        name = f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
        checksum = float(c.double().mean())
    else:
        import numpy as np

        batch, n = 8, 256
        rng = np.random.default_rng(seed)
        a = rng.standard_normal((batch, n, n), dtype=np.float32)
        b = rng.standard_normal((batch, n, n), dtype=np.float32)
        started = time.perf_counter()
        c = a @ b
        seconds = time.perf_counter() - started
        name = (
            "cpu (numpy; torch is not installed)"
            if torch is None
            else "cpu (numpy; torch sees no GPU)"
        )
        checksum = float(c.astype(np.float64).mean())
    return {
        "seed": seed,
        "device": name,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "array_index": os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX"),
        "gflops": 2 * batch * n**3 / seconds / 1e9,
        "checksum": round(checksum, 6),
    }


def start_emulator():
    """``fnmap emulator`` on a free loopback port; points boto3's Batch client and fnmap at it."""
    from fnmap.emulator.launcher import EmulatorLauncher

    emulator = EmulatorLauncher(1, secret=os.environ.get("FNMAP_SECRET"), embedded=True)
    # boto3 signs with the emulator's credentials: its Batch API accepts no others.
    os.environ.update(AWS_ENDPOINT_URL_BATCH=emulator.url, FNMAP_SECRET=emulator.secret, **emulator.aws_environment)
    print(f"emulator with the Batch API at {emulator.url}")
    return emulator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless every call ran on a CUDA GPU"
    )
    parser.add_argument(
        "--cloud", action="store_true", help="use AWS Batch as configured (no emulator)"
    )
    parser.add_argument(
        "--calls", type=int, default=8, help="number of calls (children of the array job)"
    )
    args = parser.parse_args()

    emulator = None
    if not args.cloud and not os.environ.get("AWS_ENDPOINT_URL_BATCH"):
        emulator = start_emulator()
    try:
        started = time.perf_counter()
        results = fnmap.map(batched_matmul, range(args.calls), gpu=1, memory=8000)
        wall = time.perf_counter() - started
    finally:
        if emulator is not None:
            emulator.stop()
    for r in results:
        print(
            f"call {r['seed']}: index {r['array_index']}, "
            f"CUDA_VISIBLE_DEVICES={r['cuda_visible_devices']!r}, "
            f"{r['device']}, {r['gflops']:.1f} GFLOP/s, checksum {r['checksum']}"
        )
    print(f"{len(results)} calls in {wall:.1f} s")
    if args.check:
        off_gpu = [r["seed"] for r in results if not r["device"].startswith("cuda")]
        if off_gpu:
            print(f"CHECK FAILED: calls {off_gpu} did not run on a GPU", file=sys.stderr)
            return 1
        print(
            f"CHECK OK: all {len(results)} calls ran on a GPU: "
            f"{sorted({r['device'] for r in results})}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
