"""Feature drafters: the hidden-state drafter (Make Every Draft Count, "mdc") and an EAGLE-style
drafter ("eagle"), as one network with two readouts.

Axis letters: B batch, T tokens, S cache length, W frontier slots, E extra (per-query) keys,
H query heads, K kv heads, D head dim, M model dim, V target vocab, U draft vocab.

Both drafters read the target's last hidden state f_j (the residual stream after the last layer,
before the final norm: what the target "knows" after token x_j) and run ONE decoder layer with the
target's shapes over their own KV cache. Position j of that cache holds the fused input

    u_j = f_{j-1} + fc([norm(f_{j-1}); norm(embed(x_j))])          (f_{-1} = 0)

whose layer output o_j predicts f_j; the target's final norm and LM head (restricted to the draft
vocabulary) turn a prediction into logits. The two kinds differ only in what they feed beyond the
committed tokens:

- eagle: the next input is fuse(o_j, embed(x_{j+1})) for a *drafted* x_{j+1}, so the recurrence
  consumes draft tokens and every tree node needs its own layer call. Logits: head(o_j).
- mdc (hidden-state autoregression): the recurrence never consumes draft tokens. The next input is
  fuse(o_j, null) with a learned null vector in place of the token embedding, so the chain of
  predicted hidden states h_1..h_depth is one layer call per depth whatever the tree holds, and
  token information is injected afterwards, at the readout:

      z = inject h_d + norm(info_proj embed(y))          (y: the node's parent token)
      logits(node) = head(z + readout_mlp(norm(z)))

  (public notes on the paper: LMHead(W h + normalised token-information embedding of the parent
  token)). The paper is silent on the token-information embedding; we project the target's own
  embedding (info_proj, M x M) rather than learn a V x M table, which keeps the drafter's own
  weights small enough to ship. The SwiGLU readout MLP (width F, down projection starting at
  zero) is our addition: h_d never saw the tokens between the root and y, and a linear injection
  can only add a token-dependent bias; with the MLP, unrolled-level agreement on stories260K went
  from 0.70/0.67/0.60/0.55 to 0.74/0.73/0.68/0.63 at the same data and steps.

Where the paper is silent we also chose: mdc runs its chain steps with a second decoder layer of
its own (the context layer reads verified tokens with the target's hidden states, the chain layer
extrapolates its own predictions; one layer for both did worse at depth: unrolled-level agreement
0.74/0.73/0.68/0.63 shared vs 0.75/0.74/0.70/0.66 separate on stories260K, tau without reuse
4.90 vs 5.07); the decoder layers are initialised from the target's last layer (a good prior for
mapping residual-stream vectors to residual-stream vectors); the draft
vocabulary is the U most frequent tokens of the training answers (the compressed draft vocabulary),
so both the LM-head cost of drafting and of training scale with U, not V.

This module holds the weights and the pure math (fused inputs, one layer step with extra
per-query keys, readouts, the unrolled training forward). The Drafter protocol (trees, reuse,
commits) lives in specjax.drafters.feature.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from specjax.config import ModelConfig
from specjax.kernels import cpu_panels
from specjax.models import precision
from specjax.models.layers import (
    PerLayer,
    dense,
    finish_layer,
    project_qkv,
    rms_norm,
    rope_angles,
    swiglu,
)
from specjax.models.target import LAYER_WEIGHTS, Layers

# The net's [in, out] matrices outside its decoder layers, swapped by DrafterNet.set_layout.
MATRICES = (
    "fc",
    "fusion_fc",
    "info_proj",
    "grand_proj",
    "far_proj",
    "inject",
    "readout_gate",
    "readout_up",
    "readout_down",
)

KINDS = ("mdc", "eagle")
# The most path tokens an mdc readout injects (the parent and up to three of its ancestors).
MAX_PATH_TOKENS = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrafterConfig:
    """kind: "mdc" | "eagle"; target: the target's ModelConfig (the drafter layer copies its
    shapes and RoPE); draft_vocab_size: U, the number of target tokens the drafter can propose;
    path_tokens (mdc): how many of a node's latest path tokens its readout injects, 1 = the
    parent, 2 = the parent and the grandparent, up to MAX_PATH_TOKENS; fusion_layers: the lower
    target layers whose hidden states are fused into the feature the drafter reads, besides the
    last one (EAGLE-3's multi-layer fusion; () reads the last hidden state only)."""

    kind: str
    target: ModelConfig
    draft_vocab_size: int
    path_tokens: int = 1
    fusion_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {self.kind!r}; choose from {KINDS}")
        allowed = tuple(range(1, MAX_PATH_TOKENS + 1)) if self.kind == "mdc" else (1,)
        if self.path_tokens not in allowed:
            raise ValueError(
                f"path_tokens must be in {allowed} for a {self.kind} drafter, "
                f"got {self.path_tokens}"
            )
        if not 1 <= self.draft_vocab_size <= self.target.vocab_size:
            raise ValueError(
                f"draft_vocab_size must be in [1, {self.target.vocab_size}], "
                f"got {self.draft_vocab_size}"
            )
        layers = tuple(self.fusion_layers)
        n = self.target.n_layers
        if list(layers) != sorted(set(layers)) or not all(1 <= i < n for i in layers):
            raise ValueError(
                f"fusion_layers must be increasing layer indices in [1, {n}) (the last hidden "
                f"state, {n}, is always read), got {self.fusion_layers}"
            )
        object.__setattr__(self, "fusion_layers", layers)  # lists from JSON headers

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The target hidden states the drafter reads: hidden[i] is the residual stream after
        i layers; the last one, n_layers, comes last."""
        return (*self.fusion_layers, self.target.n_layers)

    @property
    def layer(self) -> ModelConfig:
        """The drafter's decoder layer: one layer of the target's shape."""
        return dataclasses.replace(self.target, n_layers=1)


@flax.struct.dataclass
class TargetParts:
    """The frozen target weights a drafter reads (never trained, never saved with the drafter).

    embed [V, M]; final_norm [M]; head_u [M, U] the LM head restricted to the draft vocabulary,
    or [U, M] when head_out_in (the layout a drafter on the CPU keeps, see FeatureDrafter).
    """

    embed: jax.Array
    final_norm: jax.Array
    head_u: jax.Array
    head_out_in: bool = flax.struct.field(pytree_node=False, default=False)
    # head_u packed in panels [P, M, 32] for the CPU kernel (specjax.kernels.cpu_panels), read
    # instead of head_u where set; the drafter keeps it when its target's layers are packed.
    head_panels: jax.Array | None = None


def readout(x: jax.Array, parts: TargetParts, eps: float) -> jax.Array:
    """The target's final norm and LM head over the draft vocabulary: [..., M] -> [..., U]
    float32. The product runs in parts.head_u's dtype with float32 accumulation (a bfloat16
    head_u multiplies in bfloat16: experiments/train_step_time.py measures it in training);
    with head_out_in the weight leads the product (specjax.models.layers.dense says why)."""
    normed = rms_norm(x, parts.final_norm, eps).astype(parts.head_u.dtype)
    if parts.head_panels is not None:
        out = parts.head_u.shape[0] if parts.head_out_in else parts.head_u.shape[1]
        return cpu_panels.panel_product(normed, 0, (parts.head_panels,), out)
    if parts.head_out_in:
        return jnp.einsum("UM,...M->...U", parts.head_u, normed, preferred_element_type=jnp.float32)
    if precision.product_dtype() is not None:  # training with bfloat16 products
        return precision.matmul(normed, parts.head_u)
    return jnp.matmul(normed, parts.head_u, preferred_element_type=jnp.float32)


def target_parts(target, draft_vocab: jax.Array) -> TargetParts:
    """TargetParts of a specjax Llama for a draft vocabulary draft_vocab [U] (target ids)."""
    embed = target.embed[...]
    w = embed.T if target.config.tie_embeddings else target.lm_head[...]
    return TargetParts(
        embed=embed, final_norm=target.final_norm[...], head_u=jnp.take(w, draft_vocab, axis=1)
    )


class DraftVocab(nnx.Variable):
    """Target ids of the draft vocabulary [U] (saved with the drafter, not trained)."""


class DrafterNet(nnx.Module):
    """The drafter's own weights: input norms, the fusion fc [2M, M], one decoder layer (weights
    stacked with a leading axis of 1, like the target's), and for mdc the null input vector, the
    injection matrix and the token-information projection."""

    def __init__(
        self,
        cfg: DrafterConfig,
        draft_vocab,
        *,
        rngs: nnx.Rngs,
        target=None,
        input_scale: float = 1.0,
    ):
        """input_scale: initial scale of the normalised inputs, best set to the RMS of the
        target's hidden states (what training does), so token information starts at the
        magnitude of the residual stream it is added to."""
        m = cfg.target.d_model
        self.config = cfg
        self.out_in = False  # the weight layout (set_layout); built and saved canonical
        self.draft_vocab = DraftVocab(jnp.asarray(draft_vocab, jnp.int32))
        self.feat_norm = nnx.Param(jnp.full((m,), input_scale, jnp.float32))
        self.tok_norm = nnx.Param(jnp.full((m,), input_scale, jnp.float32))
        # fc starts by adding half the token embedding to the residual (the previous hidden state,
        # see fuse), plus noise.
        eye = jnp.concatenate([jnp.zeros((m, m)), 0.5 * jnp.eye(m)], axis=0)
        noise = 0.02 * jax.random.normal(rngs.params(), (2 * m, m)) / jnp.sqrt(m)
        self.fc = nnx.Param((eye + noise).astype(jnp.float32))
        self.layers = Layers(cfg.layer, rngs=rngs)
        if cfg.fusion_layers:
            # The lower layers' hidden states enter through a projection that starts at zero,
            # so an untrained fusion reads exactly the last hidden state (see read_features).
            f = len(cfg.fusion_layers)
            self.fusion_norm = nnx.Param(jnp.full((f, m), input_scale, jnp.float32))
            self.fusion_fc = nnx.Param(jnp.zeros((f * m, m), jnp.float32))
        if cfg.kind == "mdc":
            # The chain (null-input steps) has its own layer: the context layer reads verified
            # tokens with the target's hidden states, the chain layer extrapolates its own
            # predictions, and one set of weights serving both did worse at depth.
            self.chain_layers = Layers(cfg.layer, rngs=rngs)
        if target is not None:  # start from the target's last layer
            last = target.config.n_layers - 1
            source = target.layers.arrays()  # canonical, like the drafter's own layers
            for layers in (self.layers, getattr(self, "chain_layers", None)):
                for name in LAYER_WEIGHTS:
                    if layers is not None and hasattr(layers, name):
                        src = jnp.asarray(source[name][last : last + 1], jnp.float32)
                        getattr(layers, name).set_value(src)
        if cfg.kind == "mdc":
            self.null_token = nnx.Param(0.02 * jax.random.normal(rngs.params(), (m,)))
            self.inject = nnx.Param(jnp.eye(m, dtype=jnp.float32))
            self.info_proj = nnx.Param(
                jax.random.normal(rngs.params(), (m, m), jnp.float32) / jnp.sqrt(m)
            )
            self.info_norm = nnx.Param(jnp.full((m,), input_scale, jnp.float32))
            if cfg.path_tokens >= 2:
                self.grand_proj = nnx.Param(
                    jax.random.normal(rngs.params(), (m, m), jnp.float32) / jnp.sqrt(m)
                )
                self.grand_norm = nnx.Param(jnp.full((m,), input_scale, jnp.float32))
            if cfg.path_tokens >= 3:
                # The ancestors above the grandparent enter through one projection of their
                # concatenation, scaled by a norm weight that starts at zero: a drafter widened
                # from a saved one with two path tokens (start_from) starts as that drafter.
                far = (cfg.path_tokens - 2) * m
                self.far_proj = nnx.Param(
                    jax.random.normal(rngs.params(), (far, m), jnp.float32) / jnp.sqrt(far)
                )
                self.far_norm = nnx.Param(jnp.zeros((m,), jnp.float32))
            # The readout MLP mixes the chain's hidden state with the injected token (a linear
            # injection alone adds a token-dependent bias, a bigram at best). Its down projection
            # starts at zero, so training starts from the linear injection.
            f = cfg.target.ffn_dim
            self.readout_norm = nnx.Param(jnp.ones((m,), jnp.float32))
            self.readout_gate = nnx.Param(
                jax.random.normal(rngs.params(), (m, f), jnp.float32) / jnp.sqrt(m)
            )
            self.readout_up = nnx.Param(
                jax.random.normal(rngs.params(), (m, f), jnp.float32) / jnp.sqrt(m)
            )
            self.readout_down = nnx.Param(jnp.zeros((f, m), jnp.float32))
        self.panels = False  # matrices packed for the CPU kernel (set_layout)
        # Each own matrix's output size (built canonical, [in, out]), which packing rounds up.
        self.matrix_out = tuple((n, getattr(self, n).shape[1]) for n in self.matrix_names())

    # -- inputs and readouts -------------------------------------------------------------------

    def read_features(self, hidden: dict) -> jax.Array:
        """The feature the drafter reads at each position, from the target's hidden states
        {i: [..., M]} for every i in config.feature_layers. Returns [..., M] float32:

            g = h_L + fusion_fc [norm(h_l1); ...; norm(h_lF)]        (g = h_L without fusion)

        EAGLE-3 fuses a low, a middle and a high layer by one projection of their concatenation;
        we keep the last hidden state h_L as it is and add the lower layers through a projection,
        because the drafter's readout is the target's own final norm and LM head, which expect
        the last layer's residual stream: the drafter's outputs are still trained to predict h_L
        (the feature regression), and at initialisation the fused drafter is the unfused one."""
        cfg = self.config
        last = hidden[cfg.target.n_layers].astype(jnp.float32)
        if not cfg.fusion_layers:
            return last
        eps = cfg.target.norm_eps
        low = [
            rms_norm(hidden[i].astype(jnp.float32), self.fusion_norm[...][j], eps)
            for j, i in enumerate(cfg.fusion_layers)
        ]
        return last + self._dense(jnp.concatenate(low, axis=-1), "fusion_fc")

    def fuse(self, feat: jax.Array, tok_emb: jax.Array | None) -> jax.Array:
        """u = feat + fc([norm(feat); norm(tok_emb)]): feat [..., M], tok_emb [..., M] or None
        for the mdc chain's null input. Returns [..., M] float32.

        The raw feature is kept as a residual: consecutive hidden states of the target are close
        (cosine ~0.6 on SmolLM2) and carry its large-magnitude channels, which the final norm's
        scale depends on; the layer then only learns the change."""
        eps = self.config.target.norm_eps
        feat = feat.astype(jnp.float32)
        f = rms_norm(feat, self.feat_norm[...], eps)
        if tok_emb is None:
            e = jnp.broadcast_to(self.null_token[...], f.shape)
        else:
            e = rms_norm(tok_emb.astype(jnp.float32), self.tok_norm[...], eps)
        return feat + self._dense(jnp.concatenate([f, e], axis=-1), "fc")

    def logits(
        self,
        parts: TargetParts,
        out: jax.Array,
        parent_emb: jax.Array,
        ancestor_emb: jax.Array | None = None,
    ) -> jax.Array:
        """Draft logits [..., U] from a layer output (a predicted hidden state) out [..., M], the
        embedding of the token it extends parent_emb [..., M] and those of that token's
        ancestors ancestor_emb [..., A, M], nearest first (the grandparent, then its parent, ...;
        zero where the path starts before the sequence). mdc only reads them, the parent and
        config.path_tokens - 1 ancestors (A >= that): eagle's outputs already consumed them."""
        eps = self.config.target.norm_eps
        x = out
        if self.config.kind == "mdc":
            info = rms_norm(
                self._dense(parent_emb.astype(jnp.float32), "info_proj"), self.info_norm[...], eps
            )
            n_anc = self.config.path_tokens - 1
            if n_anc:
                if ancestor_emb is None or ancestor_emb.shape[-2] < n_anc:
                    have = 0 if ancestor_emb is None else ancestor_emb.shape[-2]
                    raise ValueError(
                        f"this drafter injects {n_anc + 1} path tokens: pass ancestor_emb with "
                        f"at least {n_anc} ancestors, got {have}"
                    )
                anc = ancestor_emb.astype(jnp.float32)
                info = info + rms_norm(
                    self._dense(anc[..., 0, :], "grand_proj"), self.grand_norm[...], eps
                )
            if n_anc >= 2:
                far = anc[..., 1:n_anc, :].reshape(anc.shape[:-2] + (-1,))
                info = info + rms_norm(self._dense(far, "far_proj"), self.far_norm[...], eps)
            x = self._dense(out, "inject") + info
            mlp = {
                "w_gate": self._matrix("readout_gate"),
                "w_up": self._matrix("readout_up"),
                "w_down": self._matrix("readout_down"),
            }
            x = x + swiglu(mlp, rms_norm(x, self.readout_norm[...], eps), self.out_in)
        return readout(x, parts, eps)

    # -- the decoder layer ---------------------------------------------------------------------

    def _layer(self, chain: bool = False) -> dict:
        """The decoder layer's weights: the mdc chain layer when chain (mdc only), else the
        context layer (eagle uses one layer everywhere)."""
        layers = self.chain_layers if chain and self.config.kind == "mdc" else self.layers
        return one_layer_weights(layers)

    def _matrix(self, name: str):
        """The net's matrix `name` as `dense` reads it (a PerLayer of one when packed)."""
        w = getattr(self, name)[...]
        if not self.panels:
            return w
        return PerLayer((w,), jnp.int32(0), dict(self.matrix_out)[name])

    def _dense(self, x: jax.Array, name: str) -> jax.Array:
        """x [..., I] times the net's matrix `name` (one of MATRICES, stored per self.out_in)."""
        return dense(x, self._matrix(name), self.out_in)

    def _canonical_matrix(self, name: str) -> jax.Array:
        """The net's matrix `name` [in, out], whatever the storage layout."""
        w = getattr(self, name)[...]
        if self.panels:
            return jnp.asarray(cpu_panels.unpack(w, dict(self.matrix_out)[name])).T
        return jnp.swapaxes(w, 0, 1) if self.out_in else w

    def set_layout(self, out_in: bool, panels: bool = False) -> None:
        """Store every weight matrix (the decoder layers' and MATRICES) [out, in] (out_in) or
        canonically [in, out], in place: the forward is the same function of the weights either
        way (specjax.models.layers.dense); checkpoints stay canonical (canonical_params).
        panels (with out_in): packed for the CPU kernel (specjax.kernels.cpu_panels), as the
        layers of a target with packed matrices are; in bfloat16 where the weights are
        bfloat16 values (a loaded checkpoint's: cpu_panels.pack_exact), the same products for
        half the bytes a drafting level reads."""
        if panels and not out_in:
            raise ValueError("the panel layout packs [out, in] matrices: it needs out_in=True")
        for layers in (self.layers, getattr(self, "chain_layers", None)):
            if layers is not None:
                layers.set_layout(out_in, panels, bf16_where_exact=True)
        if (out_in, panels) != (self.out_in, self.panels):
            canonical = {name: self._canonical_matrix(name) for name in self.matrix_names()}
            for name, w in canonical.items():
                stored = cpu_panels.pack_exact(w.T) if panels else (w.T if out_in else w)
                getattr(self, name).set_value(stored)
            self.out_in, self.panels = out_in, panels

    def matrix_names(self) -> tuple[str, ...]:
        """The net's own weight matrices (outside its decoder layers) that it has."""
        return tuple(n for n in MATRICES if hasattr(self, n))

    def canonical_params(self) -> dict:
        """The parameters as a pure dict in the canonical layout, whatever the storage layout."""
        params = nnx.to_pure_dict(nnx.state(self, nnx.Param))
        for name in ("layers", "chain_layers"):
            layers = getattr(self, name, None)
            if layers is not None and layers.out_in:
                params[name].update(layers.arrays())
        for name in self.matrix_names():
            params[name] = self._canonical_matrix(name)
        return params

    def qkv(self, x: jax.Array, positions: jax.Array, chain: bool = False):
        """x [B, T, M], positions [B, T] -> q [B, T, H, D], k, v [B, T, K, D] (RoPE applied)."""
        cfg = self.config.target
        p = self._layer(chain)
        cos, sin = rope_angles(positions, cfg.head_dim, cfg.rope_theta)
        normed = rms_norm(x, p["attn_norm"], cfg.norm_eps)
        return project_qkv(p, normed, cos, sin, cfg, self.out_in)

    def finish(self, x: jax.Array, attn: jax.Array, chain: bool = False) -> jax.Array:
        """Residual + output projection + SwiGLU: x [B, T, M], attn [B, T, H, D] -> [B, T, M]."""
        return finish_layer(self._layer(chain), x, attn, self.config.target, self.out_in)

    def step(self, x, positions, ctx_k, ctx_v, ctx_mask, ext_k, ext_v, ext_mask, chain=False):
        """One layer call whose queries see context keys and per-query extra keys (with the
        chain layer when chain, see _layer).

        x [B, T, M] inputs at positions [B, T]; ctx_k/ctx_v [B, S, K, D] with ctx_mask [B, T, S]
        (e.g. the committed cache, s < lengths); ext_k/ext_v [B, T, E, K, D] with ext_mask
        [B, T, E]: keys only query t sees (its ancestors in a draft tree), to which the query's
        own key is appended. Returns (out [B, T, M], k [B, T, K, D], v [B, T, K, D]): the new keys
        and values of the queries, for the caller to keep.
        """
        q, k, v = self.qkv(x, positions, chain)
        ext_k = jnp.concatenate([ext_k, k[:, :, None]], axis=2)
        ext_v = jnp.concatenate([ext_v, v[:, :, None]], axis=2)
        ext_mask = jnp.concatenate([ext_mask, jnp.ones(ext_mask.shape[:2] + (1,), bool)], axis=2)
        attn = attend_context_and_extra(q, ctx_k, ctx_v, ctx_mask, ext_k, ext_v, ext_mask)
        return self.finish(x, attn, chain), k, v


