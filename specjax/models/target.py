"""Llama-family target model (Llama, Mistral, Qwen2 without sliding window) in Flax NNX.

Axis letters: B batch, T query tokens in this call, S cache length, H query heads, K kv heads,
D head dim, M model dim, F ffn dim, V vocab, L layers.

Weights are stacked over layers so one `lax.scan` runs any layer range [start, end). Hidden-state
index convention: hidden[i] is the residual stream entering layer i (hidden[0] = embeddings,
hidden[L] = output of the last layer, before the final norm).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specjax.attention import (
    AttentionImpl,
    attend_cache,
    block_visibility,
    cpu_kernel_ok,
    resolve_impl,
)
from specjax.cache import KVCache
from specjax.config import ModelConfig
from specjax.kernels import cpu_panels
from specjax.models.layers import (
    PerLayer,
    finish_layer,
    project_qkv,
    rms_norm,
    rope_angles,
    weight_leading_product,
)
from specjax.sharding import LOGICAL_AXES, place_weight


# Canonical weight names and their shapes (the contract every checkpoint reader fills).
def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    L, M, F, V = cfg.n_layers, cfg.d_model, cfg.ffn_dim, cfg.vocab_size
    hd, kd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "embed": (V, M),
        "attn_norm": (L, M),
        "wq": (L, M, hd),
        "wk": (L, M, kd),
        "wv": (L, M, kd),
        "wo": (L, hd, M),
        "mlp_norm": (L, M),
        "w_gate": (L, M, F),
        "w_up": (L, M, F),
        "w_down": (L, F, M),
        "final_norm": (M,),
    }
    if cfg.qkv_bias:
        shapes.update(bq=(L, hd), bk=(L, kd), bv=(L, kd))
    if not cfg.tie_embeddings:
        shapes["lm_head"] = (M, V)
    return shapes


LAYER_WEIGHTS = (
    "attn_norm",
    "wq",
    "wk",
    "wv",
    "wo",
    "bq",
    "bk",
    "bv",
    "mlp_norm",
    "w_gate",
    "w_up",
    "w_down",
)
MATRICES = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")  # swapped in the out_in layout


def default_panels() -> bool:
    """Whether the target packs its out_in matrices in panels for the CPU kernel
    (specjax.kernels.cpu_panels): on the CPU backend where the kernel builds."""
    return jax.default_backend() == "cpu" and cpu_panels.available()


def default_out_in() -> bool:
    """The target's weight layout for this backend (specjax.models.layers.dense): out_in on the
    CPU, where it makes verifying a block of nodes cheaper; canonical elsewhere (not measured
    there, and the sharding rules name the canonical axes)."""
    return jax.default_backend() == "cpu"


def _traced(w) -> bool:
    return isinstance(w, jax.core.Tracer) or not isinstance(w, (jax.Array, np.ndarray))


def _canonical(w):
    """A matrix stored [L, out, in] as [L, in, out]: a host view without a copy where the array
    lives on the CPU, a transpose inside traced code (e.g. under nnx.eval_shape)."""
    if _traced(w):
        return jnp.swapaxes(w, -1, -2)
    return np.swapaxes(np.asarray(w), -1, -2)


def _stacked(per_layer: tuple):
    """L arrays as one [L, ...] array (on the host where they are concrete)."""
    if any(_traced(w) for w in per_layer):
        return jnp.stack(per_layer)
    return np.stack([np.asarray(w) for w in per_layer])


def _transposed(w):
    """One [in, out] matrix as [out, in] (or back), a buffer of its own."""
    if _traced(w):
        return jnp.swapaxes(w, 0, 1)
    return jnp.asarray(np.ascontiguousarray(np.swapaxes(np.asarray(w), 0, 1)))


def _as_array(w):
    """A host matrix as a JAX array (traced values pass through)."""
    return w if _traced(w) else jnp.asarray(w)


class PackedHead(nnx.Variable):
    """The LM head packed in panels for the CPU kernel: derived from the embedding (or lm_head),
    not a parameter of its own (checkpoints, exports and fingerprints never read it)."""


@flax.struct.dataclass
class ForwardOutput:
    logits: jax.Array | None  # [B, T, V] (or [B, R, V] with logits_index), None if not computed
    hidden: dict  # {layer index: [B, T, M]} for the requested indices
    cache: KVCache


class Layers(nnx.Module):
    """The decoder stack: every weight has a leading L axis. out_in: the matrices are stored
    [out, in] (specjax.models.layers.dense), one buffer per layer (an nnx.List of L Params, read
    through specjax.models.layers.PerLayer); panels (with out_in): each of those buffers holds
    the matrix packed for the CPU kernel, [P, in, 32] (specjax.kernels.cpu_panels). `arrays()`
    still gives the canonical layout."""

    def __init__(
        self, cfg: ModelConfig, *, rngs: nnx.Rngs, out_in: bool = False, panels: bool = False
    ):
        self.out_in = False
        self.panels = False
        # Each matrix's output size (a packed matrix's panels round it up to a multiple of 32).
        self.matrix_out = tuple(
            (n, shape[-1]) for n, shape in weight_shapes(cfg).items() if n in MATRICES
        )
        dtype = jnp.dtype(cfg.dtype)
        for name, shape in weight_shapes(cfg).items():
            if name not in LAYER_WEIGHTS:
                continue
            if name.endswith("norm"):
                value = jnp.ones(shape, dtype)
            elif name.startswith("b"):
                value = 0.02 * jax.random.normal(rngs.params(), shape, dtype)
            else:
                fan_in = shape[1]
                value = jax.random.normal(rngs.params(), shape, dtype) / jnp.sqrt(fan_in)
            setattr(self, name, nnx.Param(value))
        self.set_layout(out_in, panels)

    def compute_arrays(self) -> dict:
        """The weights as stored (what the forward pass reads): [L, ...] arrays, except that in
        the out_in layout each matrix is a tuple of L [out, in] arrays."""
        out = {}
        for name in LAYER_WEIGHTS:
            if hasattr(self, name):
                stored = getattr(self, name)
                per_layer = isinstance(stored, nnx.List)
                out[name] = tuple(p[...] for p in stored) if per_layer else stored[...]
        return out

    def arrays(self) -> dict:
        """The weights in the canonical layout (weight_shapes): what checkpoints, exports and
        fingerprints read, whatever the storage layout."""
        stored = self.compute_arrays()
        if not self.out_in:
            return stored
        return {
            n: _canonical(_stacked(tuple(self._out_in_matrices(n)))) if n in MATRICES else w
            for n, w in stored.items()
        }

    def panel_out(self, name: str) -> int | None:
        """Matrix `name`'s output size where it is packed in panels, else None."""
        return dict(self.matrix_out)[name] if self.panels and name in MATRICES else None

    def _out_in_matrices(self, name: str) -> list:
        """Matrix `name` as L [out, in] arrays, whatever the storage layout."""
        stored = getattr(self, name)
        if not self.out_in:
            stack = stored[...]
            return [_transposed(stack[i]) for i in range(stack.shape[0])]
        if self.panels:
            return [cpu_panels.unpack(p[...], dict(self.matrix_out)[name]) for p in stored]
        return [p[...] for p in stored]

    def set_layout(
        self, out_in: bool, panels: bool = False, bf16_where_exact: bool = False
    ) -> None:
        """Store the matrices in the given layout (in place); panels needs out_in.
        bf16_where_exact: panels of matrices whose values are all bfloat16 are packed in
        bfloat16 (cpu_panels.pack_exact: the same products; a drafter's stored weights)."""
        if panels and not out_in:
            raise ValueError("the panel layout packs [out, in] matrices: it needs out_in=True")
        if (out_in, panels) == (self.out_in, self.panels):
            return
        pack = cpu_panels.pack_exact if bf16_where_exact else cpu_panels.pack
        for name in MATRICES:
            if not hasattr(self, name):
                continue
            matrices = self._out_in_matrices(name)
            if out_in:
                convert = pack if panels else _as_array
                setattr(self, name, nnx.List([nnx.Param(convert(w)) for w in matrices]))
            else:
                setattr(self, name, nnx.Param(_stacked(tuple(_transposed(w) for w in matrices))))
        self.out_in, self.panels = out_in, panels


