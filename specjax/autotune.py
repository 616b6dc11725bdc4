"""Hardware-aware speculation, the cost side: how long the target takes to verify N tree nodes
on this backend, measured once and kept on disk.

Axis letters: B batch, N tree nodes, S cache length.

On a 2-core CPU the target's cost grows with N from N = 1 (each node is a row of every matmul),
on an accelerator it is nearly flat up to tens of nodes (the weights are read once either way).
The best draft tree depends on that curve, so it is measured, not assumed: `verify_costs` runs
the target over blocks of N tokens at a representative context (one jitted forward per N, the
median of a few calls) and stores t(N) in a JSON file keyed by the backend, the device kind, the
model's weights fingerprint, the batch, the context and the dtype. Later calls with the same key
read the file (default folder: $SPECJAX_CACHE, else ~/.cache/specjax).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.benchmark import time_interleaved
from specjax.cache import init_cache
from specjax.tree import causal_mask

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 256  # committed positions before the measured block
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class VerifyCosts:
    """t(N): seconds of one target forward over N tree nodes, measured at `nodes`.

    key: what the measurement is valid for (see cost_key); nodes ascending; seconds per entry.
    """

    key: str
    nodes: tuple[int, ...]
    seconds: tuple[float, ...]

    def t_verify(self, n: int) -> float:
        """Seconds for n nodes: measured points, linear in between, linear extrapolation from the
        last two points beyond them."""
        if n < 1:
            raise ValueError(f"a tree has at least one node, got {n}")
        xs, ys = np.asarray(self.nodes, float), np.asarray(self.seconds, float)
        if n <= xs[-1] or len(xs) == 1:
            return float(np.interp(n, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (n - xs[-1]))

    def relative(self, n: int) -> float:
        """t(n) / t(1): the price of verifying n nodes in single-token decoding steps."""
        return self.t_verify(n) / self.t_verify(1)

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> VerifyCosts:
        return cls(key=data["key"], nodes=tuple(data["nodes"]), seconds=tuple(data["seconds"]))


def cost_key(target, *, batch: int, context: int) -> str:
    """What a cost measurement depends on: backend, device kind, the target's weights
    (fingerprint), batch, context and dtype."""
    from specjax.train.checkpoint import target_fingerprint

    device = jax.devices()[0]
    parts = (
        jax.default_backend(),
        getattr(device, "device_kind", "unknown"),
        target_fingerprint(target),
        f"b{batch}",
        f"s{context}",
        target.config.dtype,
    )
    return "|".join(parts)


def cache_dir() -> Path:
    """Where measured costs are kept: $SPECJAX_CACHE, else ~/.cache/specjax."""
    env = os.environ.get("SPECJAX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "specjax"


def _cache_file(key: str, folder: Path) -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return folder / "costs" / f"verify-{digest}.json"


def measure_verify_costs(
    target,
    *,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    nodes: Sequence[int] = DEFAULT_NODES,
    reps: int = 5,
    progress: Callable[[str], None] | None = None,
) -> VerifyCosts:
    """Time the target over blocks of N nodes (for N in `nodes`) at `context` committed
    positions, batch rows each. The block is a chain (a causal mask): the cost of a tree of N
    nodes is the same, only the mask differs."""
    nodes = tuple(sorted(set(int(n) for n in nodes)))
    if not nodes or nodes[0] < 1:
        raise ValueError(f"nodes must be positive ints, got {nodes}")
    if context + nodes[-1] > target.config.max_seq_len:
        raise ValueError(
            f"context {context} + {nodes[-1]} nodes exceeds the model's max_seq_len "
            f"{target.config.max_seq_len}: lower the context or the largest node count"
        )
    graphdef, params = nnx.split(target)
    cache = init_cache(target.config, batch, context + nodes[-1])
    cache = cache.replace(lengths=jnp.full((batch,), context, jnp.int32))

    @jax.jit
    def forward(params, cache, tokens):
        model = nnx.merge(graphdef, params)
        n = tokens.shape[1]
        positions = cache.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
        out = model(tokens, positions=positions, cache=cache, tree_mask=causal_mask(batch, n))
        return out.logits

    seconds = []
    for i, n in enumerate(nodes):
        if progress is not None:
            progress(f"measuring target cost: {n} node(s) ({i + 1}/{len(nodes)})")
        tokens = jnp.ones((batch, n), jnp.int32)
        timing = time_interleaved({n: lambda tokens=tokens: forward(params, cache, tokens)}, reps)
        seconds.append(timing[n].median)
    key = cost_key(target, batch=batch, context=context)
    return VerifyCosts(key=key, nodes=nodes, seconds=tuple(seconds))


def _print_progress(message: str) -> None:
    print(f"[specjax] {message}", file=sys.stderr, flush=True)


def verify_costs(
    target,
    *,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    nodes: Sequence[int] = DEFAULT_NODES,
    reps: int = 5,
    folder: str | Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = _print_progress,
) -> VerifyCosts:
    """t(N) for this target on this backend: read from the cache folder when measured before
    with the same key and nodes, else measured (with a progress line) and written there."""
    folder = Path(folder) if folder is not None else cache_dir()
    key = cost_key(target, batch=batch, context=context)
    path = _cache_file(key, folder)
    wanted = tuple(sorted(set(int(n) for n in nodes)))
    if path.exists() and not refresh:
        try:
            costs = VerifyCosts.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            costs = None  # an unreadable file is measured again and rewritten
        if costs is not None and costs.key == key and costs.nodes == wanted:
            return costs
    costs = measure_verify_costs(
        target, batch=batch, context=context, nodes=wanted, reps=reps, progress=progress
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(costs.to_json(), indent=2) + "\n")
    return costs
