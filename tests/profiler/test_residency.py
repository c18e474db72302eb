"""Where tensors live, by where they come from, on this CPU-only machine as on a GPU: moves and
factories with a device target, a model moved to the device, host data, the direction of each
copy, and the --all-tensors fallback."""

import numpy as np
import torch

from nostall.profiler import SyncWatch

device = torch.device("cpu")  # the script's compute device: "cuda" if available, else "cpu"


def _kinds(watch: SyncWatch) -> list[str]:
    return [e.kind for e in watch.events if not e.allowed]


def test_a_model_moved_to_the_device_lives_there_buffers_included():
    with SyncWatch() as watch:
        model = torch.nn.BatchNorm1d(4).to(device)  # Module.to: torch's own moves, not reported
        model.running_mean.sum().item()  # a buffer, now on the device: a read is a sync
    assert _kinds(watch) == ["item"]


def test_each_copy_is_classified_by_its_direction():
    with SyncWatch() as watch:
        obs = torch.as_tensor(np.ones(4, dtype=np.float32))  # host data: on the host
        obs.sum().item()  # a host read: nothing
        on_device = obs.to(device)  # host -> device, pageable: a copy to the device
        on_device.to(device)  # already there: nothing
        on_device.to(device=on_device.device)  # transformers' mask.to(device=x.device): nothing
        back = on_device.to("cpu")  # device -> host: a copy to the host
        back.numpy()  # already on the host: nothing more
        torch.zeros(3, device=device)  # filled on the device: nothing
        torch.tensor([1.0, 2.0], device=device)  # data from the host: a copy to the device
        torch.tensor([], device=device)  # nothing to copy: nothing
        obs.to(device, non_blocking=True)  # queued (from pinned memory on a GPU): nothing
    assert _kinds(watch) == ["copy to device", "copy to host", "copy to device"]


def test_the_all_tensors_fallback_reports_no_copy_for_a_move_in_place():
    with SyncWatch(all_tensors=True) as watch:
        x = torch.ones(3)
        torch.ones(3).to(device=x.device)
        x.cpu()  # device -> host, as every tensor counts as a device tensor
    assert _kinds(watch) == ["copy to host"]
