"""Several hosts: the mesh argument of the command line and jax.distributed start-up.

One process runs per host (a TPU VM of a pod slice, or a GPU node); every process runs the same
program. `jax.distributed.initialize` must come before any other JAX call: after it,
jax.devices() lists every chip of every host, make_mesh builds the global ('data', 'model')
mesh, specjax.load(mesh=...) reads only the shards of the process's own chips, and results are
gathered with jax.experimental.multihost_utils.process_allgather.

On Cloud TPU and on SLURM/Open MPI clusters jax.distributed.initialize() finds the coordinator
itself; elsewhere pass coordinator (HOST:PORT of process 0), num_processes and process_id.
"""

from __future__ import annotations

import re


def parse_mesh(text: str) -> tuple[int, int]:
    """'DxM' (e.g. '2x4') -> (data, model); ValueError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text or "")
    if not match or min(int(match[1]), int(match[2])) < 1:
        raise ValueError(f"--mesh must be DATAxMODEL with positive sizes (e.g. 2x4), got {text!r}")
    return int(match[1]), int(match[2])


def initialize(
    coordinator: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Join the multi-process JAX runtime (jax.distributed.initialize). With no arguments (or
    coordinator "auto") JAX detects the cluster (Cloud TPU, SLURM, Open MPI); explicit settings
    need all three."""
    import jax

    if coordinator == "auto":
        coordinator = None
        if num_processes is not None or process_id is not None:
            raise ValueError(
                "--coordinator auto detects the processes: drop --num-processes and --process-id"
            )
    given = [coordinator is not None, num_processes is not None, process_id is not None]
    if any(given) and not all(given):
        raise ValueError(
            "--coordinator, --num-processes and --process-id go together (or pass none of them "
            "on Cloud TPU / SLURM, where jax.distributed finds them itself)"
        )
    if num_processes is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id {process_id} is outside [0, {num_processes})")
    jax.distributed.initialize(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
    )


def gather_to_host(x):
    """A (possibly multi-host) jax array as one numpy array on every process."""
    import numpy as np

    if getattr(x, "is_fully_addressable", True):
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
