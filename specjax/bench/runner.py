"""Running one method on one prompt set: the `Target` under test, the `Runner` protocol that
`specjax.benchmark.time_interleaved` calls (warm-up, then timed repetitions, batch 1), the
specjax runner (autoregressive or speculative) and the `Decoded` outputs a runner hands back.
The transformers runner lives in specjax.bench.hf_peer."""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax
import numpy as np

from specjax.bench.methods import Method
from specjax.bench.prompts import Prompt, PromptSet
from specjax.cache import tree_reserve
from specjax.programs import compile_seconds


@dataclasses.dataclass
class Target:
    """The model under test. eos_id: rows stop after emitting it (None: always max_new_tokens)."""

    name: str
    model: object
    tokenizer: object | None = None
    eos_id: int | None = None


@dataclasses.dataclass
class Decoded:
    """One method's outputs on a prompt set: generated ids per prompt (EOS included), tau per
    prompt, and the accepted-length histogram [P] summed over prompts (specjax SPEC only)."""

    tokens: list[np.ndarray]
    tau: list[float]
    accepted_hist: np.ndarray | None = None
    choice: dict | None = None  # SpecConfig.auto(): tree, predicted_tau, predicted_speedup
    draft_len: list[float] | None = None  # draft nodes verified per step, per prompt
    pre_verifier_stops: int = 0  # steps a drafter's pre-verifier cut, over all prompts
    intermediate_tau: list[float] | None = None  # per prompt, rows with an intermediate level

    @property
    def n_tokens(self) -> int:
        return int(sum(len(t) for t in self.tokens))


class Runner:
    """One method on one prompt set, called by `time_interleaved` (which waits on nothing: every
    prompt's result is waited on here, so the per-prompt times add up to the call's).

    The first call only warms up: it decodes the prompts of `warm_indices()` (for specjax one per
    padded prompt width, which compiles every program the set needs) and is timed as warm_s.
    Later calls decode every prompt, batch 1, prompt i with seed i, and keep the outputs of the
    last call (all calls give the same outputs).
    """

    def __init__(self, prompts: PromptSet):
        self.prompts = prompts
        self.warm_s: float | None = None
        self.warm_passes = 0
        self.prompt_s: list[list[float]] = [[] for _ in prompts.prompts]  # [prompt][repetition]
        # Seconds each timed repetition spent compiling (specjax.programs.compile_seconds): a
        # program the warm-up did not compile (default calls did, after later methods' warm-ups:
        # NOTES.md, "Fifty-fifth session"). Not subtracted: it is reported beside the times.
        self.compile_in_runs_s: list[float] = []
        self.outputs: list | None = None

    def warm_indices(self) -> list[int]:
        return [0]

    def decode(self, i: int, prompt: Prompt):
        raise NotImplementedError

    def __call__(self) -> None:
        if self.warm_s is None:
            t0 = time.perf_counter()
            for i in self.warm_indices():
                self.decode(i, self.prompts.prompts[i])
            self.warm_s = time.perf_counter() - t0
            self.warm_passes = 1
            return
        outs = []
        compiled = compile_seconds()
        for i, p in enumerate(self.prompts.prompts):
            t0 = time.perf_counter()
            outs.append(self.decode(i, p))
            self.prompt_s[i].append(time.perf_counter() - t0)
        self.compile_in_runs_s.append(compile_seconds() - compiled)
        self.outputs = outs

    def settle(self) -> None:
        """The warm-up's prompts once more, after the other methods' warm-ups (see
        specjax.benchmark.time_interleaved): what they made this method compile again is
        compiled here, not in a timed repetition. Counted in warm_s."""
        t0 = time.perf_counter()
        for i in self.warm_indices():
            self.decode(i, self.prompts.prompts[i])
        self.warm_s += time.perf_counter() - t0
        self.warm_passes += 1

    @property
    def compile_s(self) -> float:
        """Warm-up seconds minus what the warmed prompts take once compiled (their median, once
        per warm-up pass)."""
        ran = sum(statistics.median(self.prompt_s[i]) for i in self.warm_indices())
        return max(self.warm_s - self.warm_passes * ran, 0.0)

    def decoded(self) -> Decoded:
        raise NotImplementedError


