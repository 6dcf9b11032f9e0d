"""The GPUs of the emulator's Batch jobs: which the machine has, and which each running child holds.

A child asking for N GPUs gets N devices of its own (``CUDA_VISIBLE_DEVICES``) or waits until they are
free, as on a Batch compute environment; a job asking for more than the machine has is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading


def visible_gpus(listing: str, cuda_visible_devices: str | None = None) -> list[str]:
    """The GPUs of ``nvidia-smi -L`` output (``GPU 0: NVIDIA H200 (UUID: GPU-...)``).

    Their indices; when the emulator itself runs under ``CUDA_VISIBLE_DEVICES``,
    only those devices, as that variable names them (indices or UUIDs), in its order.
    """
    found = {}
    for line in listing.splitlines():
        match = re.match(r"GPU (\d+):", line)
        if match:
            uuid_match = re.search(r"UUID: ([^)\s]+)", line)
            found[match.group(1)] = uuid_match.group(1) if uuid_match else None
    if cuda_visible_devices is None:
        return list(found)
    names = set(found) | {u for u in found.values() if u}
    allowed = [v.strip() for v in cuda_visible_devices.split(",") if v.strip()]
    return [v for v in allowed if v in names]


def detect_gpus(environ=os.environ) -> list[str]:
    """This machine's GPUs (see :func:`visible_gpus`); [] without ``nvidia-smi`` or GPUs."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return visible_gpus(out.stdout, environ.get("CUDA_VISIBLE_DEVICES"))


class Devices:
    """The machine's GPUs, each lent to one child at a time (never two children on one card).

    A child asking for ``n`` GPUs takes ``n`` free ones, lowest first, or waits until that many are
    given back.  On a machine without GPUs nothing is lent: children run on the CPU.
    """

    def __init__(self, gpus: list[str]):
        self.gpus = list(gpus)
        self._free = list(gpus)
        self._changed = threading.Condition()

    def refusal(self, wanted: int) -> str | None:
        """Why a job asking ``wanted`` GPUs per child can never run here (None when it can)."""
        if wanted <= len(self.gpus) or not self.gpus:
            return None
        listed = ", ".join(self.gpus)
        return (
            f"the job asks for {wanted} GPUs per child but this machine has {len(self.gpus)} "
            f"(nvidia-smi -L lists: {listed}), so its children could never start: ask for "
            f"gpu={len(self.gpus)} or fewer, or run the job on AWS Batch (set region=... or "
            "AWS_ENDPOINT_URL_BATCH) on instances with enough GPUs"
        )

    def take(self, wanted: int, still_wanted) -> list[str] | None:
        """``wanted`` free GPUs (``[]`` when none are wanted or the machine has none), waiting for
        them while ``still_wanted()``; None when it stopped being wanted first."""
        if wanted <= 0 or not self.gpus:
            return []
        with self._changed:
            while len(self._free) < wanted:
                if not still_wanted():
                    return None
                self._changed.wait(0.25)
            taken = sorted(self._free, key=self.gpus.index)[:wanted]
            for gpu in taken:
                self._free.remove(gpu)
            return taken

    def give_back(self, taken: list[str]) -> None:
        if taken:
            with self._changed:
                self._free.extend(taken)
                self._changed.notify_all()
