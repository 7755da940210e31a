"""Numbers that choose LSH parameters, as pure functions (STYLE.md; datasketch's habit)."""

from __future__ import annotations

import math

from lshdist.errors import InputError

DEFAULT_EPSILON = 1.0


def permutations_for(n: int, epsilon: float) -> int:
    """Charikar's ``M = ceil(2 N^{1/(1+eps)})`` permutations for N database points."""
    if n < 1:
        raise InputError(f"N={n}: the database must hold at least one point")
    if not epsilon > 0:
        raise InputError(f"epsilon={epsilon}: epsilon must be > 0")
    m: float = 2.0 * n ** (1.0 / (1.0 + epsilon))
    return math.ceil(m)


def collision_probability(angle: float) -> float:
    """Probability that one random-hyperplane bit agrees for two vectors at ``angle`` radians."""
    if not 0 <= angle <= math.pi:
        raise InputError(f"angle={angle}: must be in [0, pi]")
    return 1.0 - angle / math.pi


def max_candidates(n_permutations: int, window: int) -> int:
    """Upper bound on candidates per query: 2 W entries from each of M lists."""
    return 2 * int(n_permutations) * int(window)


def resolve_permutations(n: int, *, epsilon: float | None, permutations: int | None) -> int:
    """M given directly, or from epsilon (at most one of them; neither: epsilon = 1)."""
    if epsilon is not None and permutations is not None:
        raise InputError("give epsilon or permutations (M), not both")
    if permutations is not None:
        if permutations < 1:
            raise InputError(f"permutations={permutations}: M must be >= 1")
        return int(permutations)
    return permutations_for(n, DEFAULT_EPSILON if epsilon is None else epsilon)
