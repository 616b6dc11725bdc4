"""The Hugging Face transformers peer: the target's weights in a transformers model (`HFPeer`),
its runner (plain, assisted and prompt-lookup generate), `hf_available` and the torch
environment set-up. The only module of specjax.bench that uses torch or transformers, and it
imports them inside functions only, so the package loads without the [hf] extra."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from specjax.bench.methods import HF_ASSISTANT_SETTINGS, HF_ASSISTED, HF_LOOKUP, Method
from specjax.bench.prompts import Prompt, PromptSet
from specjax.bench.runner import Decoded, Runner, Target
from specjax.config import SamplingConfig
from specjax.datasets import resolve_path

# Idle OpenMP threads of torch spin by default; on a CPU shared with other processes (or with
# XLA's own thread pool) a spinning thread that lost its core stalls every parallel region: torch
# ran 4x slower per token on the 2-core development machine under load. Passive waiting costs
# little when the machine is idle. Set before torch is first imported (a user's value wins).
OMP_WAIT_POLICY = "PASSIVE"


def prepare_torch_env() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


def hf_available() -> bool:
    prepare_torch_env()
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def peer_device() -> str:
    """ "cuda" when torch sees a GPU (the peer then runs where specjax's GPU backend runs), else
    "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def set_torch_threads(n: int) -> None:
    """torch.set_num_threads(n), after the environment set-up."""
    prepare_torch_env()
    import torch

    torch.set_num_threads(n)


class HFPeer:
    """The target's weights in a transformers model (float32, `to_transformers`) on the GPU when
    torch sees one, else the CPU, counting its forward calls (for tau), plus assistant models
    loaded on demand."""

    def __init__(self, target: Target, log: Callable[[str], None] = print):
        import transformers

        from specjax.io.export import to_transformers

        self._transformers = transformers
        self.log = log
        self.device = peer_device()
        self.model = to_transformers(target.model).to(self.device)
        self._configure(self.model, target.eos_id)
        self.eos_id = target.eos_id
        self.calls = 0
        self.model.register_forward_hook(self._count)
        self._assistants: dict[str, object] = {}

    def _count(self, module, args, output):
        self.calls += 1

    def _configure(self, model, eos_id, **extra):
        # Replace the generation config wholesale: generate() fills unset fields from the model's
        # own config, so an exported default EOS (2) would otherwise stop rows specjax continues.
        model.generation_config = self._transformers.GenerationConfig(
            bos_token_id=None,
            eos_token_id=eos_id,
            pad_token_id=0 if eos_id is None else eos_id,
            **extra,
        )

    def assistant(self, path: str):
        if path not in self._assistants:
            import specjax
            from specjax.io.export import to_transformers

            hf = to_transformers(specjax.load(resolve_path(path, "models")).model)
            hf = hf.to(self.device)
            self._configure(hf, self.eos_id, **HF_ASSISTANT_SETTINGS)
            self._assistants[path] = hf
        return self._assistants[path]

    def runner(self, method: Method, prompts: PromptSet, sampling: SamplingConfig) -> _HFRunner:
        kwargs: dict = dict(max_new_tokens=prompts.max_new_tokens, do_sample=not sampling.greedy)
        if not sampling.greedy:
            # The same transform as specjax's SamplingConfig (0 / 1.0 switch top-k / top-p off;
            # transformers would otherwise apply its default top_k=50).
            kwargs.update(
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
            )
        if method.kind == HF_LOOKUP:
            kwargs["prompt_lookup_num_tokens"] = method.lookup_tokens
        elif method.kind == HF_ASSISTED:
            kwargs["assistant_model"] = self.assistant(method.drafter)
        return _HFRunner(prompts, self, kwargs)


class _HFRunner(Runner):
    """transformers generate(); the warm-up (first prompt) pays one-off set-up costs, there is
    nothing to compile."""

    def __init__(self, prompts: PromptSet, peer: HFPeer, kwargs: dict):
        super().__init__(prompts)
        self.peer, self.kwargs = peer, kwargs

    def decode(self, i: int, prompt: Prompt) -> tuple[np.ndarray, int]:
        import torch

        torch.manual_seed(i)
        x = torch.tensor([list(prompt.ids)], dtype=torch.long, device=self.peer.device)
        self.peer.calls = 0
        with torch.inference_mode():
            out = self.peer.model.generate(x, attention_mask=torch.ones_like(x), **self.kwargs)
        return out[0, x.shape[1] :].cpu().numpy(), self.peer.calls  # .cpu() waits for the GPU

    @property
    def compile_s(self) -> float:
        return math.nan

    def decoded(self) -> Decoded:
        tokens = [t for t, _ in self.outputs]
        # Generated tokens over forward calls: assisted generation's first call verifies
        # candidates as it prefills (and plain generate's yields one token, as every later one).
        tau = [len(t) / max(calls, 1) for t, calls in self.outputs]
        return Decoded(tokens=tokens, tau=tau)


def peer_description() -> str:
    """The peer's versions and settings for the results header (requires hf_available())."""
    import torch
    import transformers
    from transformers.utils import is_sklearn_available

    adaptive = "adapted" if is_sklearn_available() else "fixed: scikit-learn not installed"
    return (
        f"transformers {transformers.__version__}, torch {torch.__version__} on "
        f"{peer_device()}, {torch.get_num_threads()} threads, OMP_WAIT_POLICY="
        f"{os.environ.get('OMP_WAIT_POLICY', 'default')}, same weights via specjax.io.export."
        f"to_transformers; assistant: {HF_ASSISTANT_SETTINGS['num_assistant_tokens']} "
        f"tokens, {HF_ASSISTANT_SETTINGS['num_assistant_tokens_schedule']} schedule, "
        f"confidence threshold {HF_ASSISTANT_SETTINGS['assistant_confidence_threshold']} "
        f"({adaptive}); prompt lookup: max_matching_ngram_size default (2)"
    )
