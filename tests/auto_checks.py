"""Shared pieces of the SpecConfig.auto() tests: a synthetic static acceptance profile and
costs kept in a cache folder, so that a default call measures and calibrates nothing."""

import json

from flax import nnx

import specjax
from specjax import autotune
from specjax.acceptance import AcceptanceProfile, ProfileRecorder, write_profiles
from specjax.autotune import DraftCosts, VerifyCosts
from specjax.choice import anchor_grid, best_tau, cost_context, pair_profile_file, verify_grid
from specjax.config import TINY, AutoSpecConfig, TreeConfig
from specjax.drafters import LMDrafter
from specjax.prefill_costs import keep_prefill_seconds

PREFILL_S = 0.5  # every kept prefill (keep_costs)

# Static probe (2, 1): root -> nodes 1, 2 (ranks 0, 1) -> node 3 under 1, node 4 under 2.
STATIC_PARENTS = [-1, 0, 0, 1, 2]
STATIC_DEPTH = [0, 1, 1, 2, 2]
STATIC_STEPS = [([0, 1, 3], 2), ([0, 2, 4], 2), ([0, 1, 0], 1), ([0, 0, 0], 0)]


def static_profile() -> AcceptanceProfile:
    rec = ProfileRecorder(TreeConfig(branching=(2, 1)), "greedy")
    for path, n_acc in STATIC_STEPS:
        rec.add(STATIC_PARENTS, STATIC_DEPTH, [True] * 5, [1.0] * 5, path, n_acc)
    return rec.profile("synthetic")


def keep_costs(cache, target, drafter, auto) -> None:
    """Write static_profile() as the (target, drafter) pair's greedy profile and flat costs
    (every forward 1 s, 0.01 s a draft depth, PREFILL_S a prefill of up to 64 tokens) for batch
    2 into the cache folder."""
    context = cost_context(target, auto)
    write_profiles(pair_profile_file(target, drafter, "greedy"), [static_profile()])
    # The grid the call asks for first (the powers of two, with the stop rule it passes: twice
    # the best tau), and every count of its fine grid timed.
    grid = tuple(verify_grid(2, 4))
    verify = VerifyCosts(key=autotune.cost_key(target, batch=2, context=context),
                         nodes=grid, seconds=(1.0,) * len(grid), ar_token=1.0,
                         requested=tuple(anchor_grid(2, 4)),
                         stop_ratio=2 * best_tau([static_profile()], 4))  # fmt: skip
    draft = DraftCosts(
        key=autotune.drafter_key(target, drafter, batch=2, context=context),
        kind="static", nodes=(2, 4), per_depth=(0.01, 0.01), overhead=0.0,
    )  # fmt: skip
    for what, costs in (("verify", verify), ("draft", draft)):
        path = autotune._cache_file(costs.key, cache, what)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(costs.to_json()))
    for width in (16, 32, 64):
        keep_prefill_seconds(target, batch=2, width=width, seconds=PREFILL_S)


def kept_costs_call(tmp_path, monkeypatch, **auto):
    """(target, drafter, auto config, prompts, generate's greedy output) of a default call whose
    costs and profile are kept in tmp_path (keep_costs): a TINY target drafting itself with one
    layer, two ragged prompts, 12 new tokens."""
    monkeypatch.setenv("SPECJAX_CACHE", str(tmp_path))
    target = specjax.Llama(TINY, rngs=nnx.Rngs(0))
    drafter = LMDrafter.self_draft(1)
    config = AutoSpecConfig(max_nodes=4, verbose=False, timed_candidates=0, **auto)
    keep_costs(tmp_path, target, drafter, config)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    return target, drafter, config, prompts, specjax.generate(target, prompts, max_new_tokens=12)
