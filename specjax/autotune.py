"""Hardware-aware speculation, the cost side: how long the target takes to verify N tree nodes
and the drafter takes to draft a tree on this backend, measured once and kept on disk.

Axis letters: B batch, N tree nodes, S cache length.

On a 2-core CPU the target's cost grows with N from N = 1 (each node is a row of every matmul),
on an accelerator it is nearly flat up to tens of nodes (the weights are read once either way).
The best draft tree depends on that curve, so it is measured, not assumed: `verify_costs` runs
the target over blocks of N tokens at a representative context (one jitted forward per N, the
median of a few calls) and stores t(N) in a JSON file keyed by the backend, the device kind, the
model's weights fingerprint, the batch, the context and the dtype. Later calls with the same key
read the file (default folder: $SPECJAX_CACHE, else ~/.cache/specjax).

`draft_costs` does the same for a drafter, timing its `propose` in a speculative state at the same
context: a static-tree drafter re-runs its model over the whole block at every depth, so its cost
is depth x f(N) with f measured for N in the same grid; a dynamic-tree drafter runs one expansion
per depth over top-k frontier nodes, so its cost is linear in the depth, measured at depth 1 and
at the deepest depth for each top-k. Those states, and the states whole steps are timed in, start
from zeros standing in for the target's prefill (costs do not depend on the values), so no target
prefill is compiled for them. It also times one whole step, whose excess over draft + verify (the
acceptance rule, the commits, the loop) is kept as `overhead`, unless the caller times whole
candidate steps anyway (`CandidateSteps`, which SpecConfig.auto() uses: its first candidate gives
the overhead, one compiled step fewer on a first call that is mostly compilation).

Every timing runs the body in a jitted loop and takes off the loop call's fixed cost (a call of
zero iterations: dispatch and the copy of the carried state, which at 32 rows of SmolLM2's cache
is as long as a decoded token; TimedLoop).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax import token_choice
from specjax.cache import init_cache, tree_reserve
from specjax.kernels import cpu_panels
from specjax.paths import cache_dir
from specjax.tree import causal_mask

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXT = 256  # committed positions before the measured block
FORMAT_VERSION = 12  # 3: no pre-verifier in costs; 4: overhead may be unknown; 5: AR step loop;
# 6: candidate steps as paired ratios to plain decoding; 7: t(N) timed in interleaved rounds;
# 8: candidate steps timed in CANDIDATE_ROUNDS rounds; 9: candidates at timed node counts only,
# one ledger of timed steps per drafter, batch and context; 10: out_in matrices one buffer per
# layer (every forward on the CPU got cheaper, unevenly over N); 11: the interior of a stair
# of t(N) may be left untimed (skip_stairs); 12: the target's few-row products are sums,
# padded above 4 rows to a multiple of 8 (t(N) of the CPU changed at most N)
VERIFY_CALL_S = 0.2  # seconds a timed call of the target over N nodes lasts (several iterations)
AR_TOKENS = 33  # decoding room of the plain-decoding state timed (generate's for 33 tokens)
STATIC_DRAFT_NODES = (2, 4, 8, 16, 32, 64)
COST_NEW_TOKENS = 4  # max_new_tokens of the speculative states steps are timed in
# Rounds of CandidateSteps.measure. A SmolLM2 step on a 2-core CPU is ~0.1 s, so a ~0.2 s loop
# runs it once or twice, and single loops spread ~20% there: the median of 5 paired ratios
# instead of 3 (~1.6 s more on a first call) steadies one cost file's ratios. It does not make
# two cost files of one process agree (NOTES.md, "Eighteenth session").
CANDIDATE_ROUNDS = 5
# Confirmation of the trees a choice hinges on (timed_steps' confirm): up to this many more
# measurements, while a tree has one reading or two further apart than CONFIRM_SPREAD. Back to
# back, one tree's readings spread ~4-8% on a 2-core AMD EPYC (SmolLM2); a slow spell of
# plain decoding once read a tree 17% below every other reading of it (NOTES.md,
# "Forty-sixth session").
CONFIRM_PASSES = 2
CONFIRM_SPREAD = 0.1


@dataclasses.dataclass(frozen=True)
class VerifyCosts:
    """t(N): seconds of one target forward over N tree nodes, measured at `nodes`.

    key: what the measurement is valid for (see cost_key); nodes ascending (the counts
    measured); seconds per entry. requested: the node counts asked for (nodes is a subset of
    them when the grid stopped early or skipped a stair: see measure_verify_costs); stop_ratio:
    the stop rule it was measured with (0: none); skip_stairs: whether stairs could be skipped;
    stairs: (lo, hi) pairs of measured counts whose interior was judged a stair and left
    partly untimed.
    """

    key: str
    nodes: tuple[int, ...]
    seconds: tuple[float, ...]
    ar_token: float = 0.0  # seconds per token of specjax.generate at this context (0: unknown)
    requested: tuple[int, ...] = ()
    stop_ratio: float = 0.0
    skip_stairs: bool = False
    stairs: tuple[tuple[int, int], ...] = ()

    def t_verify(self, n: int) -> float:
        """Seconds for n nodes: measured points, linear in between, linear extrapolation from the
        last two points beyond them (never falling: noise can put t(2) under t(1)). A count left
        untimed inside a stair costs what the dearest count timed in it does (its middle or its
        top): the stair was judged so because the middle cost at least the top."""
        if n < 1:
            raise ValueError(f"a tree has at least one node, got {n}")
        for lo, hi in self.stairs:
            if lo < n < hi and n not in self.nodes:
                return max(s for m, s in zip(self.nodes, self.seconds, strict=True) if lo < m <= hi)
        xs, ys = np.asarray(self.nodes, float), np.asarray(self.seconds, float)
        if n <= xs[-1] or len(xs) == 1:
            return float(np.interp(n, xs, ys))
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return float(ys[-1] + slope * (n - xs[-1]))

    def with_points(self, other: VerifyCosts) -> VerifyCosts:
        """These costs with other's timed counts added (other's seconds where both timed one);
        the grid asked for, the stop rule and the stairs stay these costs'."""
        merged = dict(zip(self.nodes, self.seconds, strict=True))
        merged.update(zip(other.nodes, other.seconds, strict=True))
        nodes = tuple(sorted(merged))
        return dataclasses.replace(self, nodes=nodes, seconds=tuple(merged[n] for n in nodes))

    def relative(self, n: int) -> float:
        """t(n) / t(1): the price of verifying n nodes in single-token decoding steps."""
        return self.t_verify(n) / self.t_verify(1)

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @property
    def t_autoregressive(self) -> float:
        """Seconds per token of plain decoding: measured, else t(1)."""
        return self.ar_token or self.t_verify(1)

    @classmethod
    def from_json(cls, data: dict) -> VerifyCosts:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"cost file version {data.get('version')}, not {FORMAT_VERSION}")
        return cls(
            key=data["key"],
            nodes=tuple(data["nodes"]),
            seconds=tuple(data["seconds"]),
            ar_token=float(data.get("ar_token", 0.0)),
            requested=tuple(data.get("requested") or data["nodes"]),
            stop_ratio=float(data.get("stop_ratio", 0.0)),
            skip_stairs=bool(data.get("skip_stairs", False)),
            stairs=tuple(tuple(pair) for pair in data.get("stairs", ())),
        )


