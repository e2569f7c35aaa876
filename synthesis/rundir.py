"""The run directory: stage outputs, the manifest, and resumption.

Layout (``<run>/``)::

    manifest.json              stages done/partial, counts, settings (no key), usage, timestamps
    seeds.jsonl                the seed tasks as given
    skel_1_descriptions.json   SkelBuilder stage 1: environment descriptions
    skel_2_candidates.json     SkelBuilder stage 2: assembled, validated classes
    skel_3_quality.json        SkelBuilder stage 3: dual-agent quality reports
    env_metadata.json          kept environments, EnvScaler environment metadata format
    scen_scenarios.json        ScenGenerator drafts (every check with its validation)
    env_scenarios.json         EnvScaler scenario format (valid check functions only)
    registered.json            Sandpit ids after ``--register``
    llm_cache/                 cached model answers (unless SANDPIT_SYNTH_CACHE_DIR)

A stage is ``done`` when every item finished (kept or rejected) and ``partial`` when
some item could not finish because the model endpoint or the API was unavailable; a
``done`` stage is skipped on a rerun, a ``partial`` one is run again, and the cache
makes its finished model calls free.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STAGES = ("skel_1_descriptions", "skel_2_candidates", "skel_3_quality", "scen_scenarios", "register")
"""Stage names in pipeline order (each is also its output file's stem)."""


def write_json(path: Path, value: Any) -> None:
    """Write ``value`` as indented JSON atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    os.replace(tmp, path)


class RunDir:
    """One run's directory (created if missing) and its ``manifest.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.manifest_path = path / "manifest.json"
        self.manifest: dict[str, Any] = self._read_manifest()

    def _read_manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data.setdefault("format", 1)
        data.setdefault("created_at", datetime.now(UTC).isoformat())
        data.setdefault("stages", {})
        data.setdefault("runs", [])
        return data

    def save(self) -> None:
        """Write the manifest."""
        write_json(self.manifest_path, self.manifest)

    def file(self, name: str) -> Path:
        """``<run>/<name>``."""
        return self.path / name

    def read(self, name: str) -> Any:
        """JSON content of ``<run>/<name>``. Raises FileNotFoundError, ValueError."""
        return json.loads(self.file(name).read_text(encoding="utf-8"))

    def unfinished(self, stage: str) -> list[dict[str, str]]:
        """The items ``stage`` could not finish, as its output file records them:
        ``[{"key", "error"}]`` (the item and why: the model endpoint or the API's
        answer). Empty when the stage has no output file or finished every item."""
        try:
            data = self.read(f"{stage}.json")
        except (OSError, ValueError):
            return []
        errors = data.get("errors") if isinstance(data, dict) else None
        return [{"key": str(e.get("key", "")), "error": str(e.get("error", ""))}
                for e in errors or [] if isinstance(e, dict)]

    def stage_done(self, stage: str) -> bool:
        """True when ``stage`` finished every item and its output file exists."""
        entry = self.manifest["stages"].get(stage) or {}
        return entry.get("status") == "done" and (stage == "register" or self.file(f"{stage}.json").exists())

    def finish_stage(self, stage: str, output: dict[str, Any], *, partial: bool, counts: dict[str, int]) -> None:
        """Write ``<stage>.json`` and record the stage as ``done`` or ``partial`` with counts."""
        if stage != "register":
            write_json(self.file(f"{stage}.json"), output)
        self.manifest["stages"][stage] = {"status": "partial" if partial else "done", "counts": counts,
                                          "finished_at": datetime.now(UTC).isoformat()}
        self.save()

    def invalidate_after(self, stage: str) -> None:
        """Mark every stage after ``stage`` as not done (its input changed)."""
        for later in STAGES[STAGES.index(stage) + 1:]:
            if later in self.manifest["stages"]:
                self.manifest["stages"][later]["status"] = "stale"
        self.save()
