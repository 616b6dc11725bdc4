"""Held-in calibration of acceptance profiles (specjax.acceptance): prompts from the training
side of the data (never MT-bench or the EAGLE question files), and the runs that write a trained
drafter's acceptance.json or a draft-model pair's cached profile.

Acceptance profiles (calibration_prompts): chat targets calibrate on user turns the target
writes itself after its chat template's user header (specjax.train.self_prompts, seed
CALIBRATION_SEED, not a training seed), story targets on the first words of TinyStories training
paragraphs. Why self-written turns: the project's prompt generators are templates the shipped
SmolLM2 drafters were trained on, and on them the eagle's probe tree reached 4.54 tokens per call
against 2.44 on MT-bench first turns; on 16 self-written turns it reached 2.69
(experiments/results/acceptance_by_source_self.md; 2.49 on EAGLE's qa), so the default call's
first choices and predictions start near what users' prompts give instead of far above it.
A drafter trained on self-written turns (answer set smollm2-self, seed 0) is calibrated on turns
of another seed.

held_in_prompts (the broad and task prompt generators, alternating, in the chat template) stays
the source of the pre-verifiers' training labels, which need many prompts of known families.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from specjax.acceptance import (
    PROFILE_FILE,
    TEXT_MIN_MATCH,
    AcceptanceProfile,
    calibrate,
    write_profiles,
)
from specjax.config import SamplingConfig
from specjax.paths import shared_dir

CALIBRATION_SEED = 9173
CHAT_CALIBRATION_TURNS = 16
# Greedy dynamic probes of drafters that add text chains run this long: a chain copies from the
# row's own text, which short answers hardly have (64-token answers put the eagle's best chained
# tree below its best plain one; at 256 tokens on MT-bench the chain added 0.7 tokens a step).
TEXT_CALIBRATION_TOKENS = 256
TEXT_SUMMARY_NODES = 8  # the card's text-chain lines compare trees up to this size
MODES = {"greedy": SamplingConfig(), "sampled": SamplingConfig(temperature=1.0)}


def held_in_prompts(kind: str, tokenizer, n: int = 8) -> tuple[list[list[int]], str]:
    """(token-id prompts, a description) for a "chat" or "story" target."""
    if kind == "chat":
        from specjax.train.broad_prompts import broad_prompts
        from specjax.train.task_prompts import task_prompts

        n_task = n // 2
        broad = broad_prompts(n - n_task, seed=CALIBRATION_SEED)
        tasks = task_prompts(n_task, seed=CALIBRATION_SEED)
        texts = [t for pair in zip(broad, tasks, strict=False) for t in pair] + broad[n_task:]
        prompts = []
        for text in texts:
            chat = tokenizer.apply_chat(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            prompts.append(tokenizer.encode(chat, bos=False))
        return prompts, (
            f"{n - n_task} broad_prompts and {n_task} task_prompts, alternating (seed "
            f"{CALIBRATION_SEED}), chat template"
        )
    if kind == "story":
        text = (shared_dir() / "data" / "tinystories_train_head.txt").read_text()
        paras = [p.strip() for p in text.split("\n\n") if p.strip()][-n:]
        prompts = [tokenizer.encode(" ".join(p.split()[:8]), bos=True) for p in paras]
        return prompts, f"first 8 words of the last {n} paragraphs of tinystories_train_head.txt"
    raise ValueError(f"calibration prompts are for 'chat' or 'story' targets, got {kind!r}")


def calibration_prompts(kind: str, model, tokenizer, n: int | None = None):
    """(token-id prompts, a description) the acceptance profiles are measured on: for "chat",
    n (default CHAT_CALIBRATION_TURNS) user turns `model` writes itself (seed CALIBRATION_SEED;
    about a minute for SmolLM2 on 2 CPU cores); for "story", held_in_prompts'."""
    if kind != "chat":
        return held_in_prompts(kind, tokenizer, n or 8)
    import tempfile

    from specjax.datasets import encode_question
    from specjax.train.self_prompts import write_user_turns

    n = n or CHAT_CALIBRATION_TURNS
    with tempfile.TemporaryDirectory() as tmp:
        turns = write_user_turns(model, tokenizer, Path(tmp) / "turns.json", n,
                                 seed=CALIBRATION_SEED, batch=n)  # fmt: skip
    return [encode_question(tokenizer, t) for t in turns], (
        f"{n} user turns the target wrote itself (specjax.train.self_prompts, seed "
        f"{CALIBRATION_SEED}), chat template"
    )


