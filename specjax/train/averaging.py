"""Weight averaging of trained drafters ("model soup"): the element-wise mean of the parameters of
drafters that share a lineage (one run and its continuations), which can land between their
optima where neither training run stopped.

Only drafters of one configuration, one draft vocabulary and one target can be averaged: the
mean of two drafters whose draft-vocabulary rows mean different tokens, or that read another
target's hidden states, is meaningless.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from specjax.models.drafter import DrafterNet
from specjax.train.checkpoint import load_drafter_net, read_header


def average_drafters(paths: Sequence[str | Path]) -> tuple[DrafterNet, dict]:
    """(the drafter whose parameters are the mean of those of the drafters at `paths`, float32;
    the header of the last of them). ValueError naming the drafter that differs from the first
    in configuration, draft vocabulary or target fingerprint, or for fewer than two paths."""
    if len(paths) < 2:
        raise ValueError(f"averaging needs at least two drafters, got {len(paths)}")
    nets = [load_drafter_net(p) for p in paths]
    headers = [read_header(p) for p in paths]
    first, first_vocab = nets[0], np.asarray(nets[0].draft_vocab[...])
    for path, net, header in zip(paths[1:], nets[1:], headers[1:], strict=True):
        if net.config != first.config:
            raise ValueError(
                f"{path}: its configuration ({net.config}) differs from {paths[0]}'s "
                f"({first.config}); only drafters of one configuration can be averaged"
            )
        if not np.array_equal(np.asarray(net.draft_vocab[...]), first_vocab):
            raise ValueError(
                f"{path}: its draft vocabulary differs from {paths[0]}'s; average only a "
                "drafter and its continuations, which keep the vocabulary they start from"
            )
        if header.get("target_fingerprint") != headers[0].get("target_fingerprint"):
            raise ValueError(
                f"{path}: trained for another target than {paths[0]} (target fingerprints "
                f"{header.get('target_fingerprint')} and {headers[0].get('target_fingerprint')})"
            )
    states = [nnx.state(net, nnx.Param) for net in nets]
    mean = jax.tree.map(
        lambda *xs: np.mean([np.asarray(x, np.float32) for x in xs], axis=0), *states
    )
    nnx.update(first, mean)
    return first, headers[-1]