class Llama(nnx.Module):
    """A Llama-family decoder. Call it on a block of tokens written at each row's cache length."""

    def __init__(
        self,
        cfg: ModelConfig,
        *,
        rngs: nnx.Rngs,
        out_in: bool | None = None,
        panels: bool | None = None,
    ):
        """out_in, panels: the decoder stack's weight layout (Layers); None: default_out_in(),
        and panels where out_in and default_panels()."""
        self.config = cfg
        dtype = jnp.dtype(cfg.dtype)
        self.embed = nnx.Param(
            0.5 * jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.d_model), dtype)
        )
        out_in = default_out_in() if out_in is None else out_in
        if panels is None:  # the kernel is float32
            panels = out_in and dtype == jnp.float32 and default_panels()
        self.layers = Layers(cfg, rngs=rngs, out_in=out_in, panels=panels)
        self.final_norm = nnx.Param(jnp.ones((cfg.d_model,), dtype))
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Param(
                jax.random.normal(rngs.params(), (cfg.d_model, cfg.vocab_size), dtype)
                / jnp.sqrt(cfg.d_model)
            )
        # The LM head packed for the CPU kernel (a PackedHead), set by pack_head: loading
        # (model_from_weights) packs it; a model built here keeps XLA's head product.
        self.head_panels = nnx.data(None)

    def pack_head(self) -> None:
        """With panel layers, keep the LM head [V, M] packed for the CPU kernel too: a copy
        beside the embedding (which token lookups read), derived from it. model_from_weights
        calls it once the weights are in; whoever changes embed or lm_head afterwards calls it
        again (or the logits would still read the old head)."""
        if not self.layers.panels:
            self.head_panels = None
            return
        w = self.embed[...] if self.config.tie_embeddings else self.lm_head[...].T
        self.head_panels = PackedHead(cpu_panels.pack(w))

    def embed_tokens(self, tokens: jax.Array) -> jax.Array:
        """tokens [B, T] -> [B, T, M]."""
        return jnp.take(self.embed[...], tokens, axis=0)

    def head(self, hidden: jax.Array) -> jax.Array:
        """Final norm + LM head: [..., M] residual stream -> [..., V] float32 logits (accumulated
        in float32 whatever the weights' dtype, so bfloat16 models do not round the logits)."""
        x = rms_norm(hidden, self.final_norm[...], self.config.norm_eps)
        if self.layers.panels and self.head_panels is not None:
            panels = self.head_panels[...]
            return cpu_panels.panel_product(x, 0, (panels,), self.config.vocab_size)
        if self.config.tie_embeddings and self.layers.out_in:
            # The embedding [V, M] leads the product, as the out_in layers' weights do.
            embed = self.embed[...]
            if embed.dtype == jnp.float32:
                return jnp.moveaxis(weight_leading_product(embed, x), 0, -1)
            out = jnp.einsum("vm,...m->v...", embed, x, preferred_element_type=jnp.float32)
            return jnp.moveaxis(out, 0, -1)
        w = self.embed[...].T if self.config.tie_embeddings else self.lm_head[...]
        return jnp.matmul(x, w, preferred_element_type=jnp.float32)

    def __call__(
        self,
        tokens: jax.Array | None,
        *,
        positions: jax.Array,
        cache: KVCache,
        tree_mask: jax.Array,
        hidden: jax.Array | None = None,
        layer_range: tuple[int, int] | None = None,
        return_hidden: tuple[int, ...] = (),
        logits_index: jax.Array | None = None,
        compute_logits: bool = True,
        attn_impl: AttentionImpl = "auto",
    ) -> ForwardOutput:
        """Run layers [start, end) on a block written at cache.lengths.

        tokens [B, T] (needed when start == 0) or hidden [B, T, M] (the stream entering `start`);
        positions [B, T] RoPE positions; tree_mask [B, T, T] which block tokens each token sees
        (causal for prefill, ancestors for a tree, [[True]] for decode); return_hidden: indices in
        [start, end] of hidden states to return; logits_index [B, R] selects block rows before the
        LM head (saves the [B, T, V] product when only a few rows are needed). Logits are computed
        only when end == L and compute_logits.
        """
        cfg = self.config
        start, end = layer_range or (0, cfg.n_layers)
        x = self.embed_tokens(tokens) if start == 0 and hidden is None else hidden
        cos, sin = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        weights = self.layers.compute_arrays()
        out_in = self.layers.out_in
        # Which cache positions each block token sees: built once per call, not once per layer.
        visible = None
        impl = resolve_impl(attn_impl, cfg.head_dim)
        if impl in ("reference", "cpu") and not cpu_kernel_ok(impl, x.shape[1], cache.k.dtype):
            visible = block_visibility(cache.lengths, tree_mask, cache.max_len)

        def body(carry, layer):
            # The whole cache rides in the carry; only the block's K/V are written into it (in
            # place, row by row), and attention reads the layer's slice. Scanning over cache
            # slices as xs/ys instead copied the whole cache several times per call, which
            # dominated batched decoding on CPU.
            x, k_all, v_all = carry
            # Each layer's weights are read from the whole stack by index (as scanning the
            # stack as xs does). A layer range scanned over a static slice of the stack
            # (w[lo:hi]) copied the slice on every call: layers [8, 30) of SmolLM2 cost 3-3.6x
            # the whole forward (experiments/results/layer_range_before.md).
            # In the out_in layout the matrices are one buffer per layer (PerLayer), which
            # `dense` picks by lax.switch: indexing a stack made XLA:CPU copy every layer's
            # weights on every forward.
            p = {n: PerLayer(w, layer, self.layers.panel_out(n)) if isinstance(w, tuple)
                 else jax.lax.dynamic_index_in_dim(w, layer, 0, keepdims=False)
                 for n, w in weights.items()}  # fmt: skip
            q, k, v = project_qkv(
                p, rms_norm(x, p["attn_norm"], cfg.norm_eps), cos, sin, cfg, out_in
            )
            k_all = write_layer_block(k_all, layer, k, cache.lengths)
            v_all = write_layer_block(v_all, layer, v, cache.lengths)
            attn = attend_cache(
                q, k_all, v_all, layer, cache.lengths, tree_mask, impl, visible=visible
            )
            return (finish_layer(p, x, attn, cfg, out_in), k_all, v_all), None

        # Scan segment by segment so the requested hidden states fall on segment boundaries.
        bounds = sorted({start, end, *[i for i in return_hidden if start <= i <= end]})
        hidden_out = {}
        k_all, v_all = cache.k, cache.v
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=False):
            if lo in return_hidden:
                hidden_out[lo] = x
            (x, k_all, v_all), _ = jax.lax.scan(
                body, (x, k_all, v_all), jnp.arange(lo, hi, dtype=jnp.int32)
            )
        if end in return_hidden:
            hidden_out[end] = x
        missing = [i for i in return_hidden if not start <= i <= end]
        if missing:
            raise ValueError(f"hidden states {missing} are outside the layer range {start, end}")

        logits = None
        if end == cfg.n_layers and compute_logits:
            sel = (
                x
                if logits_index is None
                else jnp.take_along_axis(x, logits_index[:, :, None], axis=1)
            )
            logits = self.head(sel)
        return ForwardOutput(
            logits=logits, hidden=hidden_out, cache=KVCache(k=k_all, v=v_all, lengths=cache.lengths)
        )


