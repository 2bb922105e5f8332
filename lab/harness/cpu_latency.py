"""Hold a CPU wake-up latency limit (Linux PM QoS) for the length of a benchmark.

Writing a number of microseconds to `/dev/cpu_dma_latency` and keeping the file open asks the
kernel's idle governor to use no idle state that takes longer than that to leave; 0 keeps idle
CPUs polling instead of halting. On a virtual machine a halted vCPU is woken through the
hypervisor, which costs every hop between processes of a lightly loaded stack far more than the
work itself (`lab.experiments.wakeup_latency` measures it). The limit lasts while the file is open
and is dropped when it is closed: nothing outlives the benchmark. This is the knob tuned's
`latency-performance` profile turns (`force_latency`); it needs root.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

PM_QOS = Path("/dev/cpu_dma_latency")


class CpuLatencyUnavailable(RuntimeError):
    """The limit cannot be held here (no PM QoS device, or not allowed to write it)."""


@contextlib.contextmanager
def hold_cpu_latency(microseconds: int | None, device: Path = PM_QOS) -> Iterator[int | None]:
    """Hold `microseconds` as the CPUs' wake-up latency limit inside the block; None: no limit."""
    if microseconds is None:
        yield None
        return
    if microseconds < 0:
        raise ValueError(f"a wake-up latency limit is >= 0 microseconds, not {microseconds}")
    try:
        fd = os.open(device, os.O_WRONLY)
    except OSError as exc:
        raise CpuLatencyUnavailable(
            f"cannot hold a CPU wake-up latency limit: {device}: {exc.strerror} (Linux PM QoS; needs root)"
        ) from exc
    try:
        os.write(fd, struct.pack("i", microseconds))
        yield microseconds
    finally:
        os.close(fd)
