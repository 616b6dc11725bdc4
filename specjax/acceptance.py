"""Acceptance model: how many tokens a drafter gets accepted per step, for any tree shape within
a probe tree, measured by one calibration run with the probe.

Axis letters: N tree nodes (root included), D depth, P path slots (D + 1).

Static trees (draft models, self-drafting; Sequoia's positional model). Every node at depth
d - 1 gets b_d children, ranked (top-k order, or sampling order for sampled children). The run
records, for every child whose parent was accepted, its depth d and rank r and whether it was
accepted: p[d][r] = P(rank-r child accepted | parent accepted). At most one child of a node is
accepted, so a node with b_d children passes on with a_d = sum_{r < b_d} p[d][r], and a tree
with branching (b_1, ..., b_D) accepts E = sum_k prod_{d <= k} a_d draft tokens per step.

Dynamic trees (feature drafters, EAGLE-2's expansion). For a fixed depth and top-k the
expansion does not depend on the node budget: the budget only keeps the best-scoring nodes
(cumulative draft log-probability), and the kept set is closed under parents. So one run with
a large budget gives, per step, the accepted path's score ranks, and hence how many tokens
every smaller budget (and every smaller depth, ranking only the nodes that deep) would have
accepted in that step: tau_table[d - 1][n - 1] = mean tokens per step with depth <= d and n
nodes. Exact for greedy decoding step by step (the smaller tree's accepted path is the longest
prefix of the probe's that it holds); under sampling an approximation.

Text chains (TreeConfig.text_chain, feature drafters, greedy). A chain drafted from the row's
own text depends only on the text, so at every recorded step of the probe run the chain prompt
lookup would have drafted is replayed on the host against the tokens the target went on to
write: text_table[i][d - 1][n - 1] = mean tokens per step of the dynamic tree (n, d) with a chain
of text_chains[i] nodes, the step keeping the longer of its tree's path and the chain's accepted
run (the chain's run ends where the row's output does). Exact step by step for greedy
decoding, like tau_table. The text adds more the longer a row's own text gets, so the same
tables are also kept by answer length: text_by_length[j] holds, for answers of text_lengths[j]
tokens, tau_table plus what a chain added at the steps that began before that many tokens were
written. A call picks the one for its max_new_tokens (at_answer_length). Chains drafted only from
matches of TEXT_MIN_MATCH+ tokens and verified where drafted (TreeConfig.text_min_match) accept
the chain's prefix drafted from such matches: matched_table, the same replay over every
recorded step (at an answer length, its gain over the tree scales as the any-match chain's
gain there does: at_answer_length). What such a tree costs depends on how many chain nodes a
step drafts: text_drafted / matched_drafted are the shares of steps whose chain (any match /
TEXT_MIN_MATCH+) drafted 0, 1, ... max(text_chains) nodes, from which verify_buckets gives the
share of steps verified on each of the tree's static node counts.

Both are written as JSON: a feature drafter's next to its checkpoint (acceptance.json, from
held-in prompts at training time: experiments/calibrate_drafters.py), other pairs in the cost
cache (specjax.autotune).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specjax.config import SamplingConfig, SpecConfig, TreeConfig

FORMAT_VERSION = 1
PROFILE_FILE = "acceptance.json"
# Text chain lengths a greedy dynamic profile measures (SpecConfig.auto() weighs each).
TEXT_CHAINS = (2, 4, 8, 12)
# Answer lengths (new tokens) a greedy dynamic profile keeps text tables for (those the
# calibration reaches).
TEXT_LENGTHS = (64, 128, 256, 512)
# The shortest match a chain verified where drafted is drafted from, when the default weighs such
# chains: shorter matches predict the next token 21% (1 token) and 53% (2) of the time on
# SmolLM2's held-in answers, and every drafted node is verified. Measured on MT-bench, eagle
# dynamic(7,4,4) + 8 (NOTES.md, "Fifty-third session"): 2.04x from 3+ tokens, 2.02x from 2+.
TEXT_MIN_MATCH = 3


def mode_of(sampling: SamplingConfig) -> str:
    """Profiles are kept for greedy decoding and for sampling (measured at temperature 1)."""
    return "greedy" if sampling.greedy else "sampled"


@dataclasses.dataclass(frozen=True)
class AcceptanceProfile:
    """What a calibration run with the probe tree measured (see the module docstring).

    kind: "static" | "dynamic"; mode: "greedy" | "sampled"; probe: the probe's branching
    (static) or (budget, depth, topk) (dynamic); steps: row-steps recorded; measured_tau: the
    probe's own tokens per step; rank_accept[d - 1][r], rank_count[d - 1][r]: acceptance and
    number of children of rank r at depth d whose parent was accepted (for dynamic trees the
    rank among siblings by draft probability); tau_table: dynamic only (module docstring);
    prompts: what the calibration prompts were; shift: the acceptance shift applied to the
    measured profile (scaled()), 1.0 as measured; text_chains, text_table: dynamic greedy
    profiles of drafters that add text chains (module docstring), else empty; text_lengths,
    text_by_length: the text tables by answer length (module docstring); text_length: the
    answer length text_table stands for (at_answer_length), 0 for every recorded step;
    matched_table, text_drafted, matched_drafted: chains from TEXT_MIN_MATCH+ token matches and
    the drafted counts (module docstring), empty in profiles written before them.
    """

    kind: str
    mode: str
    probe: tuple[int, ...]
    steps: int
    measured_tau: float
    rank_accept: tuple[tuple[float, ...], ...]
    rank_count: tuple[tuple[int, ...], ...]
    tau_table: tuple[tuple[float, ...], ...] = ()
    prompts: str = ""
    shift: float = 1.0  # see scaled(); 1.0 for a profile as measured
    text_chains: tuple[int, ...] = ()
    text_table: tuple[tuple[tuple[float, ...], ...], ...] = ()
    text_lengths: tuple[int, ...] = ()
    text_by_length: tuple[tuple[tuple[tuple[float, ...], ...], ...], ...] = ()
    text_length: int = 0
    matched_table: tuple[tuple[tuple[float, ...], ...], ...] = ()
    text_drafted: tuple[float, ...] = ()
    matched_drafted: tuple[float, ...] = ()

    @property
    def depth(self) -> int:
        return self.probe[1] if self.kind == "dynamic" else len(self.probe)

    @property
    def topk(self) -> int:
        return self.probe[2] if self.kind == "dynamic" else max(self.probe)

    def depth_accept(self) -> list[float]:
        """P(some child at depth d accepted | parent accepted), d = 1..D, over the probe."""
        out = []
        for acc, cnt in zip(self.rank_accept, self.rank_count, strict=True):
            parents = cnt[0] if cnt else 0
            out.append(sum(a * c for a, c in zip(acc, cnt, strict=True)) / max(parents, 1))
        return out

    def covers(self, tree: TreeConfig) -> bool:
        """Whether the profile predicts this tree (it lies within the probe, and a text chain's
        length was measured). text_table replays chains drafted from any match, which a chain
        verified where drafted from any match (text_min_match 1) also accepts; matched_table
        covers text_min_match = TEXT_MIN_MATCH; other minimum matches are not covered."""
        if tree.text_chain:
            if tree.text_min_match <= 1:
                table = self.text_table
            else:
                table = self.matched_table if tree.text_min_match == TEXT_MIN_MATCH else ()
            return (
                bool(table)
                and tree.text_chain in self.text_chains
                and self.covers(tree.with_text_chain(0))
            )
        if self.kind == "dynamic":
            return (
                tree.is_dynamic
                and tree.topk == self.topk
                and tree.max_depth <= self.depth
                and tree.num_nodes <= len(self.tau_table[0])
            )
        return (
            not tree.is_dynamic
            and tree.max_depth <= len(self.probe)
            and all(b <= pb for b, pb in zip(tree.branching, self.probe, strict=False))
        )

    def predict_tau(self, tree: TreeConfig) -> float:
        """Expected tokens per step (accepted + 1) with `tree`; ValueError outside the probe."""
        if not self.covers(tree):
            raise ValueError(f"tree {tree} lies outside this profile's probe {self.probe}")
        if tree.text_chain:
            tables = self.matched_table if tree.text_min_match > 1 else self.text_table
            table = tables[self.text_chains.index(tree.text_chain)]
            return table[tree.drafter_depth - 1][tree.drafter_nodes - 1]
        if self.kind == "dynamic":
            return self.tau_table[tree.max_depth - 1][tree.num_nodes - 1]
        expected, reach = 1.0, 1.0
        for d, b in enumerate(tree.branching):
            reach *= min(sum(self.rank_accept[d][:b]), 1.0)
            expected += reach
        return expected

    def scaled_tau(self, tree: TreeConfig, shift: float) -> float:
        """self.scaled(shift).predict_tau(tree), the same float, computed for this one tree:
        specjax.adaptation weighs a few trees at dozens of shifts per call, and scaling the
        whole profile each time cost ~70 ms a call."""
        if shift == 1.0 or not self.covers(tree):
            return self.scaled(shift).predict_tau(tree)
        if tree.text_chain:
            base = tree.with_text_chain(0)
            gain = self.predict_tau(tree) - self.predict_tau(base)
            return float(_chained_tau(self.scaled_tau(base, shift), gain, shift, tree.max_depth))
        if self.kind == "dynamic":
            col, below, total = tree.num_nodes - 1, 1.0, 1.0
            for k, row in enumerate(self.tau_table[: tree.max_depth], start=1):
                total = total + (float(row[col]) - below) * shift**k
                below = float(row[col])
            return float(min(max(total, 1.0), tree.max_depth + 1.0))
        expected, reach = 1.0, 1.0
        for d, b in enumerate(tree.branching):
            reach *= min(sum(min(a * shift, 1.0) for a in self.rank_accept[d][:b]), 1.0)
            expected += reach
        return expected

    def at_answer_length(self, new_tokens: int) -> AcceptanceProfile:
        """This profile with the text tables of the longest measured answer length up to
        new_tokens (the shortest measured one below it: the text's gain there is overstated,
        and a call that short has little own text to copy); itself without such tables. Call
        it before scaled(): text_by_length holds the tables as measured, and a scaled profile's
        would undo its shift (ValueError)."""
        if not self.text_lengths:
            return self
        if self.shift != 1.0:
            raise ValueError("at_answer_length() on a scaled profile: call it before scaled()")
        j = max([i for i, n in enumerate(self.text_lengths) if n <= new_tokens], default=0)
        at_length = self.text_by_length[j]
        matched = self.matched_table
        if matched:
            # Chains from TEXT_MIN_MATCH+ matches are replayed over every step, not by length:
            # their gain over the tree is scaled by what the any-match chain's gain is at this
            # length over its gain at every step.
            plain = np.asarray(self.tau_table, np.float64)
            matched = tuple(
                _as_table(plain + (np.asarray(m) - plain) * _gain_ratio(plain, every, length))
                for m, every, length in zip(matched, self.text_table, at_length, strict=True)
            )
        return dataclasses.replace(
            self, text_table=at_length, text_length=self.text_lengths[j], matched_table=matched
        )

    def verify_buckets(self, tree: TreeConfig, batch: int = 1) -> list[tuple[int, float]]:
        """[(node count, share of steps)] a tree verified where drafted (text_min_match >= 1)
        runs on (TreeConfig.text_buckets): a step runs the smallest count that holds the batch's
        most drafted chain, each of `batch` rows drafting independently as calibration measured.
        Other trees: [(num_nodes, 1.0)]."""
        drafted = self.matched_drafted if tree.text_min_match > 1 else self.text_drafted
        if not tree.text_min_match or not sum(drafted) > 0:
            return [(tree.num_nodes, 1.0)]
        share = np.asarray(drafted, np.float64)
        # A chain of k drafts min(j, k) of the j nodes the longest replayed chain drafted.
        per_row = np.bincount(np.minimum(np.arange(len(share)), tree.text_chain), share,
                              tree.text_chain + 1)  # fmt: skip
        below = np.cumsum(per_row) ** max(batch, 1)  # P(batch's most drafted <= j)
        out, before = [], 0.0
        for n in tree.text_buckets:
            j = min(n - tree.drafter_nodes, tree.text_chain)
            out.append((n, float(below[j] - before)))
            before = float(below[j])
        return out

    def scaled(self, shift: float) -> AcceptanceProfile:
        """This profile for prompts on which every depth's acceptance (given the parent's) is
        `shift` times what calibration measured, so P(at least k draft tokens accepted) scales by
        shift^k. Static trees: each rank's acceptance scales (capped at 1). Dynamic trees: the
        table's per-depth increments tau[k][n] - tau[k - 1][n] (what the k-th level adds with n
        nodes) scale by shift^k, and tau stays within [1, depth + 1]. Used by
        specjax.adaptation, which learns the shift from the calls a process made."""
        if shift <= 0:
            raise ValueError(f"shift must be > 0, got {shift}")
        if shift == 1.0:
            return self
        ranks = tuple(tuple(min(a * shift, 1.0) for a in row) for row in self.rank_accept)
        table, text_table = self.tau_table, self.text_table
        if self.kind == "dynamic":
            below = np.ones(len(table[0]))
            scaled, rows = below.copy(), []
            for k, row in enumerate(np.asarray(table, np.float64), start=1):
                scaled = scaled + (row - below) * shift**k
                rows.append(tuple(float(x) for x in np.clip(scaled, 1.0, k + 1.0)))
                below = row
            plain, moved = np.asarray(table, np.float64), np.asarray(rows)

            def chained(tables):
                return tuple(
                    tuple(
                        tuple(
                            float(x) for x in _chained_tau(moved_row, row - plain_row, shift, d, k)
                        )
                        for d, (row, plain_row, moved_row) in enumerate(
                            zip(np.asarray(t, np.float64), plain, moved, strict=True), start=1
                        )
                    )
                    for k, t in zip(self.text_chains, tables, strict=True)
                )

            text_table, matched_table = chained(self.text_table), chained(self.matched_table)
            table = tuple(rows)
        else:
            matched_table = self.matched_table
        return dataclasses.replace(
            self, rank_accept=ranks, tau_table=table, text_table=text_table,
            matched_table=matched_table, shift=self.shift * shift,
        )  # fmt: skip

    def to_json(self) -> dict:
        return {"version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: dict) -> AcceptanceProfile:
        fields = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in fields}
        for name in ("rank_accept", "rank_count", "tau_table"):
            kw[name] = tuple(tuple(row) for row in kw.get(name, ()))
        kw["probe"] = tuple(kw["probe"])
        kw["text_chains"] = tuple(kw.get("text_chains", ()))
        kw["text_table"] = tuple(tuple(tuple(row) for row in t) for t in kw.get("text_table", ()))
        kw["text_lengths"] = tuple(kw.get("text_lengths", ()))
        kw["matched_table"] = tuple(
            tuple(tuple(row) for row in t) for t in kw.get("matched_table", ())
        )
        kw["text_drafted"] = tuple(kw.get("text_drafted", ()))
        kw["matched_drafted"] = tuple(kw.get("matched_drafted", ()))
        kw["text_by_length"] = tuple(
            tuple(tuple(tuple(row) for row in t) for t in tables)
            for tables in kw.get("text_by_length", ())
        )
        return cls(**kw)


def _gain_ratio(plain: np.ndarray, every, at_length) -> float:
    """What a chain adds over the plain table at one answer length, over what it adds at every
    step (1.0 where it adds nothing at every step)."""
    total = float(np.sum(np.asarray(every) - plain))
    return float(np.sum(np.asarray(at_length) - plain)) / total if total > 0 else 1.0


def _as_table(rows: np.ndarray) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(round(float(x), 5) for x in row) for row in rows)


def _chained_tau(base_tau, gain, shift: float, depth: int, chain: int = 0):
    """tau of a tree with a text chain under an acceptance shift: its drafter tree's scaled tau
    (base_tau) plus what the chain added over that tree at calibration (gain), scaled by the
    same factor, within [1, max(depth, chain) + 1] (depth: the tree's own, or its whole depth
    with chain 0). Why the gain moves too: a call's stats do not say which branch its tokens came
    from, so one factor explains them; were the chain's part fixed, prompts with nothing to copy
    could only be explained by a collapsing drafter part while the chain kept its calibrated
    gain (a bench saw the shift fall to 0.1 with a chained tree still predicted at tau 3)."""
    return np.clip(base_tau + gain * shift, 1.0, max(depth, chain) + 1.0)


def write_profiles(path: str | Path, profiles: Sequence[AcceptanceProfile]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": FORMAT_VERSION, "profiles": [p.to_json() for p in profiles]}
    path.write_text(json.dumps(data, indent=1) + "\n")


def read_profiles(path: str | Path) -> list[AcceptanceProfile]:
    """Profiles from a JSON file; [] when it is missing. A damaged file raises ValueError."""
    path = Path(path)
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
        return [AcceptanceProfile.from_json(p) for p in data["profiles"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: unreadable acceptance profile ({e}); delete it, or rerun "
            "experiments/calibrate_drafters.py"
        ) from None


# -- recording -------------------------------------------------------------------------------


def _node_scores(parents: np.ndarray, probs: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Cumulative draft log-probability of every node [N] (root 0, invalid -inf); parents precede
    children."""
    score = np.full(parents.shape, -np.inf)
    score[0] = 0.0
    for i in range(1, len(parents)):
        if valid[i]:
            score[i] = score[parents[i]] + math.log(max(float(probs[i]), 1e-30))
    return score


