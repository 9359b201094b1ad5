"""One training step of a small MLP and a small conv net, float32 against CPU bfloat16 autocast,
in mpitensor and in torch in the same run, one thread each. Prints times and torch/mpitensor
ratios (above 1: mpitensor faster; no assertions); without torch, mpitensor's times alone.

    python benchmarks/autocast.py
"""

from __future__ import annotations

import time


def _step_fn(m, kind, amp):
    m.manual_seed(0)
    if kind == "mlp":
        net = m.nn.Sequential(m.nn.Linear(256, 512), m.nn.ReLU(), m.nn.Linear(512, 10))
        x = m.randn(64, 256)
    else:
        net = m.nn.Sequential(m.nn.Conv2d(3, 16, 3, padding=1), m.nn.ReLU(),
                              m.nn.Flatten(), m.nn.Linear(16 * 16 * 16, 10))
        x = m.randn(16, 3, 16, 16)
    y = m.randint(0, 10, (x.shape[0],))
    opt = m.optim.SGD(net.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        with m.autocast("cpu", enabled=amp):
            loss = m.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    return step


def _time(step, reps=20):
    step()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        best.append((time.perf_counter() - t0) / reps)
    return min(best)


def main() -> None:
    import mpitensor as mt

    try:
        import torch
    except ImportError:
        torch = None
        print("torch is not installed: its rows are left out (pip install torch==2.13.0)")
    mt.set_num_threads(1)
    if torch is not None:
        torch.set_num_threads(1)
    print(f"{'case':<16}{'mpitensor ms':>14}{'torch ms':>10}{'torch/mpitensor':>17}")
    for kind in ("mlp", "conv"):
        for amp in (False, True):
            ours = _time(_step_fn(mt, kind, amp))
            label = f"{kind} {'bf16' if amp else 'fp32'}"
            if torch is None:
                print(f"{label:<16}{ours * 1e3:>14.2f}")
                continue
            theirs = _time(_step_fn(torch, kind, amp))
            # above 1: mpitensor is faster (the ratio every benchmark here reports)
            print(f"{label:<16}{ours * 1e3:>14.2f}{theirs * 1e3:>10.2f}{theirs / ours:>17.2f}")
    lin, x = mt.nn.Linear(32, 32), mt.randn(8, 32)
    t = _time(lambda: lin(x), reps=2000)
    print(f"small Linear forward, autocast off: {t * 1e6:.1f} us")


if __name__ == "__main__":
    main()
