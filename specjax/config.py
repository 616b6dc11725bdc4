"""Frozen, hashable configuration dataclasses (passed to jitted functions as static arguments).

Axis letters used throughout specjax: B batch, T query tokens in this call, S cache length,
N tree nodes, H query heads, K kv heads, D head dim, M model dim, F ffn dim, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

RopeLayout = Literal["interleaved", "half"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder.

    rope_layout: "interleaved" rotates (even, odd) pairs of each head (llama2.c, GGUF as stored by
    llama.cpp); "half" rotates (i, i + D/2) pairs (Hugging Face). The two are the same model up to a
    permutation of the Q/K output rows, so each reader keeps the layout its file was written in.
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_layout: RopeLayout = "half"
    tie_embeddings: bool = True
    qkv_bias: bool = False
    max_seq_len: int = 2048
    dtype: str = "float32"

    def __post_init__(self):
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )
        if self.rope_layout not in ("interleaved", "half"):
            raise ValueError(
                f"rope_layout must be 'interleaved' or 'half', got {self.rope_layout!r}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")


# A tiny random model for unit tests (never for measurements).
TINY = ModelConfig(
    vocab_size=16,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    ffn_dim=64,
    max_seq_len=128,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Sampling transform applied identically to target and drafter.

    temperature == 0 means greedy (argmax). top_k == 0 disables top-k; top_p == 1 disables top-p.
    top_k / top_p with temperature 0 is an error (greedy ignores them, so asking for both is a
    mistake we would otherwise hide).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.temperature == 0.0 and (self.top_k or self.top_p < 1.0):
            raise ValueError(
                f"top_k={self.top_k} / top_p={self.top_p} have no effect at temperature 0 "
                "(greedy decoding takes the argmax): set a temperature > 0 to sample, or drop them"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


RULES = ("auto", "greedy", "chain", "tree_onehot", "tree_sampled", "hsd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeConfig:
    """Static draft-tree topology: branching[d] children for every node at depth d.

    (1,) * k is a chain of k draft tokens; (4, 2, 1) is a root with 4 children, each with 2
    children, each with 1 child (1 + 4 + 8 + 8 = 21 nodes). Nodes are numbered breadth first, so
    every depth is a contiguous index range and parents precede children. The content (which tokens)
    is chosen per step by the drafter; the shape never changes.

    text_chain > 0 (dynamic trees of feature drafters): one more branch of the root, a chain of
    that many nodes drafted from the row's own text (prompt lookup: the token after the latest
    longest earlier occurrence of the path's last tokens), numbered after the drafter's nodes.
    The drafter's own tree keeps its budget and depth (drafter_nodes, drafter_depth).
    text_min_match: 0 verifies every chain node, drafted or not (the step's node count is
    static), and the chain drafts from any match; m >= 1 drafts only while the match is at least
    m tokens long and verifies the drafted nodes alone, on the smallest of a few static node
    counts that holds the batch's (TreeConfig.text_buckets).
    """

    branching: tuple[int, ...] = (1, 1, 1, 1)
    # > 0: a dynamic tree of `budget` draft nodes (root excluded) whose topology the drafter
    # chooses every step (EAGLE-2 style: depth len(branching), top-max(branching) expansion).
    budget: int = 0
    text_chain: int = 0
    text_min_match: int = 0

    def __post_init__(self):
        if not self.branching or any(int(b) < 1 for b in self.branching):
            raise ValueError(
                f"tree branching must be a non-empty tuple of ints >= 1, got {self.branching}"
            )
        if self.budget < 0:
            raise ValueError(f"tree budget must be >= 0, got {self.budget}")
        if self.text_chain < 0:
            raise ValueError(f"tree text_chain must be >= 0, got {self.text_chain}")
        if self.text_chain and not self.is_dynamic:
            raise ValueError(
                "a text chain hangs off a dynamic tree (TreeConfig.dynamic(...), feature "
                f"drafters): got static branching {self.branching}"
            )
        if self.text_min_match < 0:
            raise ValueError(f"tree text_min_match must be >= 0, got {self.text_min_match}")
        if self.text_min_match and not self.text_chain:
            raise ValueError("tree text_min_match needs a text chain (text_chain > 0)")

    @classmethod
    def chain(cls, k: int) -> TreeConfig:
        return cls(branching=(1,) * k)

    @classmethod
    def dynamic(cls, nodes: int, depth: int, topk: int) -> TreeConfig:
        """A dynamic tree: `nodes` draft nodes at most `depth` deep, every expanded node
        proposing its `topk` best children (feature drafters pick the best nodes by cumulative
        draft probability)."""
        if min(nodes, depth, topk) < 1:
            raise ValueError(
                f"dynamic tree needs nodes, depth, topk >= 1, got {(nodes, depth, topk)}"
            )
        return cls(branching=(topk,) + (1,) * (depth - 1), budget=nodes)

    @property
    def is_dynamic(self) -> bool:
        return self.budget > 0

    @property
    def topk(self) -> int:
        return max(self.branching)

    def with_text_chain(self, k: int, min_match: int = 0) -> TreeConfig:
        """The same tree with a text chain of k nodes (0: none), drafted and verified as
        text_min_match = min_match says."""
        return dataclasses.replace(self, text_chain=k, text_min_match=min_match if k else 0)

    @property
    def is_chain(self) -> bool:
        return all(b == 1 for b in self.branching) and not self.text_chain

    @property
    def max_depth(self) -> int:
        """The deepest node's depth, the text chain's included."""
        return max(len(self.branching), self.text_chain)

    @property
    def drafter_depth(self) -> int:
        """The depth of the drafter's own tree (the text chain left out)."""
        return len(self.branching)

    @property
    def drafter_nodes(self) -> int:
        """N of the drafter's own tree, the root included (the text chain left out)."""
        return self.budget + 1 if self.is_dynamic else sum(self.level_sizes)

    @property
    def text_buckets(self) -> tuple[int, ...]:
        """Node counts a tree with text_min_match is verified on: the drafter's own nodes,
        those and half the chain (chains of 4 or more), and the whole tree; a step runs the
        smallest that holds every row's drafted nodes. Each is a branch of the compiled step; on
        a CPU t(N) rises ~3% of a step per node past 8 (bench.md's t(N))."""
        sizes = {self.drafter_nodes, self.num_nodes}
        if self.text_chain >= 4:
            sizes.add(self.drafter_nodes + self.text_chain // 2)
        return tuple(sorted(sizes))

    @property
    def level_sizes(self) -> tuple[int, ...]:
        """Number of nodes at each depth 0..drafter_depth (the text chain left out)."""
        sizes = [1]
        for b in self.branching:
            sizes.append(sizes[-1] * b)
        return tuple(sizes)

    @property
    def num_nodes(self) -> int:
        """N, the root and the text chain included."""
        return self.drafter_nodes + self.text_chain

    def level_start(self, depth: int) -> int:
        return sum(self.level_sizes[:depth])

    def parents(self) -> tuple[int, ...]:
        """Parent index of every node (-1 for the root), breadth-first numbering."""
        if self.is_dynamic:
            raise ValueError("a dynamic tree has no fixed topology (its drafter chooses it)")
        parents = [-1]
        for d, b in enumerate(self.branching):
            start = self.level_start(d)
            for i in range(self.level_sizes[d]):
                parents.extend([start + i] * b)
        return tuple(parents)

    def depths(self) -> tuple[int, ...]:
        return tuple(d for d, n in enumerate(self.level_sizes) for _ in range(n))


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecConfig:
    """Speculative decoding settings.

    rule: "auto" picks greedy at temperature 0, "chain" for chain trees and "tree_onehot" (top-k
    children) for wider trees; "tree_sampled" draws children i.i.d. from the drafter; "hsd" is
    hierarchical (sequence-level) verification of sampled chains.
    attn_impl: "auto" | "reference" | "cpu" | "pallas" | "interpret" (see specjax.attention).
    pre_verify: let the drafter's pre-verifier (PACER, specjax.pre_verify) stop drafting early
    and prune the tree, when the drafter has one; False drafts and verifies the whole tree.
    fallback_tau: when set, speculation stops for the rest of the call once, after at least
    fallback_after steps, the batch's tokens per target call are below fallback_tau by more
    than one standard error of their mean (its
    break-even: the step's cost over a plain decoding step's, which SpecConfig.auto() sets from
    its measured costs); the remaining tokens are decoded plainly inside the same loop (stats
    plain_steps). The output is the same either way: only the speed changes.
    """

    tree: TreeConfig = TreeConfig()
    rule: str = "auto"
    attn_impl: str = "auto"
    pre_verify: bool = True
    fallback_tau: float | None = None
    fallback_after: int = 8

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown acceptance rule {self.rule!r}; choose from {RULES}")
        if self.fallback_tau is not None and not self.fallback_tau > 0:
            raise ValueError(f"fallback_tau must be > 0 (or None), got {self.fallback_tau}")
        if self.fallback_after < 1:
            raise ValueError(f"fallback_after must be >= 1, got {self.fallback_after}")
        if self.rule in ("chain", "hsd") and not self.tree.is_chain:
            raise ValueError(
                f"rule {self.rule!r} needs a chain tree, got branching {self.tree.branching}"
            )

    @staticmethod
    def auto(**kwargs) -> AutoSpecConfig:
        """The default of speculative_generate: the draft tree is chosen for this hardware,
        model and drafter from measured costs and the drafter's acceptance profile (see
        AutoSpecConfig and specjax.choice). An explicit SpecConfig always wins."""
        return AutoSpecConfig(**kwargs)

    def resolved_rule(self, sampling: SamplingConfig, sampled_children: bool = True) -> str:
        """The rule that runs. sampled_children=False is a drafter whose children are its top-k
        (feature drafters): only the one-hot tree rule is lossless for those when sampling."""
        if sampling.greedy:
            return "greedy"
        if not sampled_children:
            if self.rule not in ("auto", "tree_onehot"):
                raise ValueError(
                    f"rule {self.rule!r} needs children sampled from the drafter, but this "
                    "drafter proposes its top-k: use rule 'auto' or 'tree_onehot'"
                )
            return "tree_onehot"
        if self.rule != "auto":
            return self.rule
        return "chain" if self.tree.is_chain else "tree_onehot"

    def children_sampled(self, sampling: SamplingConfig) -> bool:
        """Whether drafted children are sampled from q (else: top-k of q, one-hot q)."""
        return self.resolved_rule(sampling) in ("chain", "tree_sampled", "hsd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AutoSpecConfig:
    """Choose the draft tree per call (specjax.choice): of every tree within the drafter's
    acceptance profile with at most max_nodes nodes, the one with the highest predicted tokens
    per second on this backend; with B rows, at most max_batch_nodes / B nodes, and never
    fewer than 2 (a step verifies B x N tokens). Costs are measured at `context` committed
    tokens once per backend, device kind, model, batch and dtype and kept on disk
    (specjax.autotune); context None (the default) is the call's context (specjax.choice.
    call_context: with the CPU attention kernel, which reads only the committed positions, the
    padded prompt plus half the new tokens; else the cache length, padded prompt plus new
    tokens) rounded to a power of two: attention makes a small model's step over a
    256-slot cache cost ~1.5x what it costs over 128, so costs taken elsewhere misjudge plain
    decoding against a tree.
    min_speedup: with allow_autoregressive, speculate only where the best tree's predicted
    speedup reaches this. Why a margin: the prediction compares steps timed inside a loop, and
    per-call costs that fall on the speculative side (the drafter's prefill, ~2 ms more host
    work per call) are left out; for a small model's short calls they decide (stories260K,
    128 tokens: predicted 1.03x, measured 0.73x).
    verbose: progress lines and the choice on stderr. allow_autoregressive: when no tree is
    predicted to beat plain decoding, decode autoregressively (the same output distribution;
    stats tree "autoregressive"). timed_candidates: how many of the best predicted trees are
    then timed as whole steps against plain decoding (interleaved, once per machine; 0: trust
    the model alone). fallback: the chosen config stops speculating within a call whose
    acceptance falls below the tree's break-even (SpecConfig.fallback_tau): the acceptance
    profile can overrate prompts unlike its calibration prompts, and the first steps show it.
    adapt: True (the default) scales the acceptance profile by the shift this process's
    earlier calls measured (specjax.adaptation: what the stop learns within a call, carried to
    the next one) and records this call; False uses the profile as calibrated; a number uses
    that shift and records nothing (to repeat a choice made earlier: stats acceptance_shift).
    rule / attn_impl as in SpecConfig."""

    rule: str = "auto"
    attn_impl: str = "auto"
    max_nodes: int = 64
    max_batch_nodes: int = 2048
    context: int | None = None
    verbose: bool = True
    allow_autoregressive: bool = True
    min_speedup: float = 1.1
    timed_candidates: int = 3
    fallback: bool = True
    adapt: bool | float = True

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"unknown acceptance rule {self.rule!r}; choose from {RULES}")
        if self.max_nodes < 2:
            raise ValueError(
                f"max_nodes must be >= 2 (the root and one drafted token), got {self.max_nodes}"
            )
        if self.max_batch_nodes < 2:
            raise ValueError(f"max_batch_nodes must be >= 2, got {self.max_batch_nodes}")
        if self.context is not None and self.context < 1:
            raise ValueError(f"context must be >= 1, got {self.context}")
        if self.min_speedup < 1:
            raise ValueError(
                f"min_speedup must be >= 1 (a tree predicted slower than plain decoding is not "
                f"chosen while allow_autoregressive), got {self.min_speedup}; to speculate "
                f"whatever the prediction, pass allow_autoregressive=False"
            )
        if self.timed_candidates < 0:
            raise ValueError(f"timed_candidates must be >= 0, got {self.timed_candidates}")
        if not isinstance(self.adapt, bool) and not (
            isinstance(self.adapt, (int, float)) and self.adapt > 0
        ):
            raise ValueError(
                f"adapt must be True, False or a shift > 0 (stats acceptance_shift), "
                f"got {self.adapt!r}"
            )