class SpecjaxRunner(Runner):
    """specjax.generate (drafter None) or specjax.speculative_generate with the method's tree."""

    def __init__(self, target: Target, method: Method, drafter, prompts: PromptSet, sampling):
        super().__init__(prompts)
        self.target, self.method, self.drafter, self.sampling = target, method, drafter, sampling
        self.verifier = None
        self.shifts: dict[int, float] = {}  # prompt -> acceptance shift (see replays_shifts)
        if method.exit_heads is not None:
            from specjax.datasets import resolve_path
            from specjax.verifiers.early_exit import EarlyExitVerifier

            path = resolve_path(method.exit_heads)
            self.verifier = EarlyExitVerifier.from_checkpoint(path, target.model)

    @property
    def replays_shifts(self) -> bool:
        """An adapting default call (AutoSpecConfig.adapt): the warm-up decodes every prompt in
        order, so each prompt's choice uses what the prompts before it measured (and compiles
        what it picks), and the timed calls replay each prompt's shift (stats acceptance_shift)
        instead of adapting further on prompts already seen. HiSpec's default call does not
        adapt (it times itself once per kind of call: specjax.hispec_choice)."""
        from specjax.hispec import HiSpec

        return (
            self.drafter is not None
            and self.method.auto
            and self.method.auto_adapts
            and not isinstance(self.drafter, HiSpec)
        )

    @property
    def forced_settings(self) -> str | None:
        """What a default-call method without a fallback runs when its outputs report no
        choice: HiSpec forced to its three levels runs its checkpoint's draft length and buffer
        (e.g. "hispec(draft_len=1,buffer=2)"); None for every other drafter."""
        from specjax.hispec import HiSpec
        from specjax.hispec_choice import label_of

        return label_of(self.drafter) if isinstance(self.drafter, HiSpec) else None

    def warm_indices(self) -> list[int]:
        from specjax.decode import prepare_prompts

        if self.drafter is not None and self.method.auto:
            # A default call may choose another tree for another prompt (its cost context
            # depends on the prompt width, specjax.choice.call_context; an adapting
            # one also learns from the prompts before, see replays_shifts): each is warmed, so
            # that no timed run compiles one (bench_t1.md once timed a compile in the first
            # repetition of an auto-tree row).
            return list(range(len(self.prompts.prompts)))
        extra = 0
        if self.drafter is not None and not self.method.auto:
            tree = self.method.config.tree
            extra = tree_reserve(tree.num_nodes, tree.max_depth)
        first_of_width: dict[int, int] = {}
        for i, p in enumerate(self.prompts.prompts):
            ids, _ = prepare_prompts(
                [list(p.ids)], self.target.model.config, self.prompts.max_new_tokens, extra
            )
            first_of_width.setdefault(ids.shape[1], i)
        return sorted(first_of_width.values())

    def decode(self, i: int, prompt: Prompt):
        import specjax

        kw = dict(
            max_new_tokens=self.prompts.max_new_tokens,
            sampling=self.sampling,
            key=jax.random.key(i),
            eos_id=self.target.eos_id,
        )
        if self.drafter is None:
            out = specjax.generate(self.target.model, [list(prompt.ids)], **kw)
            return jax.block_until_ready(out)
        config = self.method.config
        if self.replays_shifts and self.warm_s is None and not self.shifts:
            # Each adapting row learns from its own calls only: another row with the same
            # drafter may already have decoded these prompts (the timed runs replay shifts and
            # do not depend on what is learned, so forgetting it disturbs no other row).
            from specjax import adaptation

            adaptation.reset()
        if self.replays_shifts and self.warm_s is not None:
            config = dataclasses.replace(config, adapt=self.shifts[i])
        out = specjax.speculative_generate(
            self.target.model, self.drafter, [list(prompt.ids)], config=config,
            verifier=self.verifier, **kw,
        )  # fmt: skip
        if self.replays_shifts and self.warm_s is None:
            self.shifts[i] = float(out.stats["acceptance_shift"])
        return jax.block_until_ready(out)

    def decoded(self) -> Decoded:
        tokens, tau, hist, choices, draft_len, stops, level = [], [], None, [], [], 0, []
        for o in self.outputs:
            n = int(o.lengths[0])
            tokens.append(np.asarray(o.tokens[0, :n]))
            if o.stats is None:
                tau.append(1.0)
            else:
                # Tokens emitted per target call, as for HiSpec and the transformers peers: the
                # stats' tau (accepted + 1 a step) also counts a row's last accepted path whole
                # where max_new_tokens or EOS cut it (~0.04 more for SmolLM2's eagle, 128 tokens).
                tau.append((n - 1) / max(int(o.stats["target_calls"][0]), 1))
                h = np.asarray(o.stats["accepted_hist"][0], np.int64)
                hist = h if hist is None else _add_padded(hist, h)
                if "draft_len" in o.stats:
                    draft_len.append(float(o.stats["draft_len"][0]))
                    stops += int(o.stats["pre_verifier_stops"][0])
                if "predicted_speedup" in o.stats:
                    choices.append((o.stats, n))
                level_tau = intermediate_tau(o.stats)
                if level_tau is not None:
                    level.append(level_tau)
        return Decoded(
            tokens=tokens,
            tau=tau,
            accepted_hist=hist,
            choice=_combined_choice(choices),
            draft_len=draft_len or None,
            pre_verifier_stops=stops,
            intermediate_tau=level or None,
        )


