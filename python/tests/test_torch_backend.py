"""torch.distributed with backend="gflow": every collective of the backend
against float64 references on 3 ranks, bootstrapped through
init_process_group's own store (worker_backend.py)."""

from conftest import assert_all_ok, launch


def test_backend_three_ranks():
    assert_all_ok(launch(3, ["worker_backend.py"], style="torchrun", timeout=120))


def test_backend_two_ranks():
    assert_all_ok(launch(2, ["worker_backend.py"], style="torchrun", timeout=120))


def test_list_forms_match_gloo():
    # allreduce_coalesced of aliased and strided tensors, and the future
    # values of allgather with several inputs and allgather_coalesced, on a
    # gloo group and a gflow group of the same job (worker_gloo_forms.py).
    ranks = launch(3, ["worker_gloo_forms.py"], style="torchrun", timeout=120)
    assert_all_ok(ranks)
    assert all("same as gloo" in r.stdout for r in ranks), [r.stdout for r in ranks]