def _layout_name(layers) -> str:
    if getattr(layers, "panels", False):
        return f"panels-{cpu_panels.source_digest()}"
    return "out_in" if getattr(layers, "out_in", False) else "in_out"


def cost_key(target, *, batch: int, context: int) -> str:
    """What a cost measurement depends on: backend, device kind, the target's weights
    (fingerprint), batch, context, dtype and the layers' weight layout (Layers.out_in, and
    Layers.panels: the CPU kernel's products cost less at a few rows; with the kernel's source
    digest, since another version of it costs differently)."""
    from specjax.train.checkpoint import target_fingerprint

    device = jax.devices()[0]
    layers = getattr(target, "layers", None)
    parts = (
        jax.default_backend(),
        getattr(device, "device_kind", "unknown"),
        target_fingerprint(target),
        f"b{batch}",
        f"s{context}",
        target.config.dtype,
        _layout_name(layers),
    )
    return "|".join(parts)


def _cache_file(key: str, folder: Path, what: str = "verify") -> Path:
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return folder / "costs" / f"{what}-{digest}.json"


def kept_record(key: str, what: str, version: int) -> tuple[Path, dict | None]:
    """(the cache file of a choice made from measurements, its record): the record is None
    unless the file holds one with this key and version (an unreadable file counts as none)."""
    path = _cache_file(key, cache_dir(), what=what)
    try:
        record = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        record = None
    if record and (record.get("version") != version or record.get("key") != key):
        record = None
    return path, record


def keep_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))


