"""PageRank by power iteration with coralrt.gp: the matrix products and the damping
run as int8 tile models on Edge TPUs, and are checked against numpy in float64.

    python examples/gp_pagerank.py --target sim
    python examples/gp_pagerank.py --nodes 500 --iterations 40 --target sim

The graph is random (``--seed``): every node links to a few others, more often to
low-numbered "popular" nodes, so the ranking has a clear head.  Each iteration is

    r <- d * (r @ M^T) + (1 - d) / n

with M the column-stochastic link matrix: ``r @ M^T`` is ``ctx.matmul`` (M^T is the
constant operand of its tile models), the damping ``ctx.mul`` and ``ctx.add``; the
host then divides r by its sum, as 8-bit rounding would otherwise let the total
rank drift.  numpy runs the same iterations in float64.

The int8 scales of r and of the results are part of each tile model; coralrt.gp rounds
them to a coarse grid so that iterations whose ranges are close share models, but the
first iterations still build new ones: cheap on ``sim``, while on a real stick
(``--target coral``) each one is a run of edgetpu_compiler or a compile service call.
"""

import argparse
import time

import numpy as np

from coralrt import gp


def random_graph(n: int, seed: int) -> np.ndarray:
    """The column-stochastic link matrix M (M[j, i] = 1 / outdegree(i) for i -> j)."""
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, n + 1) ** 0.8
    links = np.zeros((n, n))
    for i in range(n):
        p = popularity.copy()
        p[i] = 0.0                                     # no self-links
        out = rng.choice(n, size=int(rng.integers(2, 12)), replace=False, p=p / p.sum())
        links[out, i] = 1.0
    return links / links.sum(axis=0)                   # every node has out-links


def pick_target(target: str) -> str:
    if target == "auto":
        try:
            from coralrt import list_devices
            return "coral" if list_devices() else "cpu"
        except Exception:                    # no libusb, no permission: no sticks
            return "cpu"
    return target


def main():
    parser = argparse.ArgumentParser(description="PageRank with coralrt.gp.")
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--damping", type=float, default=0.85)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--top", type=int, default=10, help="how many top nodes to print")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()
    n, d = args.nodes, args.damping
    mt = random_graph(n, args.seed).T                  # r @ M^T = (M r)^T
    damp = np.full((1, n), d)
    teleport = np.full((1, n), (1 - d) / n)

    target = pick_target(args.target)
    start = time.perf_counter()
    with gp.Context(target=target) as ctx:
        r = np.full((1, n), 1.0 / n)
        for _ in range(args.iterations):
            r = ctx.add(ctx.mul(damp, ctx.matmul(r, mt)), teleport)
            r /= r.sum()                               # on the host, in float64
        stats = ctx.stats()
    seconds = time.perf_counter() - start

    ref = np.full((1, n), 1.0 / n)
    for _ in range(args.iterations):
        ref = d * (ref @ mt) + (1 - d) / n
    r, ref = r[0], ref[0]

    k = args.top
    top, ref_top = np.argsort(-r)[:k], np.argsort(-ref)[:k]
    print(f"PageRank of a random graph: {n} nodes, {int((mt > 0).sum())} links, "
          f"damping {d}, target: {target}")
    print(f"{args.iterations} iterations in {seconds:.1f} s "
          f"({sum(stats['jobs'])} tile jobs, estimated device time "
          f"{sum(stats['device_seconds']) * 1e3:.1f} ms)")
    print(f"top {k} nodes:")
    print("  rank  node  coralrt.gp  numpy float64")
    for i, node in enumerate(top):
        print(f"  {i + 1:4d}  {node:4d}  {r[node]:.6f}    {ref[node]:.6f}")
    err = r - ref
    print(f"max abs diff: {np.abs(err).max():.3e} (largest rank {ref.max():.3e})")
    print(f"relative L1: {np.abs(err).sum() / np.abs(ref).sum():.3%}")
    same = "yes" if list(top) == list(ref_top) else "no"
    print(f"top-{k} ranking agrees with numpy: {same}"
          f" ({len(set(top) & set(ref_top))} of {k} nodes in both)")


if __name__ == "__main__":
    main()