def one_layer_weights(layers: Layers) -> dict:
    """A one-layer stack's weights as `decoder_layer` reads them: each [..] array's layer 0,
    and packed matrices as a PerLayer of one (the kernel takes the layer as an operand)."""
    out = {}
    for name, w in layers.compute_arrays().items():
        size = layers.panel_out(name)
        out[name] = w[0] if size is None else PerLayer(w, jnp.int32(0), size)
    return out


def attend_context_and_extra(q, ctx_k, ctx_v, ctx_mask, ext_k, ext_v, ext_mask):
    """Softmax attention over shared context keys plus per-query extra keys (GQA, float32).

    q [B, T, H, D]; ctx_k/ctx_v [B, S, K, D], ctx_mask [B, T, S]; ext_k/ext_v [B, T, E, K, D],
    ext_mask [B, T, E] (every query must see at least one key). Returns [B, T, H, D].
    """
    b, t, h, d = q.shape
    kh = ctx_k.shape[2]
    q5 = q.reshape(b, t, kh, h // kh, d).astype(jnp.float32) / jnp.sqrt(jnp.float32(d))
    s_ctx = jnp.einsum("BTKGD,BSKD->BTKGS", q5, ctx_k.astype(jnp.float32))
    s_ext = jnp.einsum("BTKGD,BTEKD->BTKGE", q5, ext_k.astype(jnp.float32))
    s_ctx = jnp.where(ctx_mask[:, :, None, None, :], s_ctx, -jnp.inf)
    s_ext = jnp.where(ext_mask[:, :, None, None, :], s_ext, -jnp.inf)
    w = jax.nn.softmax(jnp.concatenate([s_ctx, s_ext], axis=-1), axis=-1)
    s = ctx_k.shape[1]
    out = jnp.einsum("BTKGS,BSKD->BTKGD", w[..., :s], ctx_v.astype(jnp.float32))
    out = out + jnp.einsum("BTKGE,BTEKD->BTKGD", w[..., s:], ext_v.astype(jnp.float32))
    return out.reshape(b, t, h, d)


def shift_right(x: jax.Array, n: int) -> jax.Array:
    """x [B, T, ...] shifted n steps later along T (zeros enter at the front)."""
    if n == 0:
        return x
    pad = [(0, 0), (n, 0)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad)[:, : x.shape[1]]


def path_ancestors(emb: jax.Array, n: int) -> jax.Array | None:
    """The n tokens before each position, nearest first, as the readout reads a node's
    ancestors: emb [B, T, M] -> [B, T, n, M] (zeros before the sequence's start; None for n 0)."""
    if n == 0:
        return None
    return jnp.stack([shift_right(emb, a) for a in range(1, n + 1)], axis=2)


def unrolled_outputs(
    net: DrafterNet,
    parts: TargetParts,
    tokens: jax.Array,
    feats: jax.Array,
    levels: int,
    window: jax.Array | None = None,
) -> list[jax.Array]:
    """Teacher-forced drafting, unrolled `levels` draft steps on the drafter's own predictions.

    tokens [B, T] and feats [B, T, M] (f_j, what the drafter reads of the target after x_j:
    net.read_features of its hidden states, the last hidden state without fusion) of whole
    sequences from position 0. Returns outs[k] [B, T, M] for k = 0..levels-1: outs[k][:, j] is
    the drafter's prediction of f_j when the last k inputs before j were its own predictions, the
    exact situation of a depth-(k+1) tree node whose root sits at j - k:

    - level 0 is the committed context: input fuse(f_{j-1}, e(x_j)), causal attention;
    - level k sees the true context at positions <= j - k (level-0 keys) and its own chain at
      positions j - k + i, i = 1..k (level-i keys), with input fuse(outs[k-1][j-1], e(x_j))
      (eagle) or fuse(outs[k-1][j-1], null) (mdc).

    Queries with j < k have no valid root and must be masked out of the loss by the caller.

    window: None, or [B, W] int, each row W consecutive positions (trainer.answer_window): every
    level's queries run on those positions only (the first level's keys and values are still
    computed everywhere: they are the context every level attends to), and the outputs
    elsewhere are zeros. outs[k][:, j] is exact where j is at least k positions into its row's
    window (the chain before it lies in the window), so a window that starts `levels` positions
    before a row's first answer token (its first scored position, prompt_len - 1, then sits
    levels - 1 into it: no slack) gives the loss exactly what the whole width would, for less
    work. The caller must build it for at least the levels it unrolls.
    """
    b, t = tokens.shape
    emb = jnp.take(parts.embed, tokens, axis=0)
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    key_pos = jnp.arange(t)[None, None, :]
    empty = jnp.zeros((b, t, 0) + (net.config.target.n_kv_heads, net.config.target.head_dim))
    no_ext = jnp.zeros((b, t, 0), bool)

    x0 = net.fuse(shift_right(feats, 1), emb)
    q0, k0, v0 = net.qkv(x0, positions)
    query_pos = positions if window is None else window.astype(jnp.int32)

    def at_window(x):  # [B, T, ...] -> [B, W, ...]
        if window is None:
            return x
        return jnp.take_along_axis(x, query_pos.reshape(query_pos.shape + (1,) * (x.ndim - 2)), 1)

    # The first level's keys and values are every position's context; its outputs are read in
    # the window only, so only the window's queries attend and run the rest of the layer.
    w = query_pos.shape[1]
    causal = key_pos <= query_pos[:, :, None]  # [B, W, T]
    attn0 = attend_context_and_extra(
        at_window(q0), k0, v0, causal, empty[:, :w], empty[:, :w], no_ext[:, :w]
    )
    query_emb, prev = at_window(emb), net.finish(at_window(x0), attn0)
    outs, chain_k, chain_v = [prev], [], []
    for lvl in range(1, levels):
        x = net.fuse(shift_right(prev, 1), query_emb if net.config.kind == "eagle" else None)
        ctx_mask = key_pos <= query_pos[:, :, None] - lvl  # [B, W, T]
        # Chain keys of levels 1..lvl-1 at positions j - (lvl - i): shifted so query j reads them.
        ext_k = [shift_right(k, lvl - i) for i, k in enumerate(chain_k, 1)]
        ext_v = [shift_right(v, lvl - i) for i, v in enumerate(chain_v, 1)]
        ext_k = jnp.stack(ext_k, axis=2) if ext_k else empty[:, :w]
        ext_v = jnp.stack(ext_v, axis=2) if ext_v else empty[:, :w]
        ext_mask = jnp.ones((b, w, lvl - 1), bool)
        prev, k, v = net.step(x, query_pos, k0, v0, ctx_mask, ext_k, ext_v, ext_mask, chain=True)
        outs.append(prev)
        chain_k.append(k)
        chain_v.append(v)
    if window is not None:
        rows = jnp.arange(b)[:, None]
        full = jnp.zeros((b, t, prev.shape[-1]), prev.dtype)
        outs = [full.at[rows, query_pos].set(o) for o in outs]
    return outs