def measure_verify_costs(
    target,
    *,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    nodes: Sequence[int] = DEFAULT_NODES,
    reps: int = 5,
    with_ar: bool = True,
    stop_ratio: float = 0.0,
    skip_stairs: bool = False,
    room: int | None = None,
    stop_reference: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> VerifyCosts:
    """Time the target over blocks of N nodes (for N in `nodes`) at `context` committed
    positions, batch rows each, in a cache of context + room slots (room: default the largest N;
    a grid measured in parts passes the whole grid's, so that every count sees one cache length:
    attention on a CPU runs over the whole static cache). The block is a chain (a causal mask):
    the cost of a tree of N nodes is the same, only the mask differs. with_ar: also time plain
    decoding (ar_token; else 0, unknown). stop_ratio > 0: the grid stops after the first N with
    t(N) >= stop_ratio x t(1) (the larger counts are not measured; t_verify extrapolates past
    the last point): SpecConfig.auto() passes twice the best tau any candidate tree can reach,
    so no tree that large could beat plain decoding (at 32 rows, t(64) alone took ~17 s on a
    2-core CPU). stop_reference: the seconds the stop rule compares with (default: t of the
    first count timed; a grid continued past an earlier stop passes the t of the first count
    it timed before).

    skip_stairs: the powers of two (and the grid's first and last counts) are timed first; then
    each gap between two of them is probed at its middle count, and where the middle costs at
    least the gap's top the gap is a stair (on a CPU, t(9..15) of SmolLM2 cost more than
    t(16): NOTES.md, "Nineteenth session") and its other counts are not timed: a tree there has
    fewer nodes than one at the top and costs no less to verify, so it is never the better
    candidate. Each count is a compiled program (~3 s on a 2-core CPU). The default call no
    longer asks for it: it times the powers of two, then only the counts between them where a
    tree could be the fastest (specjax.choice.worth_timing), which subsumes the stairs.

    The grid is timed in rounds, one call of every N per round (the first round also decides
    where the grid stops), and each t(N) is the median over the rounds: a slow spell of the
    machine then lands on every N alike instead of on the few N timed while it lasted (timed
    one N after another, two idle measurements of SmolLM2's t(1) gave 31 and 55 ms, and t(4)
    came out below t(1))."""
    nodes = tuple(sorted(set(int(n) for n in nodes)))
    if not nodes or nodes[0] < 1:
        raise ValueError(f"nodes must be positive ints, got {nodes}")
    room = max(nodes[-1], room or 0)
    if context + max(room, AR_TOKENS) > target.config.max_seq_len:
        raise ValueError(
            f"context {context} + max({room} nodes, {AR_TOKENS} decoded tokens) exceeds "
            f"the model's max_seq_len {target.config.max_seq_len}: lower the context or the "
            "largest node count"
        )
    graphdef, params = nnx.split(target)
    cache = init_cache(target.config, batch, context + room)
    cache = cache.replace(lengths=jnp.full((batch,), context, jnp.int32))

    def forward(params, carry, n):
        cache, token = carry  # the next block starts with the last one's argmax: no hoisting
        model = nnx.merge(graphdef, params)
        tokens = jnp.ones((batch, n), jnp.int32).at[:, 0].set(token)
        positions = cache.lengths[:, None] + jnp.arange(n, dtype=jnp.int32)[None, :]
        out = model(tokens, positions=positions, cache=cache, tree_mask=causal_mask(batch, n))
        new_token = token_choice.argmax(out.logits[:, -1])
        return out.cache.replace(lengths=cache.lengths), new_token

    loops, samples = {}, {}  # the first round: compile, size and time each N once

    def time_first(n: int) -> float:
        if progress is not None:
            progress(f"measuring target cost: {n} node(s) ({len(loops) + 1}/{len(nodes)})")
        body = functools.partial(forward, n=n)
        init = (cache, jnp.ones((batch,), jnp.int32))
        loops[n] = sized_loop(body, params, init, VERIFY_CALL_S)
        samples[n] = [loops[n].per_iteration()]
        return samples[n][0]

    anchors = nodes
    if skip_stairs:
        anchors = [n for n in nodes if n & (n - 1) == 0 or n in (nodes[0], nodes[-1])]
    for i, n in enumerate(anchors):
        seconds = time_first(n)
        reference = stop_reference or samples[anchors[0]][0]
        if stop_ratio > 0 and (i > 0 or stop_reference) and seconds >= stop_ratio * reference:
            if progress is not None and n < nodes[-1]:
                progress(
                    f"target cost at {n} nodes is {seconds / reference:.1f}x one "
                    "node's: no larger tree can pay, the grid stops here"
                )
            break
    stairs = []
    timed_anchors = sorted(loops)
    for lo, hi in itertools.pairwise(timed_anchors):
        inner = [n for n in nodes if lo < n < hi]
        if not inner:
            continue
        middle = inner[len(inner) // 2]
        if time_first(middle) >= samples[hi][0] and len(inner) > 1:
            stairs.append((lo, hi))
            if progress is not None:
                progress(
                    f"target cost at {middle} nodes is at least {hi} nodes': a stair, "
                    f"the rest of {lo + 1}-{hi - 1} nodes is not timed"
                )
            continue
        for n in inner:
            if n != middle:
                time_first(n)
    timed_nodes = sorted(loops)
    # the other rounds; an N whose calls are long gets fewer (~3 s of its calls at most)
    wanted = {n: max(1, min(reps, int(3.0 / (t.single * t.n)))) for n, t in loops.items()}
    for r in range(1, reps):
        for n in timed_nodes:
            if r < wanted[n]:
                samples[n].append(loops[n].per_iteration())
    seconds = [float(np.median(samples[n])) for n in timed_nodes]
    key = cost_key(target, batch=batch, context=context)
    ar = 0.0
    if with_ar:
        if progress is not None:
            progress("measuring autoregressive decoding")
        ar = measure_ar_token(target, batch=batch, context=context, reps=reps)
    return VerifyCosts(key=key, nodes=tuple(timed_nodes), seconds=tuple(seconds), ar_token=ar,
                       requested=nodes, stop_ratio=float(stop_ratio), skip_stairs=skip_stairs,
                       stairs=tuple(stairs))  # fmt: skip


def plain_decoding_step(target, *, batch: int, context: int):
    """(body, params, state): one token of specjax.generate's loop (decode.decode_step: the
    target over one token per row, greedy choice, bookkeeping) as a loop body, in the state
    generate holds after prefilling `context` filler tokens in `batch` rows (stood in by zeros
    with the rows' lengths, as the speculative steps' states are: _stand_in). The body puts the
    cache lengths, step and done flags back, so every iteration decodes at the same context and
    no row finishes. Timed in a jitted loop (seconds_per_iteration), this is plain decoding's
    cost per token without its prefill, which at large batches costs more than the tokens timed
    (32 rows x 256 filler tokens)."""
    from specjax.decode import decode_step

    start, params, ids, lens = plain_decoding_start(
        target, batch=batch, context=context, max_new_tokens=AR_TOKENS
    )

    def body(params, s):
        new = decode_step(start.model(params), s, start.keys, start.never, **start.options)
        back = new.cache.replace(lengths=s.cache.lengths)
        return new.replace(step=s.step, done=s.done, cache=back)

    state = _stand_in(jax.eval_shape(start, params, ids, lens), lens)
    return body, params, state.replace(step=jnp.int32(1), rows=jnp.arange(batch, dtype=jnp.int32))


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: jax.jit caches on it
class PlainStart:
    """specjax.generate's start (prefill and first token) of filler prompts, as a function of
    (params, ids, lens) -> its decoding state; `model`, `keys`, `never` (no token is the EOS:
    rows stay live) and `options` are what decode_step needs to continue from it."""

    graphdef: object
    keys: jax.Array
    options: dict
    never: jax.Array = dataclasses.field(default_factory=lambda: jnp.int32(-1))

    def model(self, params):
        return nnx.merge(self.graphdef, params)

    def __call__(self, params, ids, lens):
        from specjax.decode import start_decoding

        model = self.model(params)
        return start_decoding(model, ids, lens, self.keys, self.never, **self.options)[0]


def plain_decoding_start(target, *, batch: int, context: int, max_new_tokens: int):
    """(start, params, ids, lens): a PlainStart of `batch` filler prompts of `context` tokens
    with room for max_new_tokens, the target's params and the padded prompts [B, T] and
    lengths [B] to call it with (what plain_decoding_step times a token after; the prefill
    itself is timed as a whole call by specjax.prefill_costs)."""
    from specjax.config import SamplingConfig
    from specjax.decode import prepare_keys, prepare_prompts

    graphdef, params = nnx.split(target)
    prompts = filler_prompts(target, batch, context)
    ids, lens = prepare_prompts(prompts, target.config, max_new_tokens)
    options = dict(max_new_tokens=max_new_tokens, sampling=SamplingConfig(), attn_impl="auto",
                   record_hidden=False)  # fmt: skip
    start = PlainStart(graphdef, prepare_keys(None, batch), options)
    return start, params, jnp.asarray(ids), jnp.asarray(lens)


def _stand_in(shapes, lens):
    """Zeros of the shapes (a pytree of ShapeDtypeStructs) with every `lengths` field at lens
    [B]: a prefill's outputs as far as costs go (they do not depend on the values, and on a
    compiled kernel they may depend on how much of the cache is filled)."""

    def one(path, leaf):
        if getattr(path[-1], "name", None) == "lengths":
            return lens.astype(leaf.dtype)
        return jnp.zeros(leaf.shape, leaf.dtype)

    return jax.tree_util.tree_map_with_path(one, shapes)


def measure_ar_token(target, *, batch, context, reps) -> float:
    """Seconds per token of specjax.generate after `context` prompt tokens (see
    plain_decoding_step)."""
    return seconds_per_iteration(
        *plain_decoding_step(target, batch=batch, context=context), reps=reps
    )


@dataclasses.dataclass
class TimedLoop:
    """A jitted fori_loop of `n` iterations of a body, and the seconds of its per-call fixed
    cost (`fixed`: dispatch, and the copy of the carried state that an input not donated needs
    for the loop's output: ~145 ms for SmolLM2's cache at 32 rows, as much as a decoded token),
    measured as a call of zero iterations and taken off every timing."""

    run: Callable
    params: object
    init: object
    n: int
    fixed: float
    single: float = 0.0  # net seconds of the one-iteration call that sized n

    def call(self, n: int) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(self.run(self.params, self.init, n))
        return time.perf_counter() - t0

    def per_iteration(self) -> float:
        """Seconds per iteration from one call of n iterations. Where the fixed cost is not
        below the call's (noise), the call's own average stands in: an upper bound, never 0."""
        seconds = self.call(self.n)
        net = seconds - self.fixed
        return (net if net > 0 else seconds) / self.n


def sized_loop(body, params, init, call_s: float) -> TimedLoop:
    """A TimedLoop of body(params, carry) -> carry: compiled with a traced trip count and run
    once, its fixed cost the median of three zero-iteration calls, n the iterations that make
    a call's net time ~call_s (from a second one-iteration call)."""

    def loop(params, init, n):
        return jax.lax.fori_loop(0, n, lambda i, c: body(params, c), init)

    timed = TimedLoop(jax.jit(loop), params, init, n=1, fixed=0.0)
    timed.call(1)  # compiles
    timed.fixed = float(np.median([timed.call(0) for _ in range(3)]))
    timed.single = max(timed.call(1) - timed.fixed, 1e-6)
    timed.n = int(min(1000, max(1, call_s / timed.single)))
    return timed


def seconds_per_iteration(body, params, init, *, reps: int = 5, call_s: float = 0.05) -> float:
    """Seconds of one body(params, carry) -> carry, timed inside a jitted fori_loop (as the
    engine runs it: no dispatch per iteration, buffers updated in place): the median over
    `reps` calls (fewer when a call is long: ~3 s at most) of a sized_loop, net of its fixed
    per-call cost."""
    timed = sized_loop(body, params, init, call_s)
    reps = max(1, min(reps, int(3.0 / timed.single)))
    return float(np.median([timed.per_iteration() for _ in range(reps)]))


def _print_progress(message: str) -> None:
    print(f"[specjax] {message}", file=sys.stderr, flush=True)


def verify_costs(
    target,
    *,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    nodes: Sequence[int] = DEFAULT_NODES,
    reps: int = 5,
    with_ar: bool = True,
    stop_ratio: float = 0.0,
    skip_stairs: bool = False,
    folder: str | Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = _print_progress,
) -> VerifyCosts:
    """t(N) for this target on this backend: read from the cache folder when measured before
    with the same key, nodes and stop rule, else measured (with a progress line) and written
    there. with_ar: the cost per token of plain decoding is wanted too (SpecConfig.auto() skips
    it when it times candidate steps, which measure plain decoding alongside); stop_ratio: see
    measure_verify_costs; skip_stairs: the interior of a stair of t(N) may be left untimed (see
    measure_verify_costs).

    A plain grid (no stop rule, no skipped stairs: what the pre-verifier's replay asks for) is
    also served by a file measured for another grid at the same key when that file timed every
    count it wants; the counts it lacks are timed alone (in the stored grid's cache length, or
    their own where larger) and added to that file, which keeps the grid it was asked for, so
    its own caller still finds it. Why: the default call's fine grid and the replay's plain one,
    at the call's context, would otherwise each time the same counts on a first call (~18 s of
    SmolLM2's on a 2-core CPU), and each would overwrite the other's file for the next process.
    For the same reason a stop rule is served by a file of the same grid that stopped later or
    reached its last count (on a 2-core CPU SmolLM2's t(64) is ~4-5x t(1), under the stop of
    either shipped drafter: the second one's first call measured the grid again), and a later
    stop continues a grid (without skipped stairs) from where it stopped."""
    folder = Path(folder) if folder is not None else cache_dir()
    key = cost_key(target, batch=batch, context=context)
    path = _cache_file(key, folder)
    wanted = tuple(sorted(set(int(n) for n in nodes)))
    plain_grid = not stop_ratio and not skip_stairs
    stored, extension = None, {}  # a file to add counts to, and how to time them
    if path.exists() and not refresh:
        try:
            costs = VerifyCosts.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            costs = None  # an unreadable file is measured again and rewritten
        if costs is not None and costs.key == key and (costs.ar_token > 0 or not with_ar):
            same_grid = (costs.requested, costs.skip_stairs) == (wanted, skip_stairs)
            # A grid that stopped later, or never (no stop rule, or its last count reached
            # under it), timed every count any stop would.
            reached_end = costs.nodes[-1] == max(costs.requested)
            as_far = costs.stop_ratio == 0 or reached_end or 0 < stop_ratio <= costs.stop_ratio
            if (same_grid and as_far) or (plain_grid and set(wanted) <= set(costs.nodes)):
                return costs
            if plain_grid:
                stored = costs
                extension = {"nodes": tuple(n for n in wanted if n not in costs.nodes)}
            elif same_grid and stop_ratio > 0 and not skip_stairs:
                # Continued from where it stopped, to the later stop: the file then serves both
                # callers (two drafters of one target stop at twice their own best tau).
                if costs.seconds[-1] >= stop_ratio * costs.seconds[0]:  # it stops there too
                    return dataclasses.replace(costs, stop_ratio=stop_ratio)
                stored = dataclasses.replace(costs, stop_ratio=stop_ratio)
                extension = {
                    "nodes": tuple(n for n in wanted if n > costs.nodes[-1]),
                    "stop_ratio": stop_ratio,
                    "stop_reference": costs.seconds[0],
                }
            elif same_grid and stop_ratio > 0:
                # Measured again, to the later of the two stops (the stairs between the counts
                # are probed in one pass over the grid).
                stop_ratio = max(stop_ratio, costs.stop_ratio)
    if stored is not None:
        # The counts the file lacks, timed alone in its grid's cache length and added to it.
        extra = measure_verify_costs(target, batch=batch, context=context, reps=reps,
                                     with_ar=False, room=max(stored.requested),
                                     progress=progress, **extension)  # fmt: skip
        costs = stored.with_points(extra)
    else:
        costs = measure_verify_costs(target, batch=batch, context=context, nodes=wanted,
                                     reps=reps, with_ar=with_ar, stop_ratio=stop_ratio,
                                     skip_stairs=skip_stairs, progress=progress)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(costs.to_json(), indent=2) + "\n")
    return costs


# -- the drafter's side --------------------------------------------------------------------------


def module_fingerprint(module) -> str:
    """A cheap fingerprint of any nnx module's parameters (shapes and sampled values) and its
    type: what cached drafter measurements are keyed by."""
    from flax import nnx

    h = hashlib.sha256(type(module).__name__.encode())
    for attr in ("self_draft_layers", "reuse", "fresh_slots"):
        h.update(f"{attr}={getattr(module, attr, None)};".encode())
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(module, nnx.Param))
    for path, x in sorted(leaves, key=lambda kv: jax.tree_util.keystr(kv[0])):
        flat = np.asarray(x).reshape(-1)
        h.update(f"{jax.tree_util.keystr(path)}{tuple(np.shape(x))};".encode())
        if flat.size:
            idx = (np.arange(64, dtype=np.int64) + 1) * 2654435761 % flat.size
            h.update(flat[idx].astype(np.float32).tobytes())
    return h.hexdigest()[:32]