def write_layer_block(
    cache: jax.Array, layer: jax.Array, block: jax.Array, lengths: jax.Array
) -> jax.Array:
    """Write block [B, T, K, D] into cache [L, B, S, K, D] at layer `layer`, row b at positions
    [lengths[b], lengths[b] + T). One in-place update per row (a loop, not a vmap: a batched
    update becomes a scatter that XLA:CPU runs over the whole cache)."""

    def write_row(b, c):
        row = jax.lax.dynamic_index_in_dim(block, b, 0, keepdims=True)[None]  # [1, 1, T, K, D]
        return jax.lax.dynamic_update_slice(
            c, row.astype(c.dtype), (layer, b, lengths[b], jnp.int32(0), jnp.int32(0))
        )

    return jax.lax.fori_loop(0, block.shape[0], write_row, cache)


def model_from_weights(
    cfg: ModelConfig, weights: dict, *, source: str = "checkpoint", mesh=None, rules=None
) -> Llama:
    """Build a Llama from canonical arrays (see weight_shapes), validating names and shapes.

    mesh: place each weight sharded on this ('data', 'model') mesh as it is converted
    (specjax.sharding.place_weight; weights may be lazy tensors read slice by slice)."""
    expected = weight_shapes(cfg)
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ValueError(f"{source}: missing tensors {missing}")
    for name, shape in expected.items():
        got = tuple(weights[name].shape)
        if got != shape:
            raise ValueError(
                f"{source}: tensor {name!r} has shape {got}, expected {shape} "
                f"from the header/config"
            )
    # Sharded weights keep the canonical layout (the sharding rules name its axes).
    model = nnx.eval_shape(
        lambda: Llama(cfg, rngs=nnx.Rngs(0), out_in=None if mesh is None else False)
    )
    dtype = jnp.dtype(cfg.dtype)
    for name in expected:
        target = model.layers if name in LAYER_WEIGHTS else model
        if mesh is None:
            stored = getattr(target, name)
            if isinstance(stored, nnx.List):  # out_in: one [out, in] buffer per layer
                value = np.asarray(weights[name])
                convert = cpu_panels.pack if model.layers.panels else _as_array
                for i, param in enumerate(stored):
                    param.set_value(convert(_transposed(value[i]).astype(dtype)))
                continue
            stored.set_value(jnp.asarray(weights[name], dtype))
            continue
        param = getattr(target, name)
        param.set_value(place_weight(name, weights[name], cfg, mesh, dtype, rules))
        param.set_metadata(logical_axes=LOGICAL_AXES[name])
    model.pack_head()
    return model
