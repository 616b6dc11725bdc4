"""Drafters named by a string, as the CLI and the benchmark take them, and the tree each gets.

"self:K" self-drafts with the target's first K layers; "lookup" / "lookup:K" drafts from the
row's own text alone (prompt-lookup decoding: matches of up to K tokens, default 8; static
trees, nothing to load); "exit:DIR" self-drafts with the draft
exit of an exit-heads directory (checkpoints/<target>-hispec); a path to a checkpoint is a draft
model sharing the target's vocabulary; a directory with ngram.json holds n-gram tables (static
trees, like a draft model's); a directory with drafter.json is a trained feature drafter,
optionally with an ablation switch: "DIR:noreuse", "DIR:freshN", "DIR:nopv" (without its
trained pre-verifier); a directory with hispec.json is HiSpec's three-level drafter ("DIR:bufferN"
sets its buffer).
"""

from __future__ import annotations

from pathlib import Path

from specjax.config import TreeConfig
from specjax.drafters.lm import LMDrafter
from specjax.drafters.loading import load_drafter
from specjax.io import load
from specjax.train.checkpoint import read_header


def parse_tree(spec: str | None, default_depth: int = 4):
    """--tree "N,DEPTH,TOPK" -> TreeConfig: TOPK children at the root and at every level while the
    number of draft nodes (root excluded) stays within N, then single children down to DEPTH (a
    chain when TOPK = 1)."""
    if spec is None:
        return TreeConfig.chain(default_depth)
    try:
        budget, depth, topk = (int(x) for x in spec.split(","))
    except ValueError:
        raise ValueError(f"--tree expects N,DEPTH,TOPK (three ints), got {spec!r}") from None
    if min(budget, depth, topk) < 1:
        raise ValueError(f"--tree values must be >= 1, got {spec!r}")
    branching = []
    for d in range(depth):
        # TOPK here only where the single children still to come below it fit too; after the
        # first single-child level, single children down to DEPTH.
        wide = TreeConfig(branching=(*branching, topk) + (1,) * (depth - d - 1))
        narrowed = bool(branching) and branching[-1] == 1
        branching.append(topk if wide.num_nodes - 1 <= budget and not narrowed else 1)
    tree = TreeConfig(branching=tuple(branching))
    if tree.num_nodes - 1 > budget:
        raise ValueError(
            f"--tree {spec}: a chain of depth {depth} alone needs {tree.num_nodes - 1} nodes "
            f"(> budget {budget}): raise N or lower DEPTH"
        )
    return tree


def is_feature_drafter(spec: str) -> bool:
    """Whether --drafter names a trained feature drafter (a directory with drafter.json)."""
    return (Path(split_drafter_switch(spec)[0]) / "drafter.json").exists()


def is_ngram(spec: str) -> bool:
    """Whether --drafter names n-gram tables (a directory with ngram.json)."""
    from specjax.drafters.ngram import is_ngram_dir

    return is_ngram_dir(split_drafter_switch(spec)[0])


def is_text_lookup(spec: str) -> bool:
    """Whether --drafter names the text-only lookup ("lookup" or "lookup:K"; a directory of
    that name in the working directory is a directory instead)."""
    named = spec == "lookup" or spec.startswith("lookup:")
    return named and not Path(spec.split(":", 1)[0]).is_dir()


def is_hispec(spec: str) -> bool:
    """Whether --drafter names HiSpec exit heads (a directory with hispec.json)."""
    return (Path(split_drafter_switch(spec)[0]) / "hispec.json").exists()


def _switch(word: str) -> dict | None:
    """One ablation switch word as load settings, or None when `word` is not one."""
    if word == "noreuse":
        return {"reuse": False}
    if word == "nopv":
        return {"pre_verifier": False}
    if word == "pvcost":
        return {"pre_verifier": "costs"}
    if word == "stale":
        return {"stale_logits": True}
    if word.startswith("buffer") and word[6:].isdigit():
        return {"buffer": int(word[6:])}
    if word.startswith("fresh") and word[5:].isdigit():
        return {"fresh_slots": int(word[5:])}
    return None


def split_drafter_switch(spec: str) -> tuple[str, dict]:
    """Ablation switches of a trained hidden-state drafter, spelled DIR:SWITCH[:SWITCH...]:
    "DIR:noreuse" -> (DIR, {"reuse": False}); "DIR:fresh2" -> (DIR, {"fresh_slots": 2});
    "DIR:nopv" -> (DIR, {"pre_verifier": False}); "DIR:pvcost" -> (DIR, {"pre_verifier":
    "costs"}); "DIR:stale" -> (DIR, {"stale_logits": True});
    for HiSpec exit heads "DIR:buffer4" -> (DIR, {"buffer": 4}). Several combine
    ("DIR:noreuse:nopv"); naming one twice is a ValueError."""
    switches: dict = {}
    while True:
        head, _, word = spec.rpartition(":")
        found = _switch(word) if head else None
        if found is None:
            return spec, switches
        if found.keys() & switches.keys():
            raise ValueError(f"drafter switch {word!r} given twice in {spec}:...")
        switches.update(found)
        spec = head


