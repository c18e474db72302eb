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


@pytest.fixture(scope="module")
def local_cluster(request):
    """A local Ray cluster for the module's tests, of its RAY_CPUS CPUs (default 2)."""
    ray = pytest.importorskip("ray", reason="Ray (a dev dependency) is not installed")
    ray.init(
        num_cpus=getattr(request.module, "RAY_CPUS", 2),
        include_dashboard=False,
        log_to_driver=False,
    )
    yield
    ray.shutdown()
