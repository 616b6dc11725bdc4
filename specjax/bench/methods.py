"""What the benchmark runs: the method kinds, `Method` (kind, drafter, tree, rule, display name)
and its command-line spelling `parse_method`, and `resolve_drafter` (where a drafter spec
points)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specjax.config import AutoSpecConfig, SpecConfig, TreeConfig
from specjax.datasets import resolve_path

AR = "ar"  # specjax.generate: the baseline of every speedup
SPEC = "spec"  # specjax.speculative_generate with a drafter and a tree
HF_GENERATE = "hf"  # transformers generate()
HF_ASSISTED = "hf-assisted"  # transformers assisted generation with a draft model
HF_LOOKUP = "hf-pld"  # transformers prompt-lookup decoding
PEER_KINDS = (HF_GENERATE, HF_ASSISTED, HF_LOOKUP)

# Spec-Bench's prompt-lookup setting (num_pred_tokens = 10); transformers' defaults for the
# assistant, set explicitly so that the header states what ran whatever the installed version.
DEFAULT_LOOKUP_TOKENS = 10
HF_ASSISTANT_SETTINGS = dict(
    num_assistant_tokens=20,
    num_assistant_tokens_schedule="constant",
    assistant_confidence_threshold=0.4,
)


def checkpoint_label(path: str) -> str:
    """llama2xs-279K for models/llama2xs-279K/model.bin (the folder names the model), the
    directory's own name for a trained drafter (checkpoints/smollm2-mdc -> smollm2-mdc)."""
    p = Path(path)
    if p.suffix == "":  # a drafter directory, possibly with an ablation switch
        return p.name
    return p.parent.name or p.stem


