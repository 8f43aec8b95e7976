"""``coralrt bench MODEL``: host time per run and, on the simulated Edge TPU,
the latency a real Coral USB Accelerator is estimated to take."""

from __future__ import annotations

from coralrt.cli._report import device_estimate, estimate_lines
from coralrt.cli._text import dumps, table
from coralrt.cli.run_cmd import count_type, latency_summary, make_inputs, timed_runs
from coralrt.compile.partition import MODES
from coralrt.session import InferenceSession
from coralrt.plugins.host import plugin_host
from coralrt.sim.latency import USB_RATES

__all__ = ["add_parser", "command"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "bench", parents=parents, help="time a model on the CPU or the simulated Edge TPU",
        description="Run a model repeatedly and report host time per run (min/median). On "
                    "--target sim, also report the estimated latency of a real Coral USB "
                    "Accelerator for the Edge TPU steps (a model calibrated on Coral's "
                    "published figures, not a measurement).")
    p.add_argument("model", metavar="MODEL", help="path of a .tflite model")
    p.add_argument("--target", choices=("cpu", "sim"), default="sim")
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
    p.set_defaults(func=command)


def command(args) -> int:
    device = None
    if args.target == "sim":
        # The device target="sim" creates, with the USB speed asked for.
        host = plugin_host()
        device = host.devices.create("sim", kernels=host.ops.sim_kernels(), usb=args.usb)
        device.open()
    sess = InferenceSession(args.model, target=args.target, num_threads=args.threads,
                            partition_mode=args.mode, device=device)
    arrays, _ = make_inputs(sess.get_inputs(), None, args.seed)
    first = None
    if args.warmup:
        sess.run(arrays)
        first = sess.profile()
    _, times = timed_runs(sess, arrays, args.repeat, max(0, args.warmup - 1))
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