def calibrate_drafter(
    target,
    drafter,
    prompts,
    *,
    description: str,
    modes=tuple(MODES),
    max_new_tokens: int = 64,
    eos_id: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[AcceptanceProfile]:
    """Every probe of the drafter (specjax.choice.probes_for) in every mode: max_new_tokens a
    prompt, TEXT_CALIBRATION_TOKENS for the greedy dynamic probes of a drafter with text
    chains."""
    from specjax.choice import probes_for

    profiles = []
    chains = getattr(drafter, "text_chains", False)
    for mode in modes:
        for probe in probes_for(drafter):
            with_text = mode == "greedy" and probe.is_dynamic and chains
            tokens = max(max_new_tokens, TEXT_CALIBRATION_TOKENS) if with_text else max_new_tokens
            if progress is not None:
                progress(f"calibrating {mode}, probe {probe}, {tokens} new tokens a prompt")
            profiles.append(
                calibrate(
                    target,
                    drafter,
                    prompts,
                    probe=probe,
                    sampling=MODES[mode],
                    max_new_tokens=tokens,
                    eos_id=eos_id,
                    description=description,
                )  # fmt: skip
            )
    return profiles


def write_checkpoint_profiles(folder, profiles) -> None:
    """A trained drafter's profiles next to its weights (read by load_drafter's drafter), and
    their summary in its CARD.md."""
    write_profiles(Path(folder) / PROFILE_FILE, profiles)
    update_card(Path(folder), card_section(profiles))


def card_section(profiles) -> str:
    """The CARD.md lines: per mode and probe, measured tau and acceptance by depth / rank."""
    lines = [
        "## Acceptance profile (acceptance.json)",
        "",
        "Measured by `python experiments/calibrate_drafters.py` on held-in prompts "
        f"({profiles[0].prompts}); SpecConfig.auto() predicts tau for every tree from it. "
        "Depth d: P(a child at depth d is accepted | its parent was). Rank r: P(the rank-r "
        "child is accepted | its parent was), over depths.",
        *_text_lines([p for p in profiles if p.text_chains]),
        "",
        "| mode | probe | row-steps | tau of the probe | by depth 1..8 | by sibling rank 0..3 |",
        "|---|---|---|---|---|---|",
    ]
    for p in profiles:
        by_depth = " ".join(f"{x:.2f}" for x in p.depth_accept())
        ranks = []
        for r in range(min(4, p.topk)):
            acc = sum(row[r] * cnt[r] for row, cnt in zip(p.rank_accept, p.rank_count, strict=True)
                      if r < len(row))  # fmt: skip
            cnt = sum(c[r] for c in p.rank_count if r < len(c))
            ranks.append(f"{acc / max(cnt, 1):.2f}")
        probe = ",".join(map(str, p.probe))
        lines.append(
            f"| {p.mode} | {p.kind} ({probe}) | {p.steps} | {p.measured_tau:.2f} | {by_depth} "
            f"| {' '.join(ranks)} |"
        )
    return "\n".join(lines) + "\n"


def _text_lines(profiles) -> list[str]:
    """The CARD.md lines on the text chains of greedy dynamic profiles: what they hold, and the
    best tree of at most TEXT_SUMMARY_NODES nodes without and with a chain, by answer length."""
    if not profiles:
        return []
    from specjax.choice import candidate_trees, tree_label

    lines = [
        "",
        "Greedy dynamic profiles (answers of up to "
        f"{max(n for p in profiles for n in p.text_lengths)} tokens) also hold trees with a text "
        f"chain of {', '.join(map(str, profiles[0].text_chains))} nodes (text_table): the "
        "replayed chain's tokens against the target's, every step, also kept by answer length. "
        f"Best predicted tau with at most {TEXT_SUMMARY_NODES} nodes:",
        "",
        "| probe | answer tokens | best tree | tau | best tree with a text chain | tau |",
        "|---|---|---|---|---|---|",
    ]
    for p in profiles:
        for n in p.text_lengths:
            at = p.at_answer_length(n)
            trees = list(candidate_trees(at, TEXT_SUMMARY_NODES))
            plain = max((t for t in trees if not t.text_chain), key=at.predict_tau)
            chained = max((t for t in trees if t.text_chain), key=at.predict_tau)
            lines.append(
                f"| {','.join(map(str, p.probe))} | {n} | {tree_label(plain)} | "
                f"{at.predict_tau(plain):.2f} | {tree_label(chained)} | "
                f"{at.predict_tau(chained):.2f} |"
            )
    for p in profiles:
        if p.matched_drafted and p.text_drafted:
            lines.append(
                f"\nProbe {','.join(map(str, p.probe))}: the chain drafts nothing on "
                f"{p.text_drafted[0]:.0%} of steps from any match and on "
                f"{p.matched_drafted[0]:.0%} from matches of {TEXT_MIN_MATCH}+ tokens "
                "(matched_table: such chains, verified where drafted)."
            )
    return lines


def update_card(
    folder: Path, section: str, *, heading: str = "Acceptance profile (acceptance.json)"
) -> None:
    """Replace (or add) the section `## heading` of folder/CARD.md."""
    card = folder / "CARD.md"
    text = card.read_text() if card.exists() else f"# {folder.name}\n"
    text = re.sub(rf"\n## {re.escape(heading)}\n.*?(?=\n## |\Z)", "", text, flags=re.S)
    card.write_text(text.rstrip("\n") + "\n\n" + section)


def ensure_pair_profiles(target, drafter, prompts_for, *, eos_id=None) -> None:
    """Calibrate a drafter without a checkpoint profile on held-in prompts unless its pair
    profile is already cached with probes spanning the default ones (so SpecConfig.auto() never
    calibrates on evaluation prompts). prompts_for: a function of no arguments giving (prompts,
    description), called only when a profile is missing (writing self-written turns costs about
    a minute)."""
    from specjax.acceptance import read_profiles
    from specjax.choice import pair_profile_file, probes_for, probes_span

    if getattr(drafter, "checkpoint_dir", None) is not None:
        return
    for mode in MODES:
        path = pair_profile_file(target, drafter, mode)
        if not probes_span(read_profiles(path), probes_for(drafter)):
            prompts, description = prompts_for()
            write_profiles(path, calibrate_drafter(
                target, drafter, prompts, description=description, modes=(mode,), eos_id=eos_id,
            ))  # fmt: skip