def resolve_drafter(spec: str) -> str:
    """self:K and lookup[:K] as they are; exit:DIR with DIR found here or in the repository; a
    trained drafter, HiSpec exit-heads or n-gram directory relative to the current directory or
    to the repository (checkpoints/...); else a draft model under the shared models folder."""
    from specjax.drafters.spec import is_feature_drafter, is_hispec, is_ngram, is_text_lookup
    from specjax.paths import repo_dir

    if spec.startswith("self:") or is_text_lookup(spec):
        return spec
    if spec.startswith("exit:"):  # an exit-heads directory, relative to here or to the repo
        path = spec.split(":", 1)[1]
        found = path if Path(path).exists() else str(repo_dir() / path)
        return "exit:" + found
    for candidate in (spec, str(repo_dir() / spec)):
        if is_feature_drafter(candidate) or is_hispec(candidate) or is_ngram(candidate):
            return candidate
    return str(resolve_path(spec, "models"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Method:
    """What runs: kind AR | SPEC | HF_GENERATE | HF_ASSISTED | HF_LOOKUP.

    drafter: for SPEC "self:K" (the target's first K layers) or a draft checkpoint path; for
    HF_ASSISTED the assistant checkpoint (exported to transformers with the same weights).
    tree/rule: SPEC's draft tree and acceptance rule; auto: SPEC with SpecConfig.auto() (the
    tree chosen per call from measured costs; tree is then unused); lookup_tokens: HF_LOOKUP's
    prompt_lookup_num_tokens. exit_heads: SPEC with an exit-heads directory (checkpoints/
    <target>-hispec): its verify exit screens every tree (specjax.verifiers.early_exit; needs
    an explicit tree). label: display name (derived when empty).
    """

    kind: str
    drafter: str | None = None
    tree: TreeConfig | None = None
    rule: str = "auto"
    auto: bool = False
    auto_fallback: bool = True  # auto: may choose plain decoding when no tree is predicted faster
    # auto: the chosen tree may stop within a call whose tokens per call stay below its
    # break-even (SpecConfig.auto(fallback=...), the rest decoded plainly in the same loop)
    auto_stops: bool = True
    # auto: the choice scales the drafter's acceptance profile by what this process's earlier
    # calls measured (AutoSpecConfig.adapt; the runner replays each prompt's shift when timing)
    auto_adapts: bool = True
    lookup_tokens: int = DEFAULT_LOOKUP_TOKENS
    exit_heads: str | None = None
    label: str = ""

    def __post_init__(self):
        if self.kind not in (AR, SPEC, *PEER_KINDS):
            raise ValueError(f"unknown method kind {self.kind!r}")
        if self.kind in (SPEC, HF_ASSISTED) and not self.drafter:
            raise ValueError(f"a {self.kind} method needs a drafter")
        if self.kind == SPEC:
            SpecConfig(tree=self.tree or TreeConfig(), rule=self.rule)  # validates the pair
        if self.exit_heads is not None and (self.kind != SPEC or self.auto):
            raise ValueError("exit_heads needs a SPEC method with an explicit tree")

    def _hispec_buffer(self) -> int | None:
        """The buffer of a HiSpec drafter (None for any other drafter)."""
        settings = _hispec_settings(self.drafter) if self.drafter else None
        return None if settings is None else int(settings["buffer"])

    @property
    def is_peer(self) -> bool:
        return self.kind in PEER_KINDS

    @property
    def config(self) -> SpecConfig | AutoSpecConfig:
        if self.auto:
            return SpecConfig.auto(
                rule=self.rule, allow_autoregressive=self.auto_fallback, fallback=self.auto_stops,
                adapt=self.auto_adapts,
            )  # fmt: skip
        return SpecConfig(tree=self.tree or TreeConfig(), rule=self.rule)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.kind == AR:
            return "specjax autoregressive"
        if self.kind == HF_GENERATE:
            return "HF generate"
        if self.kind == HF_LOOKUP:
            return f"HF prompt lookup ({self.lookup_tokens})"
        if self.kind == HF_ASSISTED:
            return f"HF assisted ({checkpoint_label(self.drafter)})"
        from specjax.drafters.spec import is_text_lookup

        if self.drafter.startswith("self:"):
            who = f"self-draft {self.drafter.split(':', 1)[1]}L"
        elif is_text_lookup(self.drafter):
            who = f"text lookup ({self.drafter.partition(':')[2] or 8})"
        elif self.drafter.startswith("exit:"):
            who = f"draft exit ({checkpoint_label(self.drafter.split(':', 1)[1])})"
        else:
            who = checkpoint_label(self.drafter)
        rule = "" if self.rule == "auto" else f", {self.rule}"
        if self.auto:
            stops = "" if self.auto_stops else "-nostop"
            adapts = "" if self.auto_adapts else "-noadapt"
            return f"{who} auto{'' if self.auto_fallback else '-tree'}{stops}{adapts}{rule}"
        tree = self.config.tree
        via = f" + exit verify ({checkpoint_label(self.exit_heads)})" if self.exit_heads else ""
        if tree.is_chain:
            shape = f"chain {tree.max_depth}"
        elif tree.is_dynamic:
            shape = f"tree {tree.budget}/d{tree.drafter_depth}/top{tree.topk}"
            shape += f" + text {tree.text_chain}" if tree.text_chain else ""
            shape += f" (match {tree.text_min_match}+)" if tree.text_min_match else ""
        else:
            shape = "tree (" + ",".join(map(str, tree.branching)) + ")"
        return f"{who} {shape}{rule}{via}"

    @property
    def draft_nodes(self) -> str:
        """Draft tokens per target call (the tree budget, root excluded). HiSpec's explicit
        chain of k drafts k a round, and a full-target call judges up to buffer + k of them."""
        if self.kind == SPEC and self.auto:
            return "auto"
        if self.kind == SPEC and self._hispec_buffer() is not None:
            k = self.config.tree.max_depth
            return f"{k} a round, <={self._hispec_buffer() + k} a full call"
        if self.kind == SPEC:
            return str(self.config.tree.num_nodes - 1)
        if self.kind == HF_LOOKUP:
            return f"<={self.lookup_tokens}"
        if self.kind == HF_ASSISTED:
            return f"<={HF_ASSISTANT_SETTINGS['num_assistant_tokens']}"
        return "-"


def _hispec_settings(drafter: str) -> dict | None:
    """The settings a HiSpec drafter spec runs with (its hispec.json's, then its switches), or
    None when `drafter` is not HiSpec exit heads."""
    from specjax.drafters.spec import is_hispec, split_drafter_switch
    from specjax.hispec import checkpoint_settings

    path, switches = split_drafter_switch(drafter)
    if not is_hispec(path):
        return None
    return {**checkpoint_settings(path), **switches}


def parse_method(spec: str) -> Method:
    """A method from its command-line spelling:

    ar | hf | hf-pld[:K] | hf-assisted:CHECKPOINT | DRAFTER[@N,DEPTH,TOPK[@RULE]]
    | DRAFTER@auto[@RULE] | DRAFTER@auto-tree[@RULE] (the chosen tree even when plain decoding
    is predicted faster); after either, -nostop (the chosen tree for the whole call, without
    the default's stop below its break-even tau) and/or -noadapt (the acceptance profile as
    calibrated, not scaled by what earlier calls measured): e.g. auto-tree-nostop-noadapt

    DRAFTER is self:K, a draft checkpoint (same vocabulary as the target) or a trained drafter
    directory (checkpoints/...); the tree is `specjax generate --tree`'s N,DEPTH,TOPK (default: a
    chain of 4; for trained drafters a dynamic budget, default 31,6,8, and N,DEPTH,TOPK,TEXT adds
    a text chain of TEXT nodes, N,DEPTH,TOPK,TEXT,MATCH one drafted from matches of MATCH+ tokens
    and verified where drafted); RULE one of SpecConfig's.
    """
    spec = spec.strip()
    if spec == AR:
        return Method(kind=AR)
    if spec == HF_GENERATE:
        return Method(kind=HF_GENERATE)
    if spec == HF_LOOKUP or spec.startswith(HF_LOOKUP + ":"):
        k = spec.split(":", 1)[1] if ":" in spec else DEFAULT_LOOKUP_TOKENS
        return Method(kind=HF_LOOKUP, lookup_tokens=int(k))
    if spec.startswith(HF_ASSISTED + ":"):
        return Method(kind=HF_ASSISTED, drafter=spec.split(":", 1)[1])
    drafter, *rest = spec.split("@")
    if not drafter or len(rest) > 2:
        raise ValueError(f"method {spec!r}: expected DRAFTER[@N,DEPTH,TOPK[@RULE]]")
    rule = rest[1] if len(rest) > 1 else "auto"
    if rest and rest[0].split("-")[0] == "auto":
        first, *switches = rest[0].split("-")
        unknown = set(switches) - {"tree", "nostop", "noadapt"}
        if unknown or len(set(switches)) < len(switches) or "tree" in switches[1:]:
            raise ValueError(
                f"method {spec!r}: expected auto[-tree][-nostop][-noadapt], got {rest[0]!r}"
            )
        return Method(kind=SPEC, drafter=drafter, auto=True, auto_fallback="tree" not in switches,
                      auto_stops="nostop" not in switches, auto_adapts="noadapt" not in switches,
                      rule=rule)  # fmt: skip
    from specjax.drafters.spec import tree_for

    tree = tree_for(resolve_drafter(drafter), rest[0] if rest else None)
    return Method(kind=SPEC, drafter=drafter, tree=tree, rule=rest[1] if len(rest) > 1 else "auto")
