"""Locality-sensitive hash families, baseline and learned."""

from lshdist.hashing.families import (
    HashFamily,
    LearnedExplicit,
    LearnedImplicit,
    RandomHyperplanes,
    family_for,
)

__all__ = ["HashFamily", "LearnedExplicit", "LearnedImplicit", "RandomHyperplanes", "family_for"]
