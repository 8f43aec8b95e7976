"""The self-test's checks that need the chip: Coral's compiled models on the stick
(first-run and warm latency, parameter caching) and the bit-for-bit comparison
with libedgetpu, run in child processes (:mod:`coralrt._selftest.libedgetpu`)."""

from __future__ import annotations

import hashlib
import importlib.util
import statistics
import time

import numpy as np

from coralrt.errors import CoralRTError
from coralrt._selftest import libedgetpu as L
from coralrt._selftest import models as M
from coralrt._selftest.checks import CHIP_REASON, fail, ok, skipped
from coralrt._selftest.report import Report

__all__ = ["synthetic_inputs", "short_name", "run_models", "compare_with_libedgetpu"]


def synthetic_inputs(infos) -> list[np.ndarray]:
    """Fixed pseudo-random inputs of the given shapes and dtypes (the same on every host)."""
    rng = np.random.default_rng(20240229)
    out = []
    for info in infos:
        dtype = np.dtype(info.dtype)
        shape = tuple(max(1, d) for d in info.shape)
        if dtype.kind in "iu":
            lim = np.iinfo(dtype)
            out.append(rng.integers(lim.min, int(lim.max) + 1, size=shape, dtype=dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def short_name(name: str) -> str:
    """A model's check name: its file name without ``_quant_edgetpu.tflite``."""
    for tail in ("_quant_edgetpu.tflite", "_edgetpu.tflite", ".tflite"):
        if name.endswith(tail):
            return name[: -len(tail)]
    return name


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def _run_on_stick(dev, path, repeat: int) -> dict:
    from coralrt._session import InferenceSession
    t = time.perf_counter()
    sess = InferenceSession(str(path), target="coral", device=dev)
    load = time.perf_counter() - t
    try:
        infos, outs = sess.get_inputs(), sess.get_outputs()
        inputs = synthetic_inputs(infos)
        feed = {i.name: a for i, a in zip(infos, inputs)}
        t = time.perf_counter()
        first_out = sess.run(feed)
        first = time.perf_counter() - t
        first_upload = dev.last_stats.parameter_upload_seconds
        warm, last_out = [], first_out
        for _ in range(repeat):
            t = time.perf_counter()
            last_out = sess.run(feed)
            warm.append(time.perf_counter() - t)
        warm_upload = dev.last_stats.parameter_upload_seconds
    finally:
        sess.close()
    names = [o.name for o in outs]
    outputs = [np.asarray(first_out[n]) for n in names]
    stable = all(np.array_equal(first_out[n], last_out[n]) for n in names)
    return {"inputs": inputs, "outputs": outputs, "names": names, "stable": stable,
            "load_seconds": load, "first_seconds": first, "warm": warm,
            "first_upload_seconds": first_upload, "warm_upload_seconds": warm_upload}


def _cpu_reference(path, inputs, outputs) -> dict:
    from coralrt._session import InferenceSession
    try:
        with InferenceSession(str(path), target="cpu") as sess:
            feed = {i.name: a for i, a in zip(sess.get_inputs(), inputs)}
            ref = sess.run(feed)
            want = [np.asarray(ref[o.name]) for o in sess.get_outputs()]
    except (CoralRTError, OSError) as e:
        return {"error": str(e)}
    if len(want) != len(outputs) or any(a.shape != b.shape for a, b in zip(want, outputs)):
        return {"error": "the plain model's outputs do not have the compiled model's shapes"}
    diff = max(int(np.max(np.abs(a.astype(np.int64) - b.astype(np.int64)))) for a, b in
               zip(want, outputs))
    return {"max_abs_difference": diff,
            "same_top1": bool(np.argmax(want[0]) == np.argmax(outputs[0]))}


def run_models(report: Report, dev, models_dir, download, models, base_url, repeat) -> list:
    results, caching = [], None
    for e in M.resolve_models(models_dir, download=download, models=models,
                              base_url=base_url):
        name = f"model:{short_name(e['model'].compiled)}"
        if e["compiled"] is None:
            report.add(skipped(name, e["problem"], needs_chip=True))
            continue
        try:
            r = _run_on_stick(dev, e["compiled"], repeat)
        except (CoralRTError, OSError) as exc:
            report.add(fail(name, f"{type(exc).__name__}: {exc}", file=str(e["compiled"])))
            continue
        warm = r["warm"]
        m = {"file": str(e["compiled"]), "sha256_pinned": e["pinned"],
             "load_ms": _ms(r["load_seconds"]), "first_run_ms": _ms(r["first_seconds"]),
             "warm_median_ms": _ms(statistics.median(warm)), "warm_min_ms": _ms(min(warm)),
             "warm_max_ms": _ms(max(warm)), "repeat": len(warm),
             "first_run_parameter_upload_ms": _ms(r["first_upload_seconds"]),
             "outputs": [{"name": n, "shape": list(a.shape), "dtype": str(a.dtype),
                          "sha256_16": _digest(a)} for n, a in zip(r["names"], r["outputs"])],
             "top1": int(np.argmax(r["outputs"][0])) if r["outputs"] else None}
        if e["plain"] is not None:
            m["cpu_reference"] = _cpu_reference(e["plain"], r["inputs"], r["outputs"])
        if not r["stable"]:
            report.add(fail(name, "the outputs of the first and the last run differ for the "
                            "same input", **m))
        else:
            report.add(ok(name, f"first run {m['first_run_ms']:.1f} ms, warm median "
                          f"{m['warm_median_ms']:.2f} ms over {len(warm)} runs", **m))
        r["entry"] = e
        results.append(r)
        if caching is None:
            caching = (e["model"].compiled, r)
    if caching is None:
        report.add(skipped("parameter-caching", "no compiled model ran on the stick",
                           needs_chip=True))
    else:
        name, r = caching
        m = {"model": name, "first_run_upload_ms": _ms(r["first_upload_seconds"]),
             "warm_run_upload_ms": _ms(r["warm_upload_seconds"])}
        if r["first_upload_seconds"] > 0 and r["warm_upload_seconds"] == 0:
            report.add(ok("parameter-caching", f"{name}: the parameters were uploaded on the "
                          f"first run ({m['first_run_upload_ms']:.1f} ms) and stayed cached "
                          f"on the stick after it", **m))
        else:
            report.add(fail("parameter-caching", f"{name}: expected an upload on the first "
                            f"run only, got {m['first_run_upload_ms']} ms then "
                            f"{m['warm_run_upload_ms']} ms", **m))
    # Keep the parameter-caching check next to the transport checks, before the models.
    checks = report.checks
    pc = next(i for i, c in enumerate(checks) if c.name == "parameter-caching")
    first_model = next((i for i, c in enumerate(checks) if c.name.startswith("model:")), pc)
    checks.insert(first_model, checks.pop(pc))
    return results


def _litert_missing() -> str | None:
    if importlib.util.find_spec("ai_edge_litert") or importlib.util.find_spec("tflite_runtime"):
        return None
    return "neither ai-edge-litert nor tflite-runtime is installed to load libedgetpu's delegate"


def compare_with_libedgetpu(report: Report, probe, results) -> None:
    p = probe()
    if p["status"] == "installed":
        report.add(ok("libedgetpu", f"{p['library']} loads in a child process"
                      + (f" ({p['path']})" if p.get("path") else ""), **p))
    elif p["status"] == "not installed":
        report.add(skipped("libedgetpu", f"{p['library']} is not installed: nothing to "
                           f"compare coralrt's outputs with", **p))
    else:
        report.add(skipped("libedgetpu", f"{p['library']} is installed but cannot be used "
                           f"here: {p.get('error')}", **p))
    if report.simulated:
        report.add(skipped("libedgetpu-comparison", CHIP_REASON, needs_chip=True))
        return
    why = (None if p["status"] == "installed" else "libedgetpu is not usable here (see the "
           "libedgetpu check)") or _litert_missing()
    if why is None and not results:
        why = "no compiled model ran on the stick"
    if why is not None:
        report.add(skipped("libedgetpu-comparison", why, needs_chip=True))
        return
    for r in results:
        name = f"libedgetpu:{short_name(r['entry']['model'].compiled)}"
        try:
            theirs, names = L.run_model(r["entry"]["compiled"], r["inputs"])
        except RuntimeError as e:
            report.add(fail(name, str(e)))
            continue
        same = (len(theirs) == len(r["outputs"])
                and all(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
                        for a, b in zip(theirs, r["outputs"])))
        m = {"outputs": len(theirs), "libedgetpu_output_names": names,
             "bit_exact": same}
        if same:
            report.add(ok(name, "outputs identical to libedgetpu's, bit for bit", **m))
        else:
            diffs = [int(np.count_nonzero(a != b)) if a.shape == b.shape else None
                     for a, b in zip(theirs, r["outputs"])]
            m["differing_elements"] = diffs
            report.add(fail(name, f"outputs differ from libedgetpu's ({diffs} elements)", **m))
