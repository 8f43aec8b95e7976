"""Report pieces shared by ``coralrt run`` and ``coralrt bench``: the Coral USB
Accelerator latency that coralrt's latency model estimates for the Edge TPU
steps of a run on the simulated stick (``session.profile()``)."""

from __future__ import annotations

__all__ = ["device_estimate", "estimate_lines"]


def _tpu_ms(profile: list[dict]) -> float:
    return round(sum(s["device_seconds"] or 0.0 for s in profile if s["kind"] == "tpu") * 1e3, 4)


def device_estimate(profile: list[dict], first: list[dict] | None = None, *,
                    usb: str) -> dict:
    """Milliseconds per run for the Edge TPU steps of ``profile`` (the last run) and of
    ``first`` (the first run, which uploads the parameters), and the host time of
    the CPU steps, at the USB speed ``usb`` the simulated stick assumed."""
    cpu = sum(s["host_seconds"] for s in profile if s["kind"] == "cpu")
    e = {"usb": usb, "edgetpu": _tpu_ms(profile),
         "first_run_edgetpu": None if first is None else _tpu_ms(first),
         "cpu_steps_on_this_host": round(cpu * 1e3, 4)}
    if not any(s["kind"] == "tpu" for s in profile):
        # The session's note says why (no operator reached the Edge TPU).
        e["note"] = next((s["note"] for s in profile if s.get("note")),
                         "no Edge TPU step in the run")
    return e


def estimate_lines(e: dict) -> list[str]:
    """The text form of :func:`device_estimate`."""
    if e.get("note"):
        return [f"estimated Coral USB Accelerator latency: nothing to estimate ({e['note']})"]
    first = e.get("first_run_edgetpu")
    return [f"estimated Coral USB Accelerator latency ({e['usb']}, max clock): "
            f"{e['edgetpu']:.3f} ms per run for the Edge TPU steps"
            + (f" (first run {first:.3f} ms, uploading parameters)" if first is not None
               else ""),
            "(an estimate from coralrt's latency model, not a measurement)"]
