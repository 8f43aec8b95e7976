"""``coralrt plugins [--json]``: the plugins coralrt finds and what each provides.

Lists coralrt's own plugin, the installed ones (entry-point group
``coralrt``, with their distribution and version) and, for a broken one,
why it is skipped.  What a plugin provides is shown in one column per
category of the plugin contract (operators, rules, compilers, devices ...),
taken from :func:`coralrt.plugins._host.columns`: a registration hook added
to ``hookspecs.py`` appears here without a change to this command.

The plugins are loaded as a session would load them, except that nothing is
raised for a broken plugin (strict mode included) or a conflict between two
plugins: both are listed with their error.
"""

from __future__ import annotations

from coralrt import _config as config
from coralrt._cli._text import dumps, table

__all__ = ["add_parser", "command_plugins", "plugin_report", "format_plugins"]

STATUS_TEXT = {
    "loaded": "loaded",
    "skipped": "SKIPPED (broken)",
    "conflict": "CONFLICT",
    "disabled": "not loaded (autoload off)",
}


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "plugins", parents=parents, help="list the plugins and what each provides",
        description="List coralrt's own plugin and the installed plugins (entry-point group "
                    "'coralrt') with their distribution and version, whether each loaded "
                    "(a broken plugin is skipped, with its error), and the operators, Edge "
                    "TPU rules, compilers and devices each provides.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command_plugins)


def plugin_report() -> dict:
    """The listing as data: ``columns`` (what plugins can provide), ``plugins``
    (one dict per plugin, see :meth:`coralrt.plugins._loader.PluginRecord.to_dict`),
    ``autoload`` and ``strict`` (the settings a session would use)."""
    from coralrt.plugins._host import ENTRY_POINT_GROUP, PluginHost, columns
    host = PluginHost(survey=True)
    return {"entry_point_group": ENTRY_POINT_GROUP, "autoload": config.plugin_autoload(),
            "strict": config.plugins_strict(), "columns": columns(),
            "plugins": host.describe()}


def _origin(p: dict) -> str:
    if p["source"] == "builtin":
        return f"{p['distribution']} {p['version']} (built in)"
    if p["source"] == "installed":
        dist = " ".join(x for x in (p["distribution"], p["version"]) if x)
        return dist or "(unknown distribution)"
    return "explicit"


def format_plugins(report: dict) -> str:
    cols = report["columns"]
    rows = []
    for p in report["plugins"]:
        other = [h.removeprefix("coralrt_") for h in p["hooks"]
                 if not h.startswith("coralrt_register_")]
        rows.append([p["name"], _origin(p), STATUS_TEXT.get(p["status"], p["status"])]
                    + [", ".join(p["provides"].get(c, [])) or "-" for c in cols]
                    + [", ".join(other) or "-"])
    lines = [table(["plugin", "from", "status", *cols, "other hooks"], rows, indent="")]
    broken = [p for p in report["plugins"] if p["error"]]
    if broken:
        lines += ["", "not used:"]
        lines += [f"  {p['name']}: {p['error']}" for p in broken]
    lines.append("")
    if not report["autoload"]:
        lines.append(f"{config.DISABLE_PLUGIN_AUTOLOAD} is set: sessions load no installed "
                     f"plugin.")
    elif report["strict"]:
        lines.append(f"{config.PLUGINS_STRICT} is set: a broken installed plugin is an "
                     f"error.")
    else:
        lines.append(f"A broken installed plugin is skipped with a warning "
                     f"({config.PLUGINS_STRICT}=1 makes it an error);\n"
                     f"{config.DISABLE_PLUGIN_AUTOLOAD}=1 loads no installed plugin.")
    return "\n".join(lines)


def command_plugins(args) -> int:
    report = plugin_report()
    print(dumps(report) if args.json else format_plugins(report))
    return 0
