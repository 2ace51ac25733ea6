"""Emulated GPU compute for the training benchmark (ddp_synthetic.py
--emulate-gpu): a torchvision model's real parameters, buffers and
registration order (so DDP builds its real buckets and calls its real hooks),
whose forward and backward take the per-call times of a profile
(bench/models/<model>.profile, bench/train/profile_layers.py) waiting, not
computing, as the host CPU of a GPU node waits while its GPU computes.

The forward pass runs the profile's calls in order, each one an autograd
function that waits until its deadline (the forward's start plus the sum of
the times so far: a late wake-up does not add up). Backward runs them in
reverse: each call writes its parameters' gradients (a slice of this rank's
noise, so ranks differ), then waits until its deadline (backward's start plus
the backward times so far) and returns, so autograd hands DDP each gradient
in layer order at its time. The loss is the profile's last call.
"""

import itertools
import time

import torch

NOISE = 1 << 20  # elements of the repeated noise a gradient is cut from
OFFSETS = 4096  # distinct starting points in it, varied per parameter and step


def load_profile(path):
    """((batch, image side), [(module name, forward s, backward s)]) of a
    .profile file."""
    shape, rows = {}, []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            for key in ("batch", "image"):
                if line.startswith("# %s:" % key):
                    shape[key] = int(line.split(":", 1)[1])
            if line.startswith("#") or not line.strip():
                continue
            try:
                name, fwd, bwd = line.split()
                rows.append((name, int(fwd) * 1e-6, int(bwd) * 1e-6))
            except ValueError:
                raise ValueError("%s:%d: expected '<module> <forward us> <backward us>', got %r"
                                 % (path, number, line.strip())) from None
    if len(shape) != 2 or not rows:
        raise ValueError("%s: no '# batch:' or '# image:' line, or no rows" % path)
    return (shape["batch"], shape["image"]), rows


def wait_until(deadline):
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _Call(torch.autograd.Function):
    """One profiled call: waits in forward and in backward, where it also
    writes its parameters' gradients."""

    @staticmethod
    def forward(ctx, carrier, emu, index, *params):
        ctx.emu, ctx.index = emu, index
        emu.forward_call(index)
        return carrier.clone()

    @staticmethod
    def backward(ctx, grad):
        return (grad, None, None) + ctx.emu.backward_call(ctx.index)


class EmulatedModel(torch.nn.Module):
    """`model`'s parameters with `profile`'s compute times. forward(data)
    returns a one-element tensor; loss() makes the loss from it."""

    def __init__(self, model, profile, rank):
        super().__init__()
        self.net = model  # registered: DDP sees its parameters and buffers
        (self.batch, self.image), rows = profile
        modules = dict(model.named_modules())
        missing = [name for name, _, _ in rows if name != "loss" and name not in modules]
        if missing:
            raise ValueError("the profile names modules the model lacks: %s" % missing[:5])
        index = {id(p): i for i, p in enumerate(model.parameters())}
        owned, self.calls = set(), []
        for name, fwd, bwd in rows:
            module = modules.get(name) if name != "loss" else None
            # a parameter's gradient comes from its first call's backward
            # (the last to run), once even where modules share it
            params = [p for p in (module.parameters(recurse=False) if module else [])
                      if id(p) not in owned]
            owned.update(id(p) for p in params)
            self.calls.append((fwd, bwd, params, [index[id(p)] for p in params]))
        unprofiled = len(index) - len(owned)
        if unprofiled:
            raise ValueError("%d parameters belong to no profiled call (only parameters "
                             "of leaf modules are profiled)" % unprofiled)
        self.forward_deadlines = list(itertools.accumulate(c[0] for c in self.calls))
        # backward's deadlines, per call: the backward times of the calls after it
        backward = list(itertools.accumulate(c[1] for c in reversed(self.calls)))
        self.backward_deadlines = list(reversed(backward))
        gen = torch.Generator().manual_seed(1000 + rank)
        self.noise = torch.randn(NOISE + OFFSETS, generator=gen) * 1e-2
        self.iteration = 0
        self.start = self.backward_start = 0.0
        self.done = [None] * len(self.calls)  # backward: each call's return, s after its start

    def forward(self, data):
        if data.shape[0] != self.batch or data.shape[-1] != self.image:
            raise ValueError("the profile was taken at batch %d of %dx%d images, not %d of %dx%d"
                             % (self.batch, self.image, self.image, data.shape[0],
                                data.shape[-1], data.shape[-1]))
        self.iteration += 1
        self.start = time.perf_counter()
        self.backward_start = None
        self.done = [None] * len(self.calls)
        x = torch.zeros(1, requires_grad=True)
        for i, (_, _, params, _) in enumerate(self.calls):
            x = _Call.apply(x, self, i, *params)
        return x

    @staticmethod
    def loss(out, _target=None):
        return out.sum()

    def forward_call(self, i):
        wait_until(self.start + self.forward_deadlines[i])

    def backward_call(self, i):
        if self.backward_start is None:
            self.backward_start = time.perf_counter()
        _, _, params, indices = self.calls[i]
        grads = tuple(self.gradient(p, j) for p, j in zip(params, indices))
        wait_until(self.backward_start + self.backward_deadlines[i])
        self.done[i] = time.perf_counter() - self.backward_start
        return grads

    def gradient(self, param, j):
        """A new tensor shaped as `param`: the noise from an offset that
        depends on the parameter and the step, repeated."""
        out = torch.empty_like(param)
        flat, n = out.view(-1), param.numel()
        off = (j * 97 + self.iteration) % OFFSETS
        whole = n // NOISE
        if whole:
            flat[:whole * NOISE].view(whole, NOISE).copy_(
                self.noise[off:off + NOISE].expand(whole, NOISE))
        rest = n - whole * NOISE
        flat[whole * NOISE:].copy_(self.noise[off:off + rest])
        return out

    def backward_order(self):
        """Indices into model.parameters() in the order backward produces
        their gradients."""
        return [j for c in reversed(self.calls) for j in reversed(c[3])]

    def last_backward(self, first_bucket_bytes):
        """(s the last backward computed, s until DDP's first bucket was
        ready) after its start, measured. DDP's rebuilt first bucket takes
        gradients in the order they became ready until it holds at least
        first_bucket_bytes (torch's _DEFAULT_FIRST_BUCKET_BYTES)."""
        if None in self.done:
            raise RuntimeError("backward has not run through every call")
        filled, first = 0, None
        for i in reversed(range(len(self.calls))):
            filled += sum(p.numel() * p.element_size() for p in self.calls[i][2])
            if filled >= first_bucket_bytes:
                first = self.done[i]
                break
        end = self.done[0]
        return end, first if first is not None else end

