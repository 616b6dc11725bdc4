"""Drafters: the protocol (base), language-model drafters (lm), feature drafters (feature),
loading trained ones (loading) and naming them by string (spec)."""

from specjax.drafters.base import Drafter, RootContext
from specjax.drafters.feature import EagleDrafter, HiddenStateDrafter
from specjax.drafters.lm import LMDrafter
from specjax.drafters.loading import load_drafter

__all__ = [
    "Drafter",
    "EagleDrafter",
    "HiddenStateDrafter",
    "LMDrafter",
    "RootContext",
    "load_drafter",
]
