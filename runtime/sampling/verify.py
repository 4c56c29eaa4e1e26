"""Verification of k draft tokens against the target's k+1 rows (pure; randomness passed in).

Contract (both functions): requires len(draft) == k, target rows [k+1, V] where row i is the
target's distribution for the position of draft[i] (row k: the position after all of them).
Returns (n_accepted in [0, k], next_token): the caller commits draft[:n_accepted] + [next_token],
so every round yields at least one token.
"""

from __future__ import annotations

import numpy as np

from .draws import sample


def verify_greedy(draft: np.ndarray, target_logits: np.ndarray) -> tuple[int, int]:
    """Temperature 0: accept while draft[i] == argmax(target row i); next = argmax of the first
    row that disagreed (or of row k). Identical to target-only greedy decoding."""
    best = target_logits.argmax(axis=-1)  # [k+1]
    k = len(draft)
    n = 0
    while n < k and draft[n] == best[n]:
        n += 1
    return n, int(best[n])


def verify_sampling(
    draft: np.ndarray,
    q: np.ndarray | None,
    p: np.ndarray,
    u_accept: np.ndarray,
    u_sample: float,
) -> tuple[int, int]:
    """Exact speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    draft     [k] proposed tokens
    q         [k, V] draft probabilities the tokens were sampled from, or None for a one-hot
              (deterministic) drafter such as n-gram lookup, where q_i(x) = 1
    p         [k+1, V] target probabilities (same temperature/top-k/top-p processing as q)
    u_accept  [k] uniforms in [0, 1); u_sample one uniform for the residual / bonus draw

    Token i is accepted iff u_accept[i] < p_i(x) / q_i(x). On the first rejection the next token
    is drawn from norm(max(0, p_i - q_i)); if all k are accepted, from p_k (the bonus token).
    """
    k = len(draft)
    for i in range(k):
        x = int(draft[i])
        qx = 1.0 if q is None else float(q[i, x])
        px = float(p[i, x])
        if qx > 0 and u_accept[i] * qx < px:
            continue
        if q is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        total = residual.sum()
        if total <= 0:  # p == q exactly (rejection then has probability 0); fall back to p
            residual = p[i]
        return i, sample(residual, u_sample)
    return k, sample(p[k], u_sample)