def drafter_key(target, drafter, *, batch: int, context: int) -> str:
    return cost_key(target, batch=batch, context=context) + "|" + module_fingerprint(drafter)


@dataclasses.dataclass(frozen=True)
class DraftCosts:
    """A drafter's cost model (module docstring).

    kind "static": per_depth[i] seconds of one depth over a block of nodes[i] tree nodes.
    kind "dynamic": for topk[i], seconds at depth 1 (shallow[i]) and at depth `deep_depth`
    (deep[i]), linear in between. overhead: seconds of a step beyond draft + verify (None:
    not measured; SpecConfig.auto() derives it from its first timed candidate instead).
    """

    key: str
    kind: str
    nodes: tuple[int, ...] = ()
    per_depth: tuple[float, ...] = ()
    topk: tuple[int, ...] = ()
    deep_depth: int = 1
    shallow: tuple[float, ...] = ()
    deep: tuple[float, ...] = ()
    overhead: float | None = None

    def t_draft(self, tree) -> float:
        """Seconds to draft `tree` (a TreeConfig)."""
        if self.kind == "static":
            f = float(np.interp(tree.num_nodes, self.nodes, self.per_depth))
            return tree.drafter_depth * f
        if tree.topk not in self.topk:
            raise ValueError(f"no draft cost measured for top-{tree.topk} (have {self.topk})")
        i = self.topk.index(tree.topk)
        if self.deep_depth == 1:
            return self.shallow[i]
        per = (self.deep[i] - self.shallow[i]) / (self.deep_depth - 1)
        return self.shallow[i] + per * (tree.drafter_depth - 1)

    def with_points(self, other: DraftCosts) -> DraftCosts:
        """These costs with other's shapes added (other's seconds where both timed one); the
        overhead stays these costs'."""
        if (other.kind, other.deep_depth) != (self.kind, self.deep_depth):
            raise ValueError(
                f"cannot merge {other.kind} draft costs at depth {other.deep_depth} into "
                f"{self.kind} ones at depth {self.deep_depth}"
            )
        if self.kind == "static":
            merged = dict(zip(self.nodes, self.per_depth, strict=True))
            merged.update(zip(other.nodes, other.per_depth, strict=True))
            nodes = tuple(sorted(merged))
            return dataclasses.replace(self, nodes=nodes, per_depth=tuple(merged[n] for n in nodes))
        merged = dict(zip(self.topk, zip(self.shallow, self.deep, strict=True), strict=True))
        merged.update(zip(other.topk, zip(other.shallow, other.deep, strict=True), strict=True))
        topk = tuple(sorted(merged))
        return dataclasses.replace(
            self,
            topk=topk,
            shallow=tuple(merged[k][0] for k in topk),
            deep=tuple(merged[k][1] for k in topk),
        )

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> DraftCosts:
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"cost file version {data.get('version')}, not {FORMAT_VERSION}")
        kw = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        for name in ("nodes", "per_depth", "topk", "shallow", "deep"):
            kw[name] = tuple(kw[name])
        return cls(**kw)


