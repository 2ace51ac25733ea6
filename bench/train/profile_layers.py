"""Profiles a torchvision model's layers on this CPU for the emulated-GPU mode
of the training benchmark (bench/train/emulate.py): each leaf module call, in
the order the forward pass makes them, with its forward and backward time,
written as bench/models/<model>.profile.

    python3 bench/train/profile_layers.py --model resnet50 > bench/models/resnet50.profile

Each call is timed alone on the input it got in a forward pass of the whole
model (the median of --repeats runs, after one untimed), forward with
autograd recording and backward from a random output gradient. A module
called more than once (ResNet's ReLU in a bottleneck) has a row per call.
The loss (cross entropy on the logits) is the last row, "loss". The header
gives the sums beside the whole model's forward and backward, timed the same
way, so a reader sees what the per-call timing leaves out.
"""

import argparse
import platform
import statistics
import time

import torch
import torchvision


def calls(model, data):
    """[(name, module, input)] of every leaf module call in one forward pass."""
    seen = []
    names = {m: n for n, m in model.named_modules()}

    def record(module, inputs, _):
        seen.append((names[module], module, inputs[0].detach().clone()))

    hooks = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    with torch.no_grad():
        logits = model(data)
    for h in hooks:
        h.remove()
    return seen, logits


def call_times(fn, repeats):
    """(forward, backward) median seconds of `repeats` runs after an untimed
    one: fn() with autograd recording, then backward from a random gradient
    of its output."""
    fwd, back = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        grad = torch.randn_like(out)
        t2 = time.perf_counter()
        out.backward(grad)
        fwd.append(t1 - t0)
        back.append(time.perf_counter() - t2)
    return statistics.median(fwd[1:]), statistics.median(back[1:])


def layer_times(module, x, repeats, input_grad):
    """(forward, backward) of one call of `module` on x (backward computing
    x's gradient too when input_grad)."""
    leaf = x.requires_grad_(input_grad)
    return call_times(lambda: module(leaf), repeats)


def loss_times(logits, target, repeats):
    x = logits.detach().requires_grad_()
    return call_times(lambda: torch.nn.functional.cross_entropy(x, target), repeats)


def whole_model(model, data, target, repeats):
    def step():
        model.zero_grad(set_to_none=True)
        return torch.nn.functional.cross_entropy(model(data), target)
    return call_times(step, repeats)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a torchvision.models name")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--image", type=int, default=32, help="side of the square images")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(num_classes=1000)
    data = torch.randn(args.batch, 3, args.image, args.image)
    target = torch.randint(0, 1000, (args.batch,))
    whole = whole_model(model, data, target, args.repeats)
    seen, logits = calls(model, data)
    rows = []
    for i, (name, module, x) in enumerate(seen):
        inplace = getattr(module, "inplace", None)
        if inplace:
            module.inplace = False  # a leaf input must not be modified in place
        rows.append((name,) + layer_times(module, x, args.repeats, i > 0))
        if inplace:
            module.inplace = True
    rows.append(("loss",) + loss_times(logits, target, args.repeats))
    fwd, back = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print("# Per-call compute times of torchvision.models.%s (bench/train/profile_layers.py):"
          % args.model)
    print("# batch %d, image %dx%d, %d torch thread(s), torch %s, cpu: %s; median of %d runs"
          % (args.batch, args.image, args.image, args.threads, torch.__version__, cpu_name(),
             args.repeats))
    print("# sums: forward %.1f ms, backward %.1f ms; the whole model: forward %.1f ms, "
          "backward %.1f ms" % (1e3 * fwd, 1e3 * back, 1e3 * whole[0], 1e3 * whole[1]))
    print("# batch: %d" % args.batch)
    print("# image: %d" % args.image)
    print("# Format: <module> <forward us> <backward us>, in the forward pass's call order")
    for name, f, b in rows:
        print("%s %d %d" % (name, round(1e6 * f), round(1e6 * b)))


if __name__ == "__main__":
    main()
