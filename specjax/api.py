"""The public speculative_generate: resolves the hardware-aware default (SpecConfig.auto(),
specjax.choice) above the engine (specjax.speculative), so that the engine never imports the
measurement and calibration modules that drive it."""

from __future__ import annotations

import copy
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax import adaptation, pre_verifier_local, programs
from specjax.acceptance import mode_of
from specjax.cache import tree_reserve
from specjax.choice import call_context, call_prefill_seconds, resolve_auto
from specjax.config import AutoSpecConfig, SamplingConfig, SpecConfig, TreeConfig
from specjax.decode import (
    GenerateOutput,
    check_eos,
    check_sampling,
    generate,
    prepare_keys,
    prepare_prompts,
)
from specjax.hispec import HiSpec, hispec_generate
from specjax.hispec_choice import choose_hispec
from specjax.speculative import pruning_pre_verifier, speculative_decode


def speculative_generate(
    target,
    drafter,
    prompts,
    *,
    max_new_tokens: int,
    config: SpecConfig | AutoSpecConfig = AutoSpecConfig(),
    sampling: SamplingConfig = SamplingConfig(),
    key=None,
    eos_id: int | None = None,
    verifier=None,
) -> GenerateOutput:
    """Speculative decoding: the target's exact output distribution in fewer target calls.

    target: a specjax Llama; drafter: a Drafter (e.g. LMDrafter(draft_model) or
    LMDrafter.self_draft(k)); prompts: list of token-id lists (ragged) or int array [B, T];
    verifier: a Verifier (default FullVerifier(): the whole target verifies every node).
    Returns GenerateOutput(tokens [B, max_new_tokens], lengths [B], stats) with stats
    target_calls [B] (verification steps), tau [B] (mean accepted + 1 per verification, the
    acceptance length; a row's last step counts its whole accepted path even where
    max_new_tokens or EOS cut it, so the tokens emitted per call, (lengths - 1) / target_calls,
    can be a little lower), accepted_hist [B, max_depth + 1] and nonfinite_logits [B] (steps
    in which the target produced NaN/inf logits: the output of such a row is not trustworthy;
    it is reported, not raised, since the check runs inside the compiled loop; absent where
    SpecConfig.auto() chose plain decoding, which runs `generate` and does not check). Greedy
    output equals `generate`'s; sampled output has the same distribution.

    config: SpecConfig.auto() (the default) chooses the draft tree for this backend, target,
    drafter and batch (specjax.choice; the first call measures costs and may calibrate, both kept
    on disk) and adds stats tree (its label), predicted_tau, predicted_speedup (of the whole
    call, its prefill included: Choice.predicted_speedup), predicted_step_speedup (of the
    decoding steps alone), prefill_s, choose_s (the seconds this call spent choosing) and
    acceptance_shift (how this process's earlier calls rescaled the drafter's acceptance
    profile: specjax.adaptation); an explicit SpecConfig is used as given. A greedy default call
    with a feature drafter that has a pre-verifier verifies the chosen tree widened, each step
    pruned by this machine's costs (_cost_aware_candidate; stats tree then ends in
    "pre-verified by cost (chosen whole: ...)", and the predictions are the chosen tree's).

    drafter may also be a specjax.hispec.HiSpec (load_drafter of an exit-heads directory): the
    three-level HiSpec loop runs with the settings of its checkpoint, or with an explicit
    SpecConfig's chain length as its draft length; under SpecConfig.auto() only where it
    measured faster than plain decoding, which runs otherwise (see _hispec).
    """
    if not isinstance(config, (SpecConfig, AutoSpecConfig)):
        raise ValueError(
            f"config must be a SpecConfig or SpecConfig.auto(), got {type(config).__name__}"
        )
    kwargs = dict(max_new_tokens=max_new_tokens, sampling=sampling, key=key, eos_id=eos_id)
    if isinstance(drafter, HiSpec):
        return _hispec(target, drafter, prompts, config, verifier, **kwargs)
    if not isinstance(config, AutoSpecConfig):
        _localize_pre_verifier(target, drafter, prompts, config, **kwargs)
        return speculative_decode(target, drafter, prompts, config=config, verifier=verifier,
                                  **kwargs)  # fmt: skip
    started = time.perf_counter()
    choice, width = _choose_config(
        target, drafter, prompts, config, sampling, max_new_tokens, eos_id, key, verifier
    )
    # The loop is compiled for the verifier, attention, rule and fallback too: a program for
    # the same tree under other ones is not one this call can run.
    settings = (id(verifier), config.attn_impl, config.rule, config.fallback)
    shape = programs.shape_of(target, drafter, mode_of(sampling), len(prompts), width,
                              max_new_tokens, settings)  # fmt: skip
    choice = programs.keep_compiled(choice, shape, max_new_tokens)
    prune = None
    runner = drafter  # the drafter the loop runs: a twin with a cost-aware pre-verifier, or it
    if choice.config is not None and sampling.greedy and verifier is None:
        runner, choice = _cost_aware_candidate(target, drafter, choice, len(prompts),
                                               verbose=config.verbose)  # fmt: skip
        if runner is drafter:
            choice, prune = _with_pre_verifier(target, drafter, choice, verbose=config.verbose)
    prefill_s = call_prefill_seconds(target, len(prompts), width, verbose=config.verbose)
    choice = choice.for_call(new_tokens=max_new_tokens, prefill_seconds=prefill_s,
                             choose_seconds=time.perf_counter() - started)  # fmt: skip
    # The profiles predict the whole tree verified by the full target: a pruned tree's tau or
    # another verifier's says nothing about them.
    adapting = config.adapt is True and verifier is None and not choice.config_prunes
    adapt_key = adaptation.key_of(target, drafter, mode_of(sampling))  # not the PRNG key
    compiled_before = programs.compile_seconds()
    if choice.config is None:
        if adapting:
            adaptation.record_plain(adapt_key)
        out = _autoregressive(target, prompts, choice, config.attn_impl, **kwargs)
        programs.record(shape, target, drafter, None, programs.compile_seconds() - compiled_before)
        return out
    # The fallback runs plain steps through the verifier; an early-exit verifier's "plain" step
    # would still run its levels, so it keeps the chosen tree throughout.
    chosen = choice.with_fallback() if config.fallback and verifier is None else choice.config
    out = speculative_decode(target, runner, prompts, config=_verified_where_drafted(chosen),
                             verifier=verifier, **kwargs)  # fmt: skip
    # The tree recorded as compiled is the one chosen: its cost-aware candidate follows from it.
    programs.record(shape, target, drafter, choice.widened_from or chosen.tree,
                    programs.compile_seconds() - compiled_before)  # fmt: skip
    if adapting:
        adaptation.record(adapt_key, target, drafter, choice.profiles, chosen.tree, out.stats)
    out.stats.update(choice.stats())
    if prune is not None:
        out.stats["pre_verifier_replay_gain"] = prune.gain
    return out