def filler_prompts(target, batch: int, context: int) -> np.ndarray:
    """Deterministic filler prompts of `context` tokens, the same in every row (costs do not
    depend on the ids)."""
    vocab = target.config.vocab_size
    row = (np.arange(context, dtype=np.int64) * 7919 + 11) % vocab
    return np.broadcast_to(row, (batch, context)).astype(np.int32)


def _prefill_stand_in(target, drafter, tree, config, *, batch, context):
    """(ids, lens, loop, logits, verifier state, hidden): what the verifier's prefill of
    `context` filler tokens returns, as zeros of its shapes, with every `lengths` field of the
    verifier state at the prompt lengths, as a prefill leaves them. Costs do not depend on the
    values, so states to time steps in need no target prefill (compiled and run once per
    candidate tree and batch: tens of seconds at 32 rows)."""
    from specjax.config import SamplingConfig
    from specjax.decode import prepare_prompts
    from specjax.speculative import SpeculativeLoop
    from specjax.verifiers import FullVerifier

    ids, lens = prepare_prompts(
        filler_prompts(target, batch, context), target.config, COST_NEW_TOKENS,
        extra_slots=tree_reserve(tree.num_nodes, tree.max_depth),
    )  # fmt: skip
    ids, lens = jnp.asarray(ids), jnp.asarray(lens)
    loop = SpeculativeLoop(
        target, drafter, FullVerifier(), config, SamplingConfig(), COST_NEW_TOKENS
    )  # fmt: skip
    shapes = jax.eval_shape(
        lambda: loop.verifier.prefill(
            target, ids, lens, loop.cache_len(ids.shape[1]),
            feature_layers=drafter.feature_layers, attn_impl=config.attn_impl,
        )
    )  # fmt: skip
    logits, vstate, hidden = _stand_in(shapes, lens)
    return ids, lens, loop, logits, vstate, hidden


