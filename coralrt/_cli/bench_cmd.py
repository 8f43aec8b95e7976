"""``coralrt bench MODEL``: host time per run and, on the simulated Edge TPU,
the latency a real Coral USB Accelerator is estimated to take."""

from __future__ import annotations

import time

from coralrt._cli._progress import Progress
from coralrt._cli._report import device_estimate, estimate_lines
from coralrt._cli._text import dumps, table
from coralrt._cli.run_cmd import count_type, latency_summary, make_inputs
from coralrt._compile.partition import MODES
from coralrt import _targets as targets
from coralrt._session import InferenceSession
from coralrt.plugins._host import plugin_host
from coralrt._sim.latency import USB_RATES

__all__ = ["add_parser", "command"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "bench", parents=parents, help="time a model on the CPU or the simulated Edge TPU",
        description="Run a model repeatedly and report host time per run (min/median). On "
                    "--target sim, also report the estimated latency of a real Coral USB "
                    "Accelerator for the Edge TPU steps (a model calibrated on Coral's "
                    "published figures, not a measurement).")
    p.add_argument("model", metavar="MODEL", help="path of a .tflite model")
    p.add_argument("--target", choices=targets.names(hardware=False), default="sim")
    p.add_argument("--repeat", type=count_type(1), default=20, metavar="N",
                   help="timed runs (default 20)")
    p.add_argument("--warmup", type=count_type(0), default=2, metavar="N",
                   help="untimed runs first (default 2; the first sim run uploads parameters)")
    p.add_argument("--threads", type=count_type(1), default=None, metavar="N",
                   help="CPU backend threads")
    p.add_argument("--mode", choices=MODES, default="multi", help="partition mode for sim")
    p.add_argument("--usb", choices=sorted(USB_RATES), default="usb3",
                   help="USB speed the latency estimate assumes (default usb3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png",
                   help="also write a PNG of the per-run host times and, on sim, the "
                        "estimated Coral USB Accelerator time of each run (needs matplotlib: "
                        "pip install 'coralrt[plot]')")
    p.set_defaults(func=command)


def command(args) -> int:
    if args.plot:
        from coralrt._cli.bench_plot import require_matplotlib
        require_matplotlib()    # before the work: a missing extra fails at once
    progress = Progress.for_args(args)
    device = None
    if args.target == "sim":
        # The device target="sim" creates, with the USB speed asked for.
        host = plugin_host()
        device = host.devices.create("sim", kernels=host.ops.sim_kernels(), usb=args.usb)
        device.open()
    sess = InferenceSession(args.model, target=args.target, num_threads=args.threads,
                            partition_mode=args.mode, device=device,
                            plugins=progress.plugins())
    arrays, _ = make_inputs(sess.get_inputs(), None, args.seed)
    first = None
    times: list[float] = []
    device_ms: list[float] = []     # per timed run, for --plot on sim
    clock = time.perf_counter
    with progress.bar(total=args.warmup + args.repeat, desc="bench", unit="run") as bar:
        for k in range(args.warmup):
            sess.run(arrays)
            if k == 0:
                first = sess.profile()
            bar.update()
        for _ in range(args.repeat):
            t0 = clock()
            sess.run(arrays)
            times.append((clock() - t0) * 1e3)
            if args.plot and args.target == "sim":
                device_ms.append(sum(s["device_seconds"] or 0.0 for s in sess.profile()
                                     if s["kind"] == "tpu") * 1e3)
            bar.update()
    result = {"model": str(args.model), "target": sess.target,
              "host_ms": latency_summary(times), "steps": []}
    profile = sess.profile()
    for step in profile:
        result["steps"].append({
            "kind": step["kind"], "label": step["label"],
            "host_ms": round(step["host_seconds"] * 1e3, 4),
            "device_ms": None if step["device_seconds"] is None
            else round(step["device_seconds"] * 1e3, 4)})
    if args.target == "sim":
        result["estimate_ms"] = {**device_estimate(profile, first, usb=args.usb),
                                 "compile_cache_hit": sess.compile_info["cache_hit"]}
    sess.close()
    if device is not None:
        device.close()
    if args.plot:
        from coralrt._cli.bench_plot import plot_latencies
        plot_latencies(args.plot, model=str(args.model), target=sess.target, host_ms=times,
                       device_ms=device_ms if any(device_ms) else None, usb=args.usb)
    print(dumps(result) if args.json else _format(result))
    return 0


def _format(r: dict) -> str:
    h = r["host_ms"]
    lines = [f"model    {r['model']}", f"target   {r['target']}",
             f"host     min {h['min']:.3f} ms  median {h['median']:.3f} ms  "
             f"over {h['runs']} runs", ""]
    rows = [[i, s["kind"], s["label"], f"{s['host_ms']:.3f}",
             "" if s["device_ms"] is None else f"{s['device_ms']:.3f}"]
            for i, s in enumerate(r["steps"])]
    lines += ["steps (last run)", table(["#", "kind", "step", "host ms", "est. device ms"],
                                        rows, right={0, 3, 4})]
    e = r.get("estimate_ms")
    if e:
        lines += ["", *estimate_lines(e)]
    return "\n".join(lines)