def _verified_where_drafted(config: SpecConfig) -> SpecConfig:
    """A chosen text chain runs verified where drafted from any match (text_min_match 1): the
    tokens per call its profile predicted (whose tables replay chains drafted from any match),
    at most the cost timed for the whole tree. On a 2-core Xeon, eagle dynamic(4,3,4) + 8 on
    MT-bench: NOTES.md, "Fifty-third session"."""
    tree = config.tree
    if tree.text_chain and not tree.text_min_match:
        return dataclasses.replace(config, tree=tree.with_text_chain(tree.text_chain, 1))
    return config


# What the default call verifies from when the drafter has a pre-verifier and the call is
# greedy: the chosen feature-drafter tree, widened to at least dynamic(*COST_AWARE_TREE), with a
# text chain of COST_AWARE_CHAIN nodes drafted from any match. The pre-verifier, set to this
# machine's t(N) (pre_verifier_local.cost_aware), verifies each step the bucket of the most
# probable nodes with the most expected tokens per second, so the wider candidate costs
# verification only where it is expected to pay. Measured on a 2-core Xeon, MT-bench, 8 first
# turns, 256 tokens (NOTES.md, "Fifty-sixth session"): the mdc cost-aware over (7,3,4) + 8
# 1.88x / 1.93x, over (7,4,4) + 8 1.80x, (11,4,4) + 8 1.79x, (7,3,8) + 8 1.81x, (3,2,8) + 8
# 1.88x, (5,3,4) + 8 1.90x, against its best whole tree (3,2,8) + 4 1.78x / 1.81x; the eagle
# over (7,3,4) + 8 2.12x, over (7,4,4) + 8 2.06x. The default call so, MT-bench / qa
# (experiments/results/pacer.md, its latest run): eagle 2.07x / 2.36x against 1.72x / 2.06x
# choosing whole trees alone, mdc 1.97x / 2.23x against 1.70x / 2.04x. These settings were
# swept on MT-bench first turns, the set pacer.md reports: a sweep on held-in prompts would
# make its MT-bench figures independent of the choice.
COST_AWARE_TREE = (7, 3, 4)
COST_AWARE_CHAIN = 8
# The largest batch that runs the candidate; larger batches keep the chosen tree
# (_with_pre_verifier). Timed by `experiments/batched.py --cost-aware`, which raises it (2-core
# Xeon, eagle, the first B MT-bench first turns, 128 tokens,
# experiments/results/batched_cost_aware.md): the candidate ran 1.00x / 0.92x / 0.86x the speed
# of the chosen tree at B = 2 / 4 / 8.
COST_AWARE_MAX_BATCH = 1
# Cost-aware twins of drafters, by (target, drafter, pre-verifier, batch, context): a repeated
# call runs the same object, so its compiled loop is reused.
_COST_AWARE: dict[tuple, tuple] = {}


