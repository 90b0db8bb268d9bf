"""How qstat prints jobs: the JSON of `-F json`, the `-f` text, and Torque's renaming.

Layouts copied from real captures (tests/unit/adapters/fixtures/pbs/SOURCES.md), so the
adapter's parsers read the simulator exactly as they read a real server.
"""

from __future__ import annotations

import json
import time

SERVER = "pbssim"
VERSION = "22.05.11"


def _wrap(key: str, value: str) -> list[str]:
    """'    key = value' wrapped like qstat: at commas where it can, tab-indented, ~78 cols."""
    lines, line = [], f"    {key} = "
    width = 78
    pieces = [p + "," for p in value.split(",")]
    pieces[-1] = pieces[-1][:-1]
    for piece in pieces:
        cols = len(line.expandtabs())
        if cols + len(piece) > width and line.strip() and not line.endswith("= "):
            lines.append(line)
            line = "\t"
            cols = 8
        while cols + len(piece) > width:
            room = width - cols
            line += piece[:room]
            lines.append(line)
            piece = piece[room:]
            line, cols = "\t", 8
        line += piece
    lines.append(line)
    return lines


def _flat(job: dict) -> list[tuple[str, str]]:
    items = []
    for key, value in job.items():
        if key == "Variable_List":
            items.append((key, ",".join(f"{k}={v}" for k, v in value.items())))
        elif isinstance(value, dict):
            items.extend((f"{key}.{k}", str(v)) for k, v in value.items())
        else:
            items.append((key, str(value)))
    return items


def as_torque(job: dict) -> dict:
    rename = {"Exit_status": "exit_status", "stime": "start_time", "obittime": "comp_time"}
    out = {}
    for key, value in job.items():
        if key in ("substate", "exec_vnode", "history_timestamp", "project", "obittime"):
            if key == "obittime":
                out["comp_time"] = value
            continue
        out[rename.get(key, key)] = value
    if out.get("job_state") == "F":
        out["job_state"] = "C"
    return out


def format_full(job_id: str, job: dict) -> str:
    lines = [f"Job Id: {job_id}"]
    for key, value in _flat(job):
        lines.extend(_wrap(key, value))
    return "\n".join(lines) + "\n\n"


def format_json(jobs: dict[str, dict]) -> str:
    doc = {"timestamp": int(time.time()), "pbs_version": VERSION, "pbs_server": SERVER}
    if jobs:
        doc["Jobs"] = jobs
    return json.dumps(doc, indent=4, separators=(",", ":")) + "\n"


def format_table(jobs: dict[str, dict]) -> str:
    out = ["Job id            Name             User              Time Use S Queue",
           "----------------  ---------------- ----------------  -------- - -----"]
    for job_id, job in jobs.items():
        used = job.get("resources_used", {}).get("cput", "0")
        out.append(f"{job_id[:16]:<17} {job['Job_Name'][:16]:<16} "
                   f"{job['Job_Owner'].split('@')[0][:16]:<17} {used:>8} {job['job_state']} "
                   f"{job['queue']}")
    return "\n".join(out) + "\n"
