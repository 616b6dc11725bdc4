"""Acceptance rules: pure functions of (tree, target probabilities, per-row keys).

Axis letters: B batch, N tree nodes, V vocab, P = max_depth + 1 path slots.

One signature for every rule, rule(tree, p, key, max_depth) -> specjax.tree.Acceptance
(max_depth static; key: per-row PRNG keys [B]):
    verify_greedy(tree, p, key, max_depth)             p may be logits (argmax only), key unused
    verify_chain(tree, p, key, max_depth)              standard speculative sampling, chains
    verify_tree_onehot(tree, p, key, max_depth)        deterministic (top-k) children
    verify_tree_sampled(tree, p, key, max_depth)       children i.i.d. from tree.draft_dist
    verify_hsd(tree, p, key, max_depth)                hierarchical (sequence-level), chains

RULES maps the SpecConfig.rule names to these functions.
"""

from specjax.verify.greedy import verify_greedy
from specjax.verify.hsd import HSDLevels, hsd_levels, verify_hsd
from specjax.verify.rejection import verify_chain, verify_tree_onehot, verify_tree_sampled

RULES = {
    "greedy": verify_greedy,
    "chain": verify_chain,
    "tree_onehot": verify_tree_onehot,
    "tree_sampled": verify_tree_sampled,
    "hsd": verify_hsd,
}

__all__ = [
    "RULES",
    "HSDLevels",
    "hsd_levels",
    "verify_chain",
    "verify_greedy",
    "verify_hsd",
    "verify_tree_onehot",
    "verify_tree_sampled",
]
