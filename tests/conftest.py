import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device; none is present"),
        ],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param