def intermediate_tau(stats: dict) -> float | None:
    """Tokens per call of an intermediate level for row 0, or None: HiSpec's verify-exit rounds
    (specjax.hispec), or an exit-screened tree's exit (accepted exit tokens + 1 per step)."""
    if "intermediate_tau" in stats:
        return float(stats["intermediate_tau"][0])
    if "exit_accepted" in stats:
        steps = max(int(stats["exit_steps"][0]), 1)  # the steps exit_accepted counts
        return float(stats["exit_accepted"][0]) / steps + 1.0
    return None


def _add_padded(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for accepted-length histograms of different trees (depths): zeros fill the end."""
    n = max(len(a), len(b))
    return np.pad(a, (0, n - len(a))) + np.pad(b, (0, n - len(b)))


def _combined_choice(chosen: list[tuple[dict, int]]) -> dict | None:
    """SpecConfig.auto()'s choice over a prompt set, from each prompt's (stats, generated
    tokens): the trees chosen (in order of first use; the choice can differ between prompts
    whose calls have different contexts, see specjax.choice.call_context), the mean predicted
    tau, and the predicted speedup of the whole set: the token-weighted harmonic mean of the
    prompts' predictions, sum(n) / sum(n / s), which is the set's throughput ratio (what the
    bench measures) if each prompt met its prediction and plain decoding's time is
    proportional to tokens; a plain mean would weigh a short prompt like a long one."""
    if not chosen:
        return None
    stats = [s for s, _ in chosen]
    tokens = np.array([max(n, 1) for _, n in chosen], np.float64)
    predicted = np.array([float(s["predicted_speedup"]) for s in stats])
    trees = list(dict.fromkeys(str(s["tree"]) for s in stats))
    per_prompt = [prompt_choice(s) for s in stats]
    plain = [int(np.asarray(s["plain_steps"])[0]) for s in stats if "plain_steps" in s]
    shifts = [float(s.get("acceptance_shift", 1.0)) for s in stats]
    calls = [int(np.asarray(s["target_calls"])[0]) for s in stats if "plain_steps" in s]
    return {
        "tree": " / ".join(trees),
        "predicted_tau": float(np.mean([float(s["predicted_tau"]) for s in stats])),
        "predicted_speedup": float(tokens.sum() / (tokens / predicted).sum()),
        # Prompts whose call stopped speculating (SpecConfig.fallback_tau), and the share of
        # all target calls that were plain decoding steps.
        "fell_back": sum(n > 0 for n in plain),
        "plain_share": sum(plain) / max(sum(calls), 1),
        # Each prompt's choice and what its speculative steps measured (prompt_choice).
        "per_prompt": per_prompt,
        # The acceptance shift (specjax.adaptation) the first and the last prompt chose with.
        "shift": f"{shifts[0]:.2f}"
        if len(set(shifts)) == 1
        else f"{shifts[0]:.2f} -> {shifts[-1]:.2f}",
    }


def prompt_choice(stats: dict) -> dict:
    """One prompt's default call (row 0 of its stats): the tree and shift it chose with, the tau
    and speedup it predicted, and tau over its speculative steps alone (steps decoded plainly
    after a fallback emit one token each and are left out: the prediction is for the tree)."""
    from specjax.adaptation import speculative_counts

    row = {k: np.asarray(stats[k])[:1] for k in ("accepted_hist", "plain_steps") if k in stats}
    steps, tokens = speculative_counts(row)
    speculative = int(steps)
    plain = int(row["plain_steps"][0]) if "plain_steps" in row else 0
    return {
        "tree": str(stats["tree"]),
        "shift": float(stats.get("acceptance_shift", 1.0)),
        "predicted_tau": float(stats["predicted_tau"]),
        "predicted_speedup": float(stats["predicted_speedup"]),
        "speculative_calls": speculative,
        "plain_calls": plain,
        "speculative_tau": tokens / steps if steps else math.nan,
    }