def _drafter_state_at(target, drafter, tree, config, *, batch, context):
    """(drafter state, RootContext, keys) as a speculative state holds them after prefilling
    `context` filler tokens, for a step drafting `tree` (see _prefill_stand_in: only the
    drafter's own prefill is compiled)."""
    from specjax.decode import prepare_keys
    from specjax.drafters.base import RootContext

    ids, lens, loop, _, _, hidden = _prefill_stand_in(
        target, drafter, tree, config, batch=batch, context=context
    )
    init = nnx.jit(
        lambda d, t, ids, lens, hidden: d.init_state(
            t, ids, lens, loop.cache_len(ids.shape[1]), config=config, target_hidden=hidden
        )
    )
    state = init(drafter, target, ids, lens, hidden)
    last = jnp.take_along_axis(ids, (lens - 1)[:, None], axis=1)[:, 0]
    ctx = RootContext(root=last, prev=last, lengths=lens)
    return state, ctx, prepare_keys(None, batch)


def _time_propose(target, drafter, tree, *, batch, context, reps, with_step=False):
    """(seconds of drafter.propose, seconds of one whole step or None) for `tree` (drafted and
    verified whole: no pre-verifier), at `context` committed tokens, each timed in a loop of
    its own. Neither compiles a target prefill: the verifier's prefill is stood in by zeros
    (_prefill_stand_in)."""
    from specjax.config import SamplingConfig, SpecConfig
    from specjax.drafters.base import RootContext

    sampling = SamplingConfig()
    config = SpecConfig(tree=tree, pre_verify=False)
    drafter_state, ctx, keys = _drafter_state_at(
        target, drafter, tree, config, batch=batch, context=context
    )
    target_def, target_params = nnx.split(target)
    drafter_def, drafter_params = nnx.split(drafter)

    def propose(params, carry):
        drafter_state, root = carry  # the next root is a drafted token: no hoisting
        t = nnx.merge(target_def, params[0])
        d = nnx.merge(drafter_def, params[1])
        now = RootContext(root=root, prev=ctx.prev, lengths=ctx.lengths)
        tree, drafter_state = d.propose(
            drafter_state, t, now, keys, config=config, sampling=sampling
        )
        return drafter_state, tree.tokens[:, -1]

    t_propose = seconds_per_iteration(
        propose, (target_params, drafter_params), (drafter_state, ctx.root), reps=reps
    )
    if not with_step:
        return t_propose, None
    body = _step_body(target, drafter, config, batch=batch, context=context)
    return t_propose, seconds_per_iteration(*body, reps=reps)


def _step_body(target, drafter, config, *, batch, context):
    """(body, params, state): one whole speculative step drafting config.tree (no
    pre-verifier) as a loop body, in a state after `context` filler tokens (the verifier's
    prefill stood in by zeros: _prefill_stand_in). A step keeps computing for rows that
    finished, so its cost stays that of a live step."""
    from specjax.config import SamplingConfig
    from specjax.decode import prepare_keys
    from specjax.speculative import SpeculativeLoop

    ids, lens, loop, logits, vstate, hidden = _prefill_stand_in(
        target, drafter, config.tree, config, batch=batch, context=context
    )
    target_def, target_params = nnx.split(target)
    drafter_def, drafter_params = nnx.split(drafter)
    verifier_def, verifier_params = nnx.split(loop.verifier)
    params = (target_params, drafter_params, verifier_params)

    def merged(params):
        return SpeculativeLoop(
            target=nnx.merge(target_def, params[0]),
            drafter=nnx.merge(drafter_def, params[1]),
            verifier=nnx.merge(verifier_def, params[2]),
            config=config,
            sampling=SamplingConfig(),
            max_new_tokens=COST_NEW_TOKENS,
        )

    def step(params, state):
        return merged(params).step(state)

    keys, no_eos = prepare_keys(None, batch), jnp.int32(-1)
    state = jax.jit(lambda params, *args: merged(params).start(ids, lens, keys, no_eos, *args))(
        params, logits, vstate, hidden
    )
    return step, params, state