def make_drafter(spec: str, target_loaded):
    """--drafter PATH (a draft model sharing the target's vocabulary, or a trained feature drafter
    directory from `specjax train-drafter`, optionally DIR:noreuse / DIR:freshN) or self:K."""
    if spec.startswith("self:"):
        return LMDrafter.self_draft(int(spec.split(":", 1)[1]))
    if is_text_lookup(spec):
        from specjax.drafters.ngram import NgramDrafter

        if target_loaded is None:
            raise ValueError(f"{spec}: the text lookup needs its target's vocabulary")
        longest = spec.split(":", 1)[1] if ":" in spec else "8"
        if not longest.isdigit() or int(longest) < 1:
            raise ValueError(f"{spec}: expected lookup or lookup:K with K >= 1 tokens")
        return NgramDrafter.text_only(target_loaded.model.config.vocab_size, int(longest))
    if spec.startswith("exit:"):
        from specjax.train.exit_heads import load_exit_heads

        if target_loaded is None:
            raise ValueError(f"{spec}: an exit drafter needs its target to load")
        heads = load_exit_heads(spec.split(":", 1)[1], target_loaded.model)
        return LMDrafter.self_draft_exit(heads["draft"], target_loaded.model)
    path, switches = split_drafter_switch(spec)
    if is_hispec(path):
        from specjax.hispec import HiSpec

        _check_switches(spec, switches, "HiSpec exit heads", ("buffer",))
        if target_loaded is None:
            raise ValueError(f"{spec}: HiSpec exit heads need their target to load")
        return HiSpec.from_checkpoint(path, target_loaded.model, **switches)
    if is_feature_drafter(path) or is_ngram(path):
        if is_ngram(path):
            _check_switches(spec, switches, "an n-gram drafter", ("pre_verifier",))
        elif read_header(path).get("kind") == "mdc":
            allowed = ("reuse", "fresh_slots", "stale_logits", "pre_verifier")
            _check_switches(spec, switches, "an mdc drafter", allowed)
        else:
            _check_switches(spec, switches, "an eagle drafter", ("pre_verifier",))
        if target_loaded is None:
            raise ValueError(f"{spec}: a trained drafter needs its target to load")
        return load_drafter(path, target_loaded.model, **switches)
    return LMDrafter(load(spec).model)


# The switch words of each setting (_switch), for the error naming what a drafter takes.
_SWITCH_WORDS = {"reuse": "noreuse", "pre_verifier": "nopv, pvcost", "stale_logits": "stale",
                 "buffer": "bufferN", "fresh_slots": "freshN"}  # fmt: skip


def _check_switches(spec: str, switches: dict, what: str, allowed: tuple[str, ...]) -> None:
    """ValueError when a DIR:SWITCH names a setting `what` does not have (it would be ignored,
    or fail deep in the loader)."""
    wrong = sorted(_SWITCH_WORDS[k] for k in switches if k not in allowed)
    if wrong:
        takes = ", ".join(_SWITCH_WORDS[k] for k in allowed)
        raise ValueError(f"{spec}: {what} has no switch {', '.join(wrong)} (it takes {takes})")


def tree_for(drafter_spec: str | None, tree_spec: str | None):
    """The TreeConfig for a drafter: feature drafters read --tree N,DEPTH,TOPK as a dynamic
    budget (default 31 nodes, depth 6, top-8), N,DEPTH,TOPK,TEXT with a text chain of TEXT
    nodes (TreeConfig.text_chain), N,DEPTH,TOPK,TEXT,MATCH with the chain drafted from matches
    of MATCH+ tokens and verified where drafted (TreeConfig.text_min_match); draft models build
    the static tree of parse_tree."""
    if drafter_spec and is_feature_drafter(drafter_spec):
        if tree_spec is None:
            return TreeConfig.dynamic(31, 6, 8)
        try:
            nodes, depth, topk, *text = (int(x) for x in tree_spec.split(","))
            if len(text) > 2:
                raise ValueError
        except ValueError:
            raise ValueError(
                "--tree expects N,DEPTH,TOPK, N,DEPTH,TOPK,TEXT or N,DEPTH,TOPK,TEXT,MATCH (ints), "
                f"got {tree_spec!r}"
            ) from None
        return TreeConfig.dynamic(nodes, depth, topk).with_text_chain(*(text or [0]))
    return parse_tree(tree_spec)