def _sibling_ranks(parents: np.ndarray, order_key: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Rank of every node among its siblings by descending order_key (ties: lower index)."""
    rank = np.zeros(parents.shape, np.int64)
    for p in np.unique(parents[1:][valid[1:]]):
        kids = [i for i in range(1, len(parents)) if valid[i] and parents[i] == p]
        kids.sort(key=lambda i: (-order_key[i], i))
        for r, i in enumerate(kids):
            rank[i] = r
    return rank


class ProfileRecorder:
    """Accumulates the steps of a calibration run with the probe tree into a profile.
    text_chains: chain lengths to measure (dynamic probes): every step's table row is kept
    until add_text gives what a chain from the row's text accepted there; text_lengths: answer
    lengths to keep the text tables for (add_text's `emitted` places each step)."""

    def __init__(
        self,
        probe: TreeConfig,
        mode: str,
        text_chains: Sequence[int] = (),
        text_lengths: Sequence[int] = (),
    ):
        if text_chains and not probe.is_dynamic:
            raise ValueError("text chains are measured with a dynamic probe")
        if probe.text_chain:
            raise ValueError("a probe tree has no text chain of its own (chains are replayed)")
        self.probe = probe
        self.mode = mode
        self.text_chains = tuple(sorted(text_chains))
        self.step_rows: list[np.ndarray] = []  # [depth, N] per step, kept for text chains
        self.text_sum = np.zeros((len(self.text_chains), probe.max_depth, probe.num_nodes))
        self.text_lengths = tuple(sorted(text_lengths)) if self.text_chains else ()
        # What the chains added [length, chain, depth, N] at the steps before each length.
        self.gain_sum = np.zeros((len(self.text_lengths), *self.text_sum.shape))
        self.gain_steps = np.zeros(len(self.text_lengths), np.int64)
        # Chains from TEXT_MIN_MATCH+ token matches, and how many nodes each chain drafted
        # (any match / TEXT_MIN_MATCH+), j = 0 .. max(text_chains).
        self.matched_sum = np.zeros_like(self.text_sum)
        longest = max(self.text_chains, default=0)
        self.drafted_count = np.zeros((2, longest + 1), np.int64)
        self.depth = probe.max_depth
        width = probe.topk
        self.accept = np.zeros((self.depth, width), np.int64)
        self.count = np.zeros((self.depth, width), np.int64)
        n = probe.num_nodes
        self.tau_sum = np.zeros((self.depth, n))
        self.steps = 0
        self.tokens = 0

    def add(self, parents, depth, valid, probs, path, n_accepted) -> None:
        """One row's step: its tree (parents, depth, valid, draft probs [N]) and the accepted
        path [P] with n_accepted."""
        parents, depth = np.asarray(parents), np.asarray(depth)
        valid, probs = np.asarray(valid, bool), np.asarray(probs, np.float64)
        n_acc = int(n_accepted)
        on_path = set(int(i) for i in np.asarray(path)[: n_acc + 1])
        self.steps += 1
        self.tokens += n_acc + 1
        if self.probe.is_dynamic:
            score = _node_scores(parents, probs, valid)
            rank = _sibling_ranks(parents, score, valid)
        else:  # static children are contiguous in rank order under their parent
            rank = np.zeros_like(parents)
            for i in range(1, len(parents)):
                rank[i] = i - int(np.argmax(parents == parents[i]))
        for i in range(1, len(parents)):
            if valid[i] and int(parents[i]) in on_path and rank[i] < self.count.shape[1]:
                self.count[depth[i] - 1, rank[i]] += 1
                self.accept[depth[i] - 1, rank[i]] += i in on_path
        if self.probe.is_dynamic:
            self._add_dynamic(np.asarray(path)[1 : n_acc + 1], depth, valid, score)

    def add_text(
        self,
        step: int,
        chain_accepted: int,
        emitted: int = 0,
        drafted: int | None = None,
        matched: int | None = None,
    ) -> None:
        """What a text chain accepted at recorded step `step` (index among add()'s calls): the
        chain prompt lookup drafts there, with up to max(text_chains) nodes, had its first
        chain_accepted tokens right. Each length's tree keeps the longer of the two paths.
        emitted: the row's tokens written before the step (it counts toward the text tables of
        every answer length above it). drafted: how many nodes that chain drafted; matched: how
        many of its first nodes came from matches of TEXT_MIN_MATCH+ tokens. Left out (None),
        the chain counts as drafting max(text_chains) nodes, none of them from such matches."""
        rows = self.step_rows[step]
        longer = np.stack([np.maximum(rows, 1 + min(chain_accepted, k)) for k in self.text_chains])
        self.text_sum += longer
        longest = self.drafted_count.shape[1] - 1
        drafted = longest if drafted is None else min(drafted, longest)
        matched = 0 if matched is None else min(matched, drafted)
        self.drafted_count[0, drafted] += 1
        self.drafted_count[1, matched] += 1
        run = min(chain_accepted, matched)
        self.matched_sum += np.stack([np.maximum(rows, 1 + min(run, k)) for k in self.text_chains])
        for j, n in enumerate(self.text_lengths):
            if emitted < n:
                self.gain_sum[j] += longer - rows
                self.gain_steps[j] += 1

    def _add_dynamic(self, path, depth, valid, score) -> None:
        n = self.tau_sum.shape[1]
        rows = np.ones((self.depth, n))
        for d in range(1, self.depth + 1):
            keep = valid & (depth <= d)
            keep[0] = False
            order = sorted(np.flatnonzero(keep), key=lambda i: (-score[i], i))
            rank = {int(i): r for r, i in enumerate(order)}
            # Accepted with budget m (nodes m + 1): the path prefix whose ranks are all < m.
            need = 0  # budget the path prefix needs so far
            accepted_at = []  # (budget needed, path length)
            for j, node in enumerate(path[:d], 1):
                need = max(need, rank[int(node)] + 1)
                accepted_at.append((need, j))
            row = np.ones(n)
            for need, j in accepted_at:
                row[need:] = 1 + j  # nodes = budget + 1 >= need + 1
            self.tau_sum[d - 1] += row
            rows[d - 1] = row
        if self.text_chains:
            self.step_rows.append(rows)

    def profile(self, prompts: str = "") -> AcceptanceProfile:
        acc = np.where(self.count > 0, self.accept / np.maximum(self.count, 1), 0.0)
        probe = self.probe
        if probe.is_dynamic:
            probe_tuple = (probe.budget, probe.max_depth, probe.topk)
            table = tuple(tuple(round(float(x), 5) for x in r / max(self.steps, 1))
                          for r in self.tau_sum)  # fmt: skip
            kind = "dynamic"
        else:
            probe_tuple, table, kind = tuple(probe.branching), (), "static"
        text_table, matched_table = (
            tuple(
                tuple(tuple(round(float(x), 5) for x in r / max(self.steps, 1)) for r in t)
                for t in sums
            )
            for sums in (self.text_sum, self.matched_sum)
        )
        replayed = max(int(self.drafted_count[0].sum()), 1)
        text_drafted, matched_drafted = (
            tuple(round(float(c) / replayed, 6) for c in counts) if self.text_chains else ()
            for counts in self.drafted_count
        )
        lengths = tuple(n for n, c in zip(self.text_lengths, self.gain_steps, strict=True) if c)
        by_length = tuple(
            tuple(
                tuple(tuple(round(float(x), 5) for x in r) for r in np.asarray(table) + g / c)
                for g in self.gain_sum[j]
            )
            for j, c in enumerate(self.gain_steps)
            if c
        )
        return AcceptanceProfile(
            kind=kind,
            mode=self.mode,
            probe=probe_tuple,
            steps=self.steps,
            measured_tau=self.tokens / max(self.steps, 1),
            rank_accept=tuple(tuple(round(float(x), 5) for x in row) for row in acc),
            rank_count=tuple(tuple(int(x) for x in row) for row in self.count),
            tau_table=table,
            prompts=prompts,
            text_chains=self.text_chains,
            text_table=text_table,
            text_lengths=lengths,
            text_by_length=by_length,
            matched_table=matched_table,
            text_drafted=text_drafted,
            matched_drafted=matched_drafted,
        )


def calibrate(
    target,
    drafter,
    prompts,
    *,
    probe: TreeConfig,
    sampling: SamplingConfig = SamplingConfig(),
    max_new_tokens: int = 64,
    eos_id: int | None = None,
    key=None,
    description: str = "",
    progress: Callable[[str], None] | None = None,
) -> AcceptanceProfile:
    """Run speculative decoding with the probe tree on `prompts` (token-id lists), recording every
    live row's step, and return the profile. Sampled profiles are measured at `sampling` (use
    temperature 1). Greedy dynamic profiles of drafters that add text chains also measure chains
    of TEXT_CHAINS nodes (the module docstring)."""
    import jax

    from specjax.drafters.text_chain import LONGEST, host_text_chain
    from specjax.speculative import SteppedRun

    run = SteppedRun(
        target,
        drafter,
        prompts,
        max_new_tokens=max_new_tokens,
        config=SpecConfig(tree=probe, pre_verify=False),  # the whole probe tree
        sampling=sampling,
        key=jax.random.key(0) if key is None else key,
        eos_id=eos_id,
    )
    with_text = sampling.greedy and probe.is_dynamic and getattr(drafter, "text_chains", False)
    recorder = ProfileRecorder(
        probe,
        mode_of(sampling),
        TEXT_CHAINS if with_text else (),
        sorted({n for n in TEXT_LENGTHS if n < max_new_tokens} | {max_new_tokens}),
    )
    at = []  # (row, tokens emitted before the step) of every recorded step
    while not run.done:
        emitted = np.asarray(run.state.n_generated) if with_text else None
        tree, acc, live = jax.device_get(run.step())
        for b in np.flatnonzero(live):
            recorder.add(
                tree.parents[b], tree.depth[b], tree.valid[b], tree.draft_prob[b],
                acc.path[b], acc.n_accepted[b],
            )  # fmt: skip
            if with_text:
                at.append((int(b), int(emitted[b])))
        if progress is not None and recorder.steps % 50 < int(live.sum()):
            progress(f"calibrating acceptance: {recorder.steps} row-steps")
    if with_text:  # the greedy output is the target's: replay the text's chain at every step
        out = np.asarray(run.state.tokens)
        n_out = np.asarray(run.state.n_generated)
        for step, (b, g) in enumerate(at):
            # At this step the root (the last emitted token) was pending after the prompt and
            # the g - 1 tokens before it; the target then wrote out[b, g:].
            text = list(prompts[b]) + out[b, :g].tolist()
            chain, matches = host_text_chain(text, max(TEXT_CHAINS), LONGEST, with_matches=True)
            right = 0
            for token, truth in zip(chain, out[b, g : n_out[b]], strict=False):
                if token != truth:
                    break
                right += 1
            matched = next((i for i, m in enumerate(matches) if m < TEXT_MIN_MATCH), len(matches))
            recorder.add_text(step, right, g, drafted=len(chain), matched=matched)
    return recorder.profile(description)