class CandidateSteps:
    """Whole speculative steps of candidate trees, compiled one at a time (`add`, which also
    returns a first estimate) and then timed together (`measure`) in interleaved rounds with
    plain decoding: a CPU's speed drifts by tens of percent within minutes, so the ratios that
    decide the choice are taken under the same conditions. Each tree's step runs in a jitted
    loop sized to ~call_s, and so is plain decoding (plain_decoding_step).

    readings: {tree: [step / plain-token ratio, ...]} timed before at this drafter, batch and
    context (timed_steps' ledger). A tree there is not compiled or timed again unless asked
    for `again` (a confirmation), and its ratio is the median of its readings
    (settled_ratio), reported at this measurement's plain-token seconds."""

    def __init__(self, target, drafter, *, batch: int = 1, context: int = DEFAULT_CONTEXT,
                 call_s: float = 0.2, progress: Callable[[str], None] | None = None,
                 readings: dict | None = None, known_ar: float = 0.0):  # fmt: skip
        self.target, self.drafter = target, drafter
        self.batch, self.context, self.call_s = batch, context, call_s
        self.say = progress or (lambda message: None)
        self.readings = {tree: list(r) for tree, r in (readings or {}).items()}
        self.known_ar = known_ar
        self.trees: list = []  # every tree asked for, in order
        self.loops: dict = {}  # tree -> TimedLoop of its whole step (compiled in this process)
        self.pending: list = []  # trees to time at the next measure
        self.timed_any = False

    def add(self, tree, again: bool = False) -> float:
        """Ask for `tree`'s step: its seconds per step, from the ledger when known, else from
        one sized call of its newly compiled step. again: time it at the next measure even if
        the ledger knows it (its new reading joins the others)."""
        from specjax.config import SpecConfig

        if tree not in self.trees:
            self.trees.append(tree)
        if (again or tree not in self.readings) and tree not in self.pending:
            self.pending.append(tree)
        # Known, and either not to be timed again or already compiled in this process.
        if tree in self.readings and (not again or tree in self.loops):
            return settled_ratio(self.readings[tree]) * self.known_ar
        if tree not in self.loops:
            self.say(f"timing candidate steps: {len(self.loops) + 1}")
            body, params, state = _step_body(
                self.target, self.drafter, SpecConfig(tree=tree, pre_verify=False),
                batch=self.batch, context=self.context,
            )  # fmt: skip
            self.loops[tree] = sized_loop(body, params, state, self.call_s)
        return self.loops[tree].per_iteration()

    def measure(self, rounds: int = CANDIDATE_ROUNDS) -> tuple[float, dict]:
        """(seconds per autoregressive token, {tree: step / plain-token ratio}) for every tree
        asked for: the pending ones timed in `rounds` interleaved rounds (see paired_medians),
        each new reading added to the tree's readings, and every ratio the median of its
        readings. Nothing pending: the last plain-token seconds, nothing timed."""
        if self.pending:
            ar, seconds = self._time_pending(rounds)
            for tree, s in seconds.items():
                self.readings.setdefault(tree, []).append(s / ar)
            self.known_ar, self.pending, self.timed_any = ar, [], True
        return self.known_ar, {tree: settled_ratio(self.readings[tree]) for tree in self.trees}

    def _time_pending(self, rounds: int) -> tuple[float, dict]:
        """paired_medians of plain decoding and the pending trees, in `rounds` rounds."""
        body, params, state = plain_decoding_step(
            self.target, batch=self.batch, context=self.context
        )
        plain = sized_loop(body, params, state, self.call_s)
        ar_times, step_times = [], {tree: [] for tree in self.pending}
        for r in range(rounds):
            self.say(f"timing candidate steps against plain decoding: round {r + 1}/{rounds}")
            ar_times.append(plain.per_iteration())
            for tree, times in step_times.items():
                times.append(self.loops[tree].per_iteration())
        return paired_medians(ar_times, step_times)


def settled_ratio(readings: Sequence[float]) -> float:
    """A tree's step / plain-token ratio from its readings (each the median of one
    measurement's paired rounds): their median, the mean of two."""
    return float(np.median(readings))


def unsettled(readings: Sequence[float]) -> bool:
    """Whether a tree's readings call for another: a single one, or two that disagree by more
    than CONFIRM_SPREAD (a third then decides through the median)."""
    if len(readings) == 1:
        return True
    return len(readings) == 2 and max(readings) > (1.0 + CONFIRM_SPREAD) * min(readings)


def paired_medians(ar_times: Sequence[float], step_times: dict) -> tuple[float, dict]:
    """(median seconds per autoregressive token, {tree: seconds per step}) from rounds in which
    plain decoding and every step were timed one after another. A step's seconds are its median
    ratio to plain decoding within a round, times plain decoding's median: what decides the
    choice is that ratio, and a round slowed by another process (or a CPU's clock) slows both
    sides of it, where medians taken apart can pair a slow round of one with a fast one of the
    other."""
    ar = float(np.median(ar_times))
    ratios = {
        tree: float(np.median([s / a for s, a in zip(times, ar_times, strict=True)]))
        for tree, times in step_times.items()
    }
    return ar, {tree: ratio * ar for tree, ratio in ratios.items()}


def measure_draft_costs(
    target,
    drafter,
    verify: VerifyCosts,
    *,
    topks: Sequence[int] = (4, 8),
    nodes: Sequence[int] = STATIC_DRAFT_NODES,
    deep_depth: int = 8,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    reps: int = 5,
    with_overhead: bool = True,
    progress: Callable[[str], None] | None = None,
) -> DraftCosts:
    """Time the drafter's propose at the shapes of the module docstring, and (with_overhead)
    one whole step for the overhead."""
    from specjax.config import TreeConfig

    key = drafter_key(target, drafter, batch=batch, context=context)
    say = progress or (lambda message: None)
    if drafter.dynamic_trees:
        shallow, deep = [], []
        for i, k in enumerate(topks):
            say(f"measuring drafter cost: top-{k} ({i + 1}/{len(topks)})")
            shallow.append(_time_propose(
                target, drafter, TreeConfig.dynamic(k, 1, k),
                batch=batch, context=context, reps=reps,
            )[0])  # fmt: skip
            deep.append(_time_propose(
                target, drafter, TreeConfig.dynamic(k, deep_depth, k),
                batch=batch, context=context, reps=reps,
            )[0])  # fmt: skip
        base = TreeConfig.dynamic(topks[0], 1, topks[0])
        costs = DraftCosts(key=key, kind="dynamic", topk=tuple(topks), deep_depth=deep_depth,
                           shallow=tuple(shallow), deep=tuple(deep))  # fmt: skip
    else:
        per_depth = []
        for i, n in enumerate(nodes):
            say(f"measuring drafter cost: {n} node(s) ({i + 1}/{len(nodes)})")
            tree = TreeConfig(branching=(n - 1,))  # one depth over a block of n nodes
            per_depth.append(_time_propose(
                target, drafter, tree, batch=batch, context=context, reps=reps,
            )[0])  # fmt: skip
        base = TreeConfig(branching=(1,))
        costs = DraftCosts(key=key, kind="static", nodes=tuple(nodes),
                           per_depth=tuple(per_depth))  # fmt: skip
    if not with_overhead:
        return costs
    say("measuring one whole step")
    t_propose, t_step = _time_propose(
        target, drafter, base, batch=batch, context=context, reps=reps,
        with_step=True,
    )  # fmt: skip
    overhead = max(t_step - t_propose - verify.t_verify(base.num_nodes), 0.0)
    return dataclasses.replace(costs, overhead=overhead)


