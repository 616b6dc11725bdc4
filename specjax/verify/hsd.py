"""Hierarchical Speculative Decoding (HSD): sequence-level lossless verification of chain drafts.

Axis letters: B batch, N tree nodes, V vocab, P = max_depth + 1 path slots, K = draft levels.

Reference: Zhou et al., Hierarchical Speculative Decoding, code at
github.com/ZhouYuxuanYX/Hierarchical-Speculative-Decoding (`_speculative_sampling` in
transformers/generation/utils.py, branch `backward=True`, with the "clever" capping of the prefix
ratio; `algorithm.py` / `algorithm_clean.py` hold earlier variants). This module is an
independent JAX implementation, vectorised over levels and rows.

Algorithm, for a chain draft x_1..x_k with x_t ~ q_t = q(. | x_<t) and target p_t = p(. | x_<t):

    rho_t = p_t(x_t) / q_t(x_t),  R_t = prod_{i<=t} rho_i = P_t / Q_t            (R_0 = 1)
    c_t   = R_t / max(1, max_{j<=t} R_j)  = min(1, c_{t-1} rho_t),  c_0 = 1       (so c_t <= 1)
    d_t(v) = c_{t-1} p_t(v) - q_t(v)      (the authors' P~_{t-1} p_t(v) - Q_{t-1} q_t(v), divided
                                           by Q_{t-1}; every use below is invariant to that scale)
    r_t   = max(d_t, 0) / max(sum d_t+, sum d_t-),  s_t = 1 - sum_v r_t(v)       (step back prob)

1. Accept the whole draft with probability c_k = min(1, c_{k-1} rho_k); then the bonus token
   comes from p_{k+1} (p at node k).
2. Otherwise walk back from level k: at level t step back with probability s_t; at the first level
   t* that does not step back keep x_<t* and sample the extra token from norm(r_t*). All Bernoulli
   draws are made at once: t* = the last level whose draw did not step back. s_1 = 0 (c_0 = 1
   gives sum d_1+ = sum d_1-), so the walk always stops, at level 1 at the latest.

Difference from the authors' code (deliberate): their `backward` branch caps the prefix ratio in
the residuals exactly as above (`cummax` of max(1, P_{t-1}/Q_{t-1})) but accepts the whole draft
with the *uncapped* ratio min(1, P_k / Q_k). Exact enumeration shows that this is not lossless as
soon as a proper prefix has P_j / Q_j > 1 (already for k = 2, V = 3: errors of a few percent in
the joint distribution of the emitted tokens; tests/test_verify.py::test_hsd_exact_enumeration
keeps this as a negative control). The capped acceptance c_k is what makes the residuals add up,
and with it the rule is exactly lossless:

Proof sketch (mass bookkeeping in the subtree of drafts that share the prefix y_<t; Q = q-mass of
that prefix). Claim: mass Q c_{t-1} of it emits tokens distributed as the target continuation of
y_<t ("good"), mass Q (1 - c_{t-1}) steps back past level t ("bad"). At a full draft (t = k + 1)
this is step 1. At level t, child v contributes good mass Q q_t(v) c_t(v) = Q min(q_t(v),
c_{t-1} p_t(v)) and bad mass Q (q_t(v) - c_{t-1} p_t(v))+. The bad mass arriving at level t is
Q sum d_t-; a fraction sum d_t+ / sum d_t- of it (= 1 - s_t, as c_{t-1} <= 1 means sum d_t+ <=
sum d_t-) stops and emits v with mass Q d_t+(v), so v is emitted with total mass
Q [min(q_t(v), c_{t-1} p_t(v)) + (c_{t-1} p_t(v) - q_t(v))+] = Q c_{t-1} p_t(v), followed by a
target-distributed continuation; the rest, Q (sum d_t- - sum d_t+) = Q (1 - c_{t-1}), steps back.
At the root c_0 = 1, so everything is good. The uncapped acceptance breaks the first step: its
good mass at a full draft is Q min(1, R_k) >= Q c_k.

Numerics: everything is in log space (log R_t by cumulative sums, the running max by cummax), so
long chains cannot underflow; c_t = exp(log R_t - log M_t) is exactly 1 at a running maximum, where
s_t is set to exactly 0 (its exact value; rounding of sum d+ vs sum d- would otherwise leave a
spurious step-back probability of order 1e-7). A level with d_t = 0 everywhere (c_{t-1} = 1 and
p_t = q_t) is never the stopping level in exact arithmetic (the level above it has c = 1, hence
s = 0, or it is the last level, accepted with probability 1); its residual falls back to p_t.

`valid`: levels after the first invalid node count as not drafted, i.e. the row runs HSD on its
k_b <= K valid levels; k_b = 0 emits one token from p at the root.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specjax.sampling import normalize, row_keys, sample
from specjax.tree import Acceptance, DraftTree
from specjax.verify.rejection import _TINY, _take, chain_levels, chain_path


@flax.struct.dataclass
class HSDLevels:
    """The per-row quantities of HSD on a chain (levels t = 1..K along the last axis).

    n_drafted:   [B] int32     k_b, number of valid draft levels.
    accept_prob: [B] float32   probability of accepting the whole valid draft (1 when k_b = 0).
    step_back:   [B, K] float32 s_t (1 for levels past k_b, so they are never a stopping level).
    residual:    [B, K, V] float32 norm(r_t), the distribution sampled when stopping at level t.
    """

    n_drafted: jax.Array
    accept_prob: jax.Array
    step_back: jax.Array
    residual: jax.Array


def hsd_levels(tree: DraftTree, p: jax.Array, max_depth: int) -> HSDLevels:
    """Compute HSD's acceptance, step-back and residual quantities (see module docstring).

    tree: chain with draft_dist [B, N, V]; p [B, N, V] target distributions; max_depth static.
    """
    x, p_lv, q_lv, drafted = chain_levels(tree, p, max_depth)
    k_max = x.shape[1]
    n_drafted = jnp.sum(drafted, axis=1).astype(jnp.int32)
    if k_max == 0:
        b, v = p.shape[0], p.shape[-1]
        return HSDLevels(
            n_drafted=n_drafted,
            accept_prob=jnp.ones((b,), jnp.float32),
            step_back=jnp.ones((b, 0), jnp.float32),
            residual=jnp.zeros((b, 0, v), jnp.float32),
        )
    log_rho = jnp.log(_take(p_lv, x)) - jnp.log(jnp.maximum(_take(q_lv, x), _TINY))
    # Undrafted levels contribute nothing (their values are masked out below anyway).
    log_r = jnp.cumsum(jnp.where(drafted, log_rho, 0.0), axis=1)  # log R_t, t = 1..K
    log_r_prev = jnp.pad(log_r[:, :-1], ((0, 0), (1, 0)))  # log R_{t-1}
    log_m_prev = jax.lax.cummax(jnp.maximum(log_r_prev, 0.0), axis=1)  # log max(1, max_j R_j)
    c_prev = jnp.exp(log_r_prev - log_m_prev)  # c_{t-1} in [0, 1]; exactly 1 at a running max

    d = c_prev[..., None] * p_lv - q_lv
    d_pos = jnp.maximum(d, 0.0)
    pos = jnp.sum(d_pos, axis=-1)
    neg = jnp.sum(jnp.maximum(-d, 0.0), axis=-1)
    denom = jnp.maximum(pos, neg)
    keep = jnp.where(denom > 0, pos / jnp.where(denom > 0, denom, 1.0), 1.0)
    step_back = jnp.where(c_prev >= 1.0, 0.0, 1.0 - keep)
    step_back = jnp.where(drafted, jnp.clip(step_back, 0.0, 1.0), 1.0)
    res = normalize(d_pos, fallback=p_lv)

    # Whole-draft acceptance c_k = exp(min(0, log R_k - log M_{k-1})) at the row's last level.
    last = jnp.maximum(n_drafted - 1, 0)[:, None]
    log_c_k = (
        jnp.take_along_axis(log_r, last, axis=1) - jnp.take_along_axis(log_m_prev, last, axis=1)
    )[:, 0]
    accept_prob = jnp.where(n_drafted > 0, jnp.exp(jnp.minimum(log_c_k, 0.0)), 1.0)
    return HSDLevels(
        n_drafted=n_drafted,
        accept_prob=accept_prob.astype(jnp.float32),
        step_back=step_back.astype(jnp.float32),
        residual=res.astype(jnp.float32),
    )


def verify_hsd(tree: DraftTree, p: jax.Array, key: jax.Array, max_depth: int) -> Acceptance:
    """Hierarchical speculative decoding on a chain tree.

    tree: chain of N nodes (node t drafted from tree.draft_dist[:, t - 1]); p [B, N, V] target
    distributions at the nodes; key [B] per-row keys; max_depth static. Returns Acceptance.
    """
    b = tree.tokens.shape[0]
    lv = hsd_levels(tree, p, max_depth)
    k_max = lv.step_back.shape[1]
    keys = row_keys(key, b)

    def draws(kk):
        k_acc, k_back, k_tok = jax.random.split(kk, 3)
        return jax.random.uniform(k_acc), jax.random.uniform(k_back, (k_max,)), k_tok

    u_acc, u_back, k_tok = jax.vmap(draws)(keys)
    accepted = u_acc < lv.accept_prob
    stops = u_back >= lv.step_back  # did not step back (levels past k_b have s = 1: never)
    level = jnp.arange(1, k_max + 1, dtype=jnp.int32)[None, :]
    t_stop = jnp.max(jnp.where(stops, level, 1), axis=1, initial=1)  # level 1 always stops
    n_acc = jnp.where(accepted, lv.n_drafted, t_stop - 1).astype(jnp.int32)

    p_bonus = jnp.take_along_axis(p.astype(jnp.float32), lv.n_drafted[:, None, None], axis=1)[:, 0]
    if k_max > 0:
        r_stop = jnp.take_along_axis(lv.residual, (t_stop - 1)[:, None, None], axis=1)[:, 0]
        dist = jnp.where(accepted[:, None], p_bonus, r_stop)
    else:
        dist = p_bonus
    nxt = jax.vmap(sample)(k_tok, dist)
    return Acceptance(path=chain_path(n_acc, max_depth), n_accepted=n_acc, next_token=nxt)
