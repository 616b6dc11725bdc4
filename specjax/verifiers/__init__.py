"""Verifiers: the target's side of a speculative step (forward over the draft tree, acceptance
rule, commit of the accepted path). base: the protocol; full: the whole target verifies."""

from specjax.verifiers.base import Verification, Verifier
from specjax.verifiers.full import FullVerifier

__all__ = ["FullVerifier", "Verification", "Verifier"]
