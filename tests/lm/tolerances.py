"""Tolerances from the arithmetic, for float32 results two code paths compute with the same
products summed in different orders (vector widths, blocking, the CPU's instruction set).

A float32 sum of n terms computed in any order is within gamma_n * sum|terms| of the exact one,
gamma_n ~ n * u, u = eps / 2 (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), so two
orders differ by at most n * eps * sum|terms|. A decoder chains such sums (the q/k/v, attention
and output projections, the attention's weighted sum, the MLP's two products: six a layer), and
their errors add along the chain. The terms' magnitude is taken as the result's, at least 1.
Fixed tolerances set on one CPU failed on another's reduction order (AVX-512 against AVX2).
"""

import torch

EPS = torch.finfo(torch.float32).eps
REDUCTIONS_PER_LAYER = 6


def chained_sum_atol(longest_sum: int, layers: int, reference: torch.Tensor) -> float:
    """The bound above for a result of `layers` decoder layers whose longest sum has
    `longest_sum` terms (the hidden size, the MLP's width or the attended positions)."""
    chain = REDUCTIONS_PER_LAYER * layers + 1  # (and the output projection or norm)
    return chain * longest_sum * EPS * max(1.0, float(reference.abs().max()))
