import pytest
import torch

from tests.algorithms.helpers import grads, make_config, make_policy, prepared
from vgrpo.algorithms.update_memory import MB, choose_update, saved_tensor_bytes

N = 6


def test_saved_bytes_match_a_hand_count():
    """``tanh(x @ w)``: the matmul saves x (4x8 floats; w is excluded as a weight), tanh its output (4x16)."""
    w = torch.nn.Parameter(torch.randn(8, 16))
    x = torch.randn(4, 8)
    out, nbytes = saved_tensor_bytes(lambda: torch.tanh(x @ w).sum(), exclude=[w])
    assert nbytes == (4 * 8 + 4 * 16) * 4
    out.backward()  # the graph still backs up: the hooks keep the tensors
    assert w.grad is not None


def test_a_view_counts_its_storage_once():
    w = torch.nn.Parameter(torch.randn(8, 8))
    x = torch.randn(8, 8)
    _, nbytes = saved_tensor_bytes(lambda: ((x[:4] @ w) + (x[4:] @ w)).sum(), exclude=[w])
    assert nbytes == 8 * 8 * 4


def test_full_graph_chosen_only_when_every_graph_fits():
    fits = choose_update(graph_bytes=10 * MB, n_mc=4, num_samples=64, micro_batch=16, budget_mb=160.0)
    assert fits.full_graph and fits.full_graph_mb == pytest.approx(160.0) and fits.graph_mb == pytest.approx(10.0)
    short = choose_update(graph_bytes=10 * MB, n_mc=4, num_samples=65, micro_batch=16, budget_mb=160.0)
    assert not short.full_graph and short.full_graph_mb == pytest.approx(200.0)  # 5 micro-batches of the 65


def _algorithm(memory_bounded, budget=None):
    algo = {"name": "vgrpo", "n_mc": 3, "clip_range": 0.002, "kl_coef": 0.3, "memory_bounded": memory_bounded}
    if budget is not None:
        algo["update_memory_mb"] = budget
    config = make_config(algo, optim={"micro_batch_size": 4})
    policy = make_policy(config)
    algorithm, batch = prepared(config, policy)
    return algorithm, policy, batch


def _step_gradients(algorithm, policy, batch):
    """The gradient at step 1, after one SGD step away from theta_old (so the two paths differ in pass 1)."""
    optimizer = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=20.0)
    policy.zero_grad(set_to_none=True)
    algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    optimizer.step()
    policy.zero_grad(set_to_none=True)
    metrics = algorithm.accumulate_gradients(policy, batch, torch.arange(N), step=1)
    return metrics, grads(policy)


@pytest.mark.parametrize(("budget", "fixed"), [(1e6, False), (1e-6, True)])
def test_auto_takes_the_path_its_budget_allows_bit_for_bit(budget, fixed):
    auto, policy, batch = _algorithm("auto", budget)
    metrics, g_auto = _step_gradients(auto, policy, batch)
    fixed_algorithm, policy_fixed, batch_fixed = _algorithm(fixed)
    _, g_fixed = _step_gradients(fixed_algorithm, policy_fixed, batch_fixed)
    assert metrics["update/full_graph"] == float(not fixed) and metrics["update/budget_mb"] == budget
    for a, b in zip(g_auto, g_fixed, strict=True):
        assert torch.equal(a, b)


def test_the_measured_graph_times_the_graphs_is_what_the_full_update_saves():
    """One (pair, micro-batch) graph, measured, times n_mc x micro-batches equals the saved tensors of the whole
    full-graph forward (6 samples in micro-batches of 4 and 2: within the smaller last micro-batch's share)."""
    auto, policy, batch = _algorithm("auto", 1e6)
    auto.accumulate_gradients(policy, batch, torch.arange(N), step=0)
    choice = auto.update_choice
    assert choice is not None and choice.graph_mb > 0
    pairs, idx = batch.payload.pairs, torch.arange(N)

    def whole_forward():
        return sum(
            auto.pair_terms(policy, batch.samples, batch.cond, pairs, j, idx[start : start + 4]).surrogate.sum()
            for j in range(pairs.n_mc)
            for start in (0, 4)
        )

    _, whole = saved_tensor_bytes(whole_forward, exclude=policy.parameters())
    assert whole / MB <= choice.full_graph_mb
    assert whole / MB >= choice.full_graph_mb * (3 * 4 + 3 * 2) / (3 * 4 + 3 * 4) * 0.9


def test_a_budget_without_auto_is_refused_naming_both_keys():
    with pytest.raises(ValueError, match=r"update_memory_mb=.*memory_bounded=auto"):
        make_config({"name": "vgrpo", "update_memory_mb": 100.0})


def test_the_default_config_dumps_without_the_budget():
    dumped = make_config({"name": "vgrpo"}).algorithm.model_dump()
    assert "update_memory_mb" not in dumped and dumped["memory_bounded"] is True
    assert make_config({"name": "vgrpo", "memory_bounded": "auto"}).algorithm.model_dump()["memory_bounded"] == "auto"