def draft_costs(
    target,
    drafter,
    verify: VerifyCosts,
    *,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    folder: str | Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = _print_progress,
    with_overhead: bool = True,
    **kwargs,
) -> DraftCosts:
    """The drafter's cost model on this backend: from the cache folder when measured before,
    else measured (progress lines) and written there. with_overhead=False: a model without the
    step overhead will do (one whole step less to compile)."""
    folder = Path(folder) if folder is not None else cache_dir()
    key = drafter_key(target, drafter, batch=batch, context=context)
    path = _cache_file(key, folder, "draft")
    shape_arg = "topks" if drafter.dynamic_trees else "nodes"
    wanted = kwargs.get(shape_arg)
    stored, missing = None, ()
    if path.exists() and not refresh:
        try:
            costs = DraftCosts.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            costs = None
        if (
            costs is not None
            and costs.key == key
            and (costs.overhead is not None or not with_overhead)
            and kwargs.get("deep_depth", costs.deep_depth) == costs.deep_depth
        ):
            have = costs.topk if drafter.dynamic_trees else costs.nodes
            if wanted is None or set(wanted) <= set(have):
                return costs
            stored, missing = costs, tuple(x for x in wanted if x not in have)
    if stored is not None:
        # Only the shapes the file lacks are timed (each is a compiled program), then kept
        # beside the others: the default call and the pre-verifier's replay ask for different
        # top-k sets of one drafter.
        extra = measure_draft_costs(
            target, drafter, verify, batch=batch, context=context, progress=progress,
            with_overhead=False, **{**kwargs, shape_arg: missing},
        )  # fmt: skip
        costs = stored.with_points(extra)
    else:
        costs = measure_draft_costs(
            target, drafter, verify, batch=batch, context=context, progress=progress,
            with_overhead=with_overhead, **kwargs,
        )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(costs.to_json(), indent=2) + "\n")
    return costs


def timed_steps(
    target,
    drafter,
    select: Callable[[CandidateSteps], None],
    *,
    confirm: Callable[[float, dict], Sequence] | None = None,
    batch: int = 1,
    context: int = DEFAULT_CONTEXT,
    folder: str | Path | None = None,
    refresh: bool = False,
    progress: Callable[[str], None] | None = _print_progress,
) -> tuple[float, dict]:
    """(seconds per autoregressive token, {tree: seconds per step}) for the trees `select`
    asks a CandidateSteps for. Every tree's readings of its step / plain-token ratio are kept
    in one ledger on disk per drafter, batch and context, and a tree in it is not timed again:
    calls whose acceptance shift or cache length differ then weigh the same trees at the same
    ratios. Why: within one process, cost sets timed minutes apart put plain decoding at 50-83
    ms and the same trees' ratios 15% apart, so neighbouring calls chose from timings that
    disagreed (NOTES.md, "Eighteenth session").

    confirm(seconds per autoregressive token, {tree: seconds per step}) names the trees the
    choice hinges on (the best predicted few); those whose readings are unsettled (one reading,
    or two far apart) are timed again, up to CONFIRM_PASSES times. Why: the choice takes the
    best of many noisy readings, so a tree read low by a slow spell of plain decoding wins and
    over-promises (SmolLM2's mdc: one reading of 0.83 plain tokens a step, ~1.0 in every
    other, made a tree predicted at 1.88x that measured 1.41x; NOTES.md, "Forty-sixth
    session"). The seconds returned are the ratios at the plain-token seconds of the ledger's
    latest timing."""
    from specjax.config import TreeConfig

    folder = Path(folder) if folder is not None else cache_dir()
    key = drafter_key(target, drafter, batch=batch, context=context)
    path = _cache_file(key, folder, "steps")
    readings, known_ar = {}, 0.0
    if path.exists() and not refresh:
        try:
            data = json.loads(path.read_text())
            if data["key"] == key and data["version"] == FORMAT_VERSION:
                # Every field written (asdict), the chain's minimum match included: a tree
                # read back without it would merge its readings with its twin's.
                trees = [TreeConfig(**{**t, "branching": tuple(t["branching"])})
                         for t in data["trees"]]  # fmt: skip
                # Ledgers written before readings were kept hold one ratio a tree.
                kept = data.get("readings") or [[r] for r in data["ratios"]]
                readings = {t: [float(x) for x in r] for t, r in zip(trees, kept, strict=True)}
                known_ar = float(data["ar_token"])
        except (ValueError, KeyError, TypeError):
            readings, known_ar = {}, 0.0
    steps = CandidateSteps(target, drafter, batch=batch, context=context, progress=progress,
                           readings=readings, known_ar=known_ar)  # fmt: skip
    select(steps)
    ar, ratios = steps.measure()
    for _ in range(CONFIRM_PASSES if confirm is not None else 0):
        seconds = {tree: ratio * ar for tree, ratio in ratios.items()}
        again = [t for t in confirm(ar, seconds) if t in ratios and unsettled(steps.readings[t])]
        if not again:
            break
        if progress is not None:
            progress(f"confirming {len(again)} candidate step(s)")
        for tree in again:
            steps.add(tree, again=True)
        ar, ratios = steps.measure()
    if steps.timed_any:  # something was timed: the ledger grows
        ledger = steps.readings
        data = {
            "version": FORMAT_VERSION,
            "key": key,
            "ar_token": ar,
            "trees": [dataclasses.asdict(t) for t in ledger],
            "ratios": [settled_ratio(r) for r in ledger.values()],
            "readings": list(ledger.values()),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
    return ar, {tree: ratio * ar for tree, ratio in ratios.items()}
