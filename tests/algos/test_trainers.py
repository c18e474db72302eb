"""The trainers learn, have no unintended host sync per iteration, and resume exactly."""

import pytest
import torch

from nostall.algos import appo, ppo


def test_ppo_solves_cartpole_with_no_sync_per_iteration():
    result = ppo.train(ppo.Args(total_timesteps=200_000, stop_when_solved=True, log_interval=5))
    assert result.solved_at is not None, result.curve[-5:]
    assert result.curve[-1][2] >= 475  # mean return of the last 20 episodes
    assert result.syncs_per_iteration == 0, result.sync_sites


def test_appo_learns_cartpole_from_stale_chunks():
    args = appo.Args(total_timesteps=300_000, stop_when_solved=True, log_interval=5)
    result = appo.train(args)
    assert result.solved_at is not None, result.curve[-5:]
    assert result.syncs_per_iteration == 0, result.sync_sites


def test_ppo_improves_clearly_on_pendulum():
    args = ppo.Args(
        env_id="Pendulum-v1",
        total_timesteps=110_000,
        num_envs=16,
        num_steps=128,
        learning_rate=1e-3,
        gamma=0.95,
        ent_coef=0.0,
        update_epochs=10,
        num_minibatches=8,
        reward_scale=0.1,
        log_interval=5,
    )
    result = ppo.train(args)
    first, last = result.curve[0][2], result.curve[-1][2]
    assert first < -900 and last > -600, result.curve  # random: about -1200; solved: -150


def _params(path_or_args) -> list[torch.Tensor]:
    state = ppo.load_checkpoint(path_or_args)
    return list(state["agent"].values())


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_resumed_run_continues_exactly_as_an_uninterrupted_one(tmp_path, backend):
    common = dict(total_timesteps=12 * 1024, log_interval=4, checkpoint_every=6, backend=backend)
    ppo.train(ppo.Args(**common, checkpoint=str(tmp_path / "straight-{iteration}.pt")))
    resumed = tmp_path / "resumed.pt"
    ppo.train(ppo.Args(**common, checkpoint=str(resumed), resume=str(tmp_path / "straight-6.pt")))
    straight = tmp_path / "straight-12.pt"
    for a, b in zip(_params(straight), _params(resumed), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert ppo.load_checkpoint(resumed)["iteration"] == 12


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_native_rollout_trains_exactly_as_the_step_by_step_one(tmp_path, backend):
    # CartPole's Gumbel noise drawn for a whole chunk is the same stream as drawn per step, so
    # the two rollout paths must give the very same run.
    common = dict(total_timesteps=4 * 1024, log_interval=2, backend=backend, watch_syncs=False)
    results = []
    for native in (True, False):
        path = tmp_path / f"native-{native}.pt"
        results.append(ppo.train(ppo.Args(**common, native_rollout=native, checkpoint=str(path))))
    native, stepped = (_params(tmp_path / f"native-{n}.pt") for n in (True, False))
    for a, b in zip(native, stepped, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    curves = [[(steps, ret) for steps, _, ret in r.curve] for r in results]  # times differ
    assert curves[0] == curves[1] and curves[0]


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_resume_between_weight_publications_is_exact(tmp_path, backend):
    # Weights published every 2 updates: at iteration 3 the rollout side still holds those of
    # iteration 2, and a resumed run must collect with those too.
    common = dict(
        total_timesteps=6 * 1024, log_interval=3, checkpoint_every=3, backend=backend,
        publish_every=2, watch_syncs=False,
    )  # fmt: skip
    ppo.train(ppo.Args(**common, checkpoint=str(tmp_path / "straight-{iteration}.pt")))
    resumed = tmp_path / "resumed.pt"
    ppo.train(ppo.Args(**common, checkpoint=str(resumed), resume=str(tmp_path / "straight-3.pt")))
    for a, b in zip(_params(tmp_path / "straight-6.pt"), _params(resumed), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bad_arguments_and_checkpoints(tmp_path):
    with pytest.raises(ValueError, match="num_envs must be at least 1"):
        ppo.train(ppo.Args(num_envs=0))
    with pytest.raises(ValueError, match="divisible by num_minibatches"):
        ppo.train(ppo.Args(num_envs=3, num_steps=5, num_minibatches=4))
    for device in ("meta", "gpu0", "tpu"):
        with pytest.raises(ValueError, match=f"device must be cpu, cuda or cuda:N, got '{device}'"):
            ppo.train(ppo.Args(device=device))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device is present"):
            ppo.train(ppo.Args(device="cuda"))
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="cannot read checkpoint"):
        ppo.load_checkpoint(bad)


def test_steady_throughput_leaves_out_the_first_iteration():
    result = ppo.TrainResult(args={}, steps=10 * 1024, seconds=7.0, first_iteration_at=(1024, 2.5))
    assert result.steps_per_second == 10 * 1024 / 7.0
    assert result.steady_steps_per_second == 9 * 1024 / 4.5
    assert ppo.TrainResult(args={}).steady_steps_per_second == 0.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
@pytest.mark.parametrize("backend", ["thread", "process"])
def test_ppo_on_a_gpu_solves_cartpole_and_the_thread_backend_never_syncs(backend):
    args = ppo.Args(
        device="cuda", backend=backend, total_timesteps=200_000, stop_when_solved=True,
        log_interval=5,
    )  # fmt: skip
    result = ppo.train(args)
    assert result.solved_at is not None, result.curve[-5:]
    if backend == "thread":  # the process backend's weight hand-off waits for the update
        assert result.syncs_per_iteration == 0, result.sync_sites


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none present")
def test_gpu_trainer_resumes_exactly(tmp_path):
    common = dict(total_timesteps=8 * 1024, log_interval=4, checkpoint_every=4, device="cuda")
    ppo.train(ppo.Args(**common, checkpoint=str(tmp_path / "straight-{iteration}.pt")))
    resumed = tmp_path / "resumed.pt"
    ppo.train(ppo.Args(**common, checkpoint=str(resumed), resume=str(tmp_path / "straight-4.pt")))
    for a, b in zip(_params(tmp_path / "straight-8.pt"), _params(resumed), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
