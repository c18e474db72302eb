import pytest
import torch

from nostall.lm.models import builtin_model


@pytest.fixture
def varied_tiny():
    """The built-in tiny model with large random weights, so its greedy completions vary
    (at the default initialisation every prompt continues with the same token)."""
    lm = builtin_model("tiny", seed=0)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in lm.model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return lm.model.eval(), lm
