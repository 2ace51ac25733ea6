"""The training benchmark's emulated GPU compute (bench/train/emulate.py) and
its step bound (bench/train/ddp_synthetic.py, report.py): the schedule's
order and its deadlines (lower bounds only: a sleep never ends early, so they
cannot flake), that it waits rather than computes, per-rank gradients, the
profile's errors, and the bound's arithmetic. One process, no exchange."""

import os
import sys
import time

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "train"))
import emulate  # noqa: E402
import report  # noqa: E402

PROFILE = os.path.join(ROOT, "bench", "models", "resnet50.profile")


def resnet(rank=0):
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000)
    return model, emulate.EmulatedModel(model, emulate.load_profile(PROFILE), rank)


def one_step(emu, batch=16):
    """Runs forward and backward; returns (forward start, [(parameter index,
    time its gradient reached autograd)], thread CPU s, wall s)."""
    params = list(emu.net.parameters())
    seen = []
    hooks = [p.register_hook(lambda g, j=j: seen.append((j, time.perf_counter())))
             for j, p in enumerate(params)]
    cpu, wall = time.thread_time(), time.perf_counter()
    out = emu(torch.zeros(batch, 3, 32, 32))
    emu.loss(out).backward()
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    for h in hooks:
        h.remove()
    return seen, cpu, wall


def test_backward_gives_every_gradient_in_layer_order_no_earlier_than_its_deadline():
    model, emu = resnet()
    seen, _, wall = one_step(emu)
    calls = {j: i for i, c in enumerate(emu.calls) for j in c[3]}
    # one call's parameters (a weight and a bias) arrive together, in either order
    order = [calls[j] for j, _ in seen]
    assert order == [calls[j] for j in emu.backward_order()]
    assert sorted(j for j, _ in seen) == list(range(len(list(model.parameters()))))
    # ResNet-50 runs its parameters' modules in registration order
    assert order == sorted(order, reverse=True)
    assert emu.backward_order()[:2] == [160, 159]  # fc.bias, fc.weight
    for j, t in seen:
        assert t >= emu.backward_start + emu.backward_deadlines[calls[j]]
    _, rows = emulate.load_profile(PROFILE)
    assert wall >= sum(f + b for _, f, b in rows)
    assert emu.done[0] >= emu.backward_deadlines[0]


def test_it_waits_instead_of_computing():
    _, emu = resnet()
    one_step(emu)  # the first step allocates
    _, cpu, wall = one_step(emu)
    # The real model computes for the whole profile (about 0.4 s); the
    # emulation writes 100 MB of gradients in that time and sleeps.
    assert cpu < 0.5 * wall


def test_gradients_differ_between_ranks_and_repeat_for_a_rank():
    grads = []
    for rank in (0, 1, 0):
        model, emu = resnet(rank)
        one_step(emu)
        grads.append([p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))
    assert not any(torch.equal(a, b) for a, b in zip(grads[0], grads[1]))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads[0])


def test_first_bucket_is_ready_when_the_gradients_that_fill_it_are():
    model, emu = resnet()
    one_step(emu)
    end, first = emu.last_backward(1 << 20)
    fc = [i for i, c in enumerate(emu.calls) if c[2] and c[2][0] is model.fc.weight][0]
    assert first == emu.done[fc]  # fc's 8 MB fill DDP's first bucket of 1 MiB
    assert end == emu.done[0] and first < end
    assert emu.last_backward(1 << 40)[1] == end  # a cap nothing fills: all of backward


def test_the_profile_and_the_batch_are_checked(tmp_path):
    bad = tmp_path / "bad.profile"
    bad.write_text("# batch: 16\n# image: 32\nconv1 10\n")
    with pytest.raises(ValueError, match=r"bad.profile:3: expected"):
        emulate.load_profile(str(bad))
    bad.write_text("conv1 10 20\n")
    with pytest.raises(ValueError, match="no '# batch:' or '# image:' line"):
        emulate.load_profile(str(bad))
    model = torchvision.models.resnet18(num_classes=10)
    with pytest.raises(ValueError, match="lacks"):
        emulate.EmulatedModel(model, emulate.load_profile(PROFILE), 0)
    partial = ((16, 32), [("conv1", 1e-5, 1e-5), ("loss", 1e-5, 1e-5)])
    with pytest.raises(ValueError, match="belong to no profiled call"):
        emulate.EmulatedModel(model, partial, 0)
    _, emu = resnet()
    with pytest.raises(ValueError, match="batch 16 of 32x32 images, not 8 of 32x32"):
        emu(torch.zeros(8, 3, 32, 32))
    with pytest.raises(ValueError, match="not 16 of 64x64"):
        emu(torch.zeros(16, 3, 64, 64))


def test_the_bound_and_the_wire_bytes():
    ddp = pytest.importorskip("ddp_synthetic")
    # forward 100 + max(backward 300, first bucket 50 + 125 MB at 1 Gbit/s) + optimizer 20
    assert ddp.step_bound_s([100, 0, 20], [300, 50], 125e6, "1gbit") == pytest.approx(1.17)
    assert ddp.step_bound_s([100, 0, 20], [300, 50], 12.5e6, "1gbit") == pytest.approx(0.42)
    assert ddp.step_bound_s([100, 0, 20], [300, 50], 0, None) == pytest.approx(0.42)
    assert ddp.step_bound_s([100, 0, 20], [300, 50], 1e6, None) is None
    assert ddp.step_bound_s([100, 0, 20], [300, 50], None, "1gbit") is None
    assert ddp.step_bound_s([None, 0, 20], [300, 50], 0, None) is None
    # MTU 1500: a 1448-byte segment in a 1514-byte frame
    assert report.wire_bytes(1448, 1500) == pytest.approx(1514)
    assert report.wire_bytes(1000, None) == 1000
