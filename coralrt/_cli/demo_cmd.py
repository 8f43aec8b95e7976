"""``coralrt demo``: build the built-in classifier, run it, show where it ran.

Needs no model file and no Edge TPU: the model is made in memory by
:mod:`coralrt._cli.demo_model` and runs on the simulated Edge TPU (``--target sim``, the
default) or on the CPU.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from coralrt._cli._text import dumps, shape_str, table
from coralrt._cli.run_cmd import count_type, timed_runs
from coralrt._cli.demo_model import build_demo_model, demo_input
from coralrt import _targets as targets
from coralrt._session import InferenceSession

__all__ = ["add_parser", "command", "placement"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "demo", parents=parents, help="run the built-in demo classifier (no files needed)",
        description="Build coralrt's small uint8 demo image classifier in memory, run it "
                    "on a synthetic image and show the operators, where each ran, the "
                    "top-5 classes and the latency.")
    p.add_argument("--save", metavar="PATH", default=None,
                   help="also write the demo model to this .tflite file")
    p.add_argument("--runs", type=count_type(1), default=20, metavar="N",
                   help="timed runs for the latency median (default: 20)")
    p.add_argument("--threads", type=count_type(1), default=None, metavar="N",
                   help="CPU backend threads (default: the backend's choice)")
    p.add_argument("--target", choices=targets.names(hardware=False, first="sim"), default="sim",
                   help="sim (default): compile for the Edge TPU and run on the simulated "
                        "Edge TPU; cpu: the whole model in the CPU backend")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command)


def placement(sess: InferenceSession, model) -> list[tuple[int, str, str]]:
    """``(operator index, operator name, where it ran)`` for each operator of ``model``.

    On the ``cpu`` target the whole model runs in one CPU backend; on ``sim``
    the compiler's placement says which Edge TPU segment or CPU step ran it.
    """
    info = sess.compile_info
    if not info or not info.get("placement"):
        where = f"{sess.target} ({sess.backend})"
        return [(i, op.name, where) for i, op in enumerate(model.main.operators)]
    rows = []
    for i, (op, (unit, segment, reason)) in enumerate(zip(model.main.operators,
                                                          info["placement"])):
        where = (f"Edge TPU segment {segment} (simulated)" if unit == "tpu"
                 else f"cpu ({sess.backend}): {reason}")
        rows.append((i, op.name, where))
    return rows


def command(args) -> int:
    model = build_demo_model()
    data = model.to_bytes()
    if args.save:
        Path(args.save).write_bytes(data)
    sess = InferenceSession(model, target=args.target, num_threads=args.threads)
    image = demo_input()
    outputs, times = timed_runs(sess, image, repeat=args.runs, warmup=1)
    out_info = sess.get_outputs()[0]
    probs = out_info.dequantize(outputs[out_info.name]).reshape(-1)

    sg = model.main
    ops = Counter(op.name for op in sg.operators)
    top = sorted(range(probs.size), key=lambda i: (-probs[i], i))[:5]
    device = (sum(s["device_seconds"] for s in sess.profile() if s["kind"] == "tpu")
              if args.target == "sim" else None)
    if args.json:
        print(dumps({
            "model_bytes": len(data), "saved": args.save, "target": sess.target,
            "backend": sess.backend, "operators": dict(ops),
            "placement": [{"index": i, "operator": name, "ran_on": where}
                          for i, name, where in placement(sess, model)],
            "top5": [{"class": i, "probability": float(probs[i])} for i in top],
            "latency_ms": {"median": statistics.median(times), "min": min(times),
                           "runs": len(times)},
            "estimated_device_ms": None if device is None else device * 1e3}))
        return 0
    lines = [f"coralrt demo: a {len(sg.operators)}-operator uint8 image classifier built "
             f"in memory, {len(data):,} bytes"]
    if args.save:
        lines.append(f"saved to {args.save}")
    lines += ["", "model"]
    io_rows = [[kind, t.name, shape_str(t.shape), t.dtype.name, f"{t.quantization[0]:.6g}",
                t.quantization[1]]
               for kind, t in [("input", sess.get_inputs()[0]), ("output", out_info)]]
    lines.append(table(["", "name", "shape", "dtype", "scale", "zero point"], io_rows,
                       right={5}))
    lines += ["", f"operators ({len(sg.operators)})",
              table(["operator", "count"], [[k, v] for k, v in ops.items()], right={1})]
    rows = [[i, name, shape_str(sg.tensors[sg.operators[i].outputs[0]].shape), where]
            for i, name, where in placement(sess, model)]
    lines += ["", f"placement (target {sess.target})",
              table(["#", "operator", "output", "ran on"], rows, right={0})]
    lines += ["", "top-5 classes of the synthetic input",
              table(["rank", "class", "probability"],
                    [[k + 1, i, f"{probs[i]:.4f}"] for k, i in enumerate(top)],
                    right={0, 1, 2})]
    lines += ["", f"latency  median {statistics.median(times):.3f} ms over {len(times)} runs "
                  f"(min {min(times):.3f} ms) on this host"]
    if device is not None:
        lines.append(f"estimated on a Coral USB Accelerator (USB 3): {device * 1e3:.3f} ms "
                     f"per inference (coralrt's latency model, not a measurement)")
    print("\n".join(lines))
    return 0
