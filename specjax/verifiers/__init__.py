"""Verifiers: the target's side of a speculative step (forward over the draft tree, acceptance
rule, commit of the accepted path). base: the protocol; full: the whole target verifies;
early_exit: a trained exit head screens the tree first (HiSpec), the layers above it run on its
path only."""

from specjax.verifiers.base import Verification, Verifier
from specjax.verifiers.early_exit import EarlyExitVerifier
from specjax.verifiers.full import FullVerifier

__all__ = ["EarlyExitVerifier", "FullVerifier", "Verification", "Verifier"]
