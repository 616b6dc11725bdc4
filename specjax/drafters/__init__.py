"""Drafters: the protocol (base), language-model drafters (lm), feature drafters (feature),
n-gram tables (ngram), loading trained ones (loading) and naming them by string (spec)."""

from specjax.drafters.base import Drafter, RootContext
from specjax.drafters.feature import EagleDrafter, HiddenStateDrafter
from specjax.drafters.lm import LMDrafter
from specjax.drafters.loading import load_drafter
from specjax.drafters.ngram import NgramDrafter

__all__ = [
    "Drafter",
    "EagleDrafter",
    "HiddenStateDrafter",
    "LMDrafter",
    "NgramDrafter",
    "RootContext",
    "load_drafter",
]