def _cost_aware_candidate(target, drafter, choice, batch: int, *, verbose: bool = True):
    """(the drafter to run, the choice) for a greedy default call of at most COST_AWARE_MAX_BATCH
    rows whose choice is a feature drafter's dynamic tree, when the drafter has a pre-verifier: a
    twin of the drafter whose pre-verifier chooses each step's nodes by this machine's t(N) at
    the call's batch and the choice's context, over the chosen tree widened as COST_AWARE_TREE /
    COST_AWARE_CHAIN say. The choice keeps its predictions (the chosen tree's, whole) and names
    the tree it was widened from (Choice.widened_from). Otherwise (drafter, choice) unchanged."""
    pv = getattr(drafter, "pre_verifier", None)
    tree = choice.config.tree
    if pv is None or not tree.is_dynamic or not getattr(drafter, "text_chains", False):
        return drafter, choice
    if batch > COST_AWARE_MAX_BATCH:
        return drafter, choice
    nodes, depth, topk = COST_AWARE_TREE
    wide = (
        tree
        if tree.budget >= nodes
        else TreeConfig.dynamic(nodes, max(depth, tree.drafter_depth), topk)
    )
    wide = wide.with_text_chain(max(tree.text_chain, COST_AWARE_CHAIN), 1)
    key = (id(target), id(drafter), id(pv), batch, choice.context)
    if key not in _COST_AWARE:
        twin = copy.copy(drafter)
        if not pv.shape.costs:  # loaded with pre_verifier="costs": already cost-aware
            twin.pre_verifier = pre_verifier_local.cost_aware(
                pv, target, batch=batch, context=choice.context, verbose=verbose
            )
        _COST_AWARE[key] = (twin, target, drafter, pv)  # holding them keeps their ids unique
    config = dataclasses.replace(choice.config, tree=wide, pre_verify=True)
    return _COST_AWARE[key][0], dataclasses.replace(choice, config=config, widened_from=tree)


def _with_pre_verifier(target, drafter, choice, *, verbose: bool = True):
    """SpecConfig.auto() weighs trees whole. Let the drafter's pre-verifier prune the chosen tree
    when replaying its recorded (greedy) steps under this machine's costs predicts at least
    pre_verifier_local.MIN_GAIN more tokens per second; the predictions are scaled by the
    replay, priced at the costs the choice measured (its context). Returns (choice, the
    replay or None)."""
    prune = pre_verifier_local.pruning_gain(
        target, drafter, choice.config.tree, context=choice.context, verbose=verbose
    )
    if prune is None or prune.gain < pre_verifier_local.MIN_GAIN:
        return choice, prune
    return dataclasses.replace(
        choice,
        config=dataclasses.replace(choice.config, pre_verify=True),
        predicted_tau=choice.predicted_tau * prune.tau_pruned / prune.tau_whole,
        seconds_per_step=choice.seconds_per_step * prune.seconds_pruned / prune.seconds_whole,
    ), prune


def _hispec(target, hispec, prompts, config, verifier, **kwargs):
    """speculative_generate for a HiSpec drafter: it is its own verifier, and drafts chains.
    With SpecConfig.auto() it runs only where it measured faster than plain decoding for this
    call's kind (specjax.hispec_choice; the tree settings of AutoSpecConfig, max_nodes,
    min_speedup, fallback and adapt, choose trees and do not apply); an explicit SpecConfig
    always runs it, with its chain's length as the draft length."""
    if verifier is not None:
        raise ValueError(
            "a HiSpec drafter verifies with its own exits: pass verifier=None (an "
            "EarlyExitVerifier screens the trees of other drafters)"
        )
    if config.rule != "auto":
        raise ValueError(
            f"a HiSpec drafter accepts with its own exact rule at each level (argmax match "
            f"greedy, rejection sampling sampled): leave rule at 'auto', got {config.rule!r}"
        )
    if isinstance(config, SpecConfig) and config.fallback_tau is not None:
        raise ValueError(
            "a HiSpec drafter has no fallback to plain steps: leave fallback_tau at None "
            "(SpecConfig.auto() decodes plainly where HiSpec measured slower)"
        )
    attn_impl = config.attn_impl
    if isinstance(config, SpecConfig):
        if not config.tree.is_chain or config.tree.is_dynamic:
            raise ValueError(
                f"HiSpec drafts chains: give SpecConfig(tree=TreeConfig.chain(k)), got "
                f"{config.tree}"
            )
        hispec = hispec.with_settings(draft_len=config.tree.max_depth)
        return hispec_generate(target, hispec, prompts, attn_impl=attn_impl, **kwargs)
    if not config.allow_autoregressive:
        return hispec_generate(target, hispec, prompts, attn_impl=attn_impl, **kwargs)
    # Checked before the probe compiles anything (the probe decodes these prompts).
    check_sampling(kwargs["sampling"])
    check_eos(kwargs["eos_id"], target.config)
    hispec.check_compatible(target)
    prepare_prompts(prompts, target.config, kwargs["max_new_tokens"], extra_slots=hispec.reserve)
    choice = choose_hispec(target, hispec, prompts, announce=config.verbose, **kwargs)
    if not choice.use_hispec:
        return _autoregressive(target, prompts, choice, attn_impl, **kwargs)
    out = hispec_generate(target, hispec, prompts, attn_impl=attn_impl, **kwargs)
    out.stats.update(choice.stats())
    return out


def _localize_pre_verifier(target, drafter, prompts, config, *, max_new_tokens, sampling, key,
                           eos_id):  # fmt: skip
    """When the drafter's pre-verifier will prune this call's trees with the thresholds it was
    trained with, choose them again under this machine's costs first (specjax.pre_verifier_local;
    once per machine, kept on disk). The call's input is checked before anything is measured."""
    pv = getattr(drafter, "pre_verifier", None)
    if not pre_verifier_local.pending(pv):
        return
    extra = tree_reserve(config.tree.num_nodes, config.tree.max_depth)
    _check_call(target, drafter, prompts, sampling, max_new_tokens, eos_id, extra)
    rule = config.resolved_rule(sampling, drafter.samples_children)
    if pruning_pre_verifier(drafter, config, rule) is not None:
        pre_verifier_local.localize(target, drafter)


def _autoregressive(target, prompts, choice, attn_impl, *, max_new_tokens, sampling, key, eos_id):
    """SpecConfig.auto() predicted no tree faster than plain decoding: decode autoregressively,
    with the speculative stats (one target call per token after the first)."""
    out = generate(
        target, prompts, max_new_tokens=max_new_tokens, sampling=sampling, key=key,
        eos_id=eos_id, attn_impl=attn_impl,
    )  # fmt: skip
    return out.replace(stats={**_plain_stats(out.lengths), **choice.stats()})


@jax.jit
def _plain_stats(lengths: jax.Array) -> dict:
    """The speculative stats of a plain decoding of rows of `lengths` [B] tokens (no
    nonfinite_logits: `generate` does not check its logits). One compiled call: the same ops
    run eagerly cost ~0.35 ms (a stories260K call of 128 tokens is ~13 ms on a 2-core CPU)."""
    calls = jnp.maximum(lengths - 1, 0)
    return {
        "target_calls": calls,
        "accepted_hist": calls[:, None],
        "tau": jnp.ones(calls.shape, jnp.float32),
    }


def _check_call(target, drafter, prompts, sampling, max_new_tokens, eos_id, extra_slots, *,
                key=None, verifier=None):  # fmt: skip
    """The call's input checked before anything is measured or compiled: (the padded prompt ids
    [B, T], each prompt's length [B])."""
    check_sampling(sampling)
    drafter.check_compatible(target)
    if verifier is not None and hasattr(verifier, "check_compatible"):
        verifier.check_compatible(target)
    check_eos(eos_id, target.config)
    ids, lens = prepare_prompts(prompts, target.config, max_new_tokens, extra_slots=extra_slots)
    prepare_keys(key, ids.shape[0])  # one key or one per row
    return ids, lens


def _choose_config(target, drafter, prompts, auto, sampling, max_new_tokens, eos_id, key,
                   verifier):  # fmt: skip
    """Validate what needs no tree, then choose the tree (specjax.choice.resolve_auto).
    Returns (the choice, the padded prompt width)."""
    extra = tree_reserve(1, 1)
    ids, lens = _check_call(target, drafter, prompts, sampling, max_new_tokens, eos_id, extra,
                            key=key, verifier=verifier)  # fmt: skip
    room = target.config.max_seq_len - ids.shape[1] - max_new_tokens - 1
    # Calibration (where the pair has no profile yet) runs on the prompts, not on their padding.
    rows = [row[:n] for row, n in zip(np.asarray(ids), lens, strict=True)]
    # Costs are taken at about the context the call decodes in (specjax.choice.call_context).
    # It depends on the padded prompt width, not on each prompt's length: calls compiled alike
    # share one choice.
    choice = resolve_auto(
        target, drafter, rows, auto=auto, sampling=sampling, eos_id=eos_id, room=room,
        call_context=call_context(target, ids.shape[1], max_new_tokens, auto.attn_impl),
        new_tokens=max_new_tokens,
    )  # fmt: skip
    return choice, ids.shape[1]
