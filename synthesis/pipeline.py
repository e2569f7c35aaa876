"""The synthesis pipeline over a run directory: SkelBuilder stages 1-3, ScenGenerator,
registration. Each stage reads the previous stage's output file, writes its own, and is
skipped on a rerun once ``done`` (see :mod:`.rundir`); running a stage marks every later
stage stale.

Stages (``STAGES``)::

    skel_1_descriptions  seeds.jsonl            -> environment descriptions (judge, infer, dedup)
    skel_2_candidates    descriptions           -> classes, tools derived via /v1/validate
    skel_3_quality       candidates             -> dual-agent quality reports; env_metadata.json
    scen_scenarios       env_metadata.json      -> scenarios; env_scenarios.json
    register             both EnvScaler files   -> /v1/environments, /v1/scenarios (registered.json)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandpit.client import Client
from sandpit.client.llm import ModelClient, ModelError
from sandpit.importers.envscaler import import_files

from .batch import run_items
from .records import (
    EnvCandidate,
    EnvDescription,
    ItemError,
    QualityReport,
    Rejection,
    ScenarioDraft,
    SeedTask,
    StageOutput,
)
from .rundir import STAGES, RunDir, write_json
from .scen import generate_scenarios, scenario_records
from .settings import SynthSettings
from .skel import build_environment, check_environment, deduplicate, describe_task, environment_metadata

ProgressFactory = Callable[[str, int], Callable[[], None]]
"""``factory(stage, total) -> advance``: one progress bar per stage (the CLI uses rich)."""


class SeedFileError(ValueError):
    """The seed file is missing, or a line is not a JSON object with a non-empty ``task``."""


class StageInputMissing(RuntimeError):
    """A stage was asked to run before the stage it reads from has produced its output."""


def read_seeds(path: Path) -> list[SeedTask]:
    """Seed tasks from JSON lines (``{"task": str, "task_id"?: str}``; blank lines skipped;
    ``task_id`` defaults to ``seed<line>``).

    Raises:
        SeedFileError: unreadable file, a bad line (its number in the message), duplicate ids.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SeedFileError(f"{path}: {exc}") from None
    seeds: list[SeedTask] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            raise SeedFileError(f"{path}:{number}: not JSON") from None
        if not isinstance(value, dict) or not isinstance(value.get("task"), str) or not value["task"].strip():
            raise SeedFileError(f"{path}:{number}: expected an object with a non-empty 'task' string")
        task_id = str(value.get("task_id") or value.get("id") or f"seed{number:04d}")
        seeds.append(SeedTask(task_id=task_id, task=value["task"].strip()))
    ids = Counter(s.task_id for s in seeds)
    duplicates = [i for i, n in ids.items() if n > 1]
    if duplicates:
        raise SeedFileError(f"{path}: duplicate task ids: {', '.join(duplicates[:5])}")
    return seeds


class Pipeline:
    """Runs the stages of one run directory.

    Args:
        run: the run directory (manifest, outputs).
        settings: model and pipeline settings.
        client: the Sandpit API client every piece of generated code goes through.
        llm: model access (default: built from ``settings``, cache in ``run/llm_cache``).
        progress: progress bar factory (see :data:`ProgressFactory`); None for none.
    """

    def __init__(self, run: RunDir, settings: SynthSettings, client: Client, *, llm: ModelClient | None = None,
                 progress: ProgressFactory | None = None) -> None:
        self.run = run
        self.settings = settings
        self.client = client
        self.llm = llm or settings.model_client(settings.cache_dir or run.file("llm_cache"))
        self.progress = progress
        self.started_at = datetime.now(UTC).isoformat()

    def close(self) -> None:
        """Record this invocation's model usage in the manifest and close the model client."""
        self.run.manifest["runs"].append({"started_at": self.started_at,
                                          "finished_at": datetime.now(UTC).isoformat(),
                                          "usage": self.llm.usage.as_dict()})
        self.run.manifest["settings"] = self.settings.public()
        self.run.save()
        self.llm.close()

    # -- helpers -------------------------------------------------------------------------
    @contextmanager
    def _bar(self, stage: str, total: int) -> Iterator[Callable[[], None] | None]:
        yield self.progress(stage, total) if self.progress else None

    def _input(self, stage: str, name: str) -> Any:
        if not self.run.stage_done(stage):
            status = (self.run.manifest["stages"].get(stage) or {}).get("status", "not run")
            raise StageInputMissing(f"stage {stage} is {status}: run (or rerun) it first")
        try:
            return self.run.read(name)
        except (OSError, ValueError):
            raise StageInputMissing(f"{name} is missing in {self.run.path}: run stage {stage} first") from None

    def _finish(self, stage: str, output: StageOutput, extra: dict[str, Any] | None = None) -> StageOutput:
        counts = {"items": len(output.items), "rejected": len(output.rejected), "errors": len(output.errors)}
        self.run.finish_stage(stage, {"stage": stage, **output.model_dump(mode="json"), **(extra or {})},
                              partial=bool(output.errors), counts=counts)
        self.run.invalidate_after(stage)
        return output

    def set_seeds(self, path: Path) -> list[SeedTask]:
        """Copy the seed tasks into the run (``seeds.jsonl``); different seeds than the
        run's mark every stage stale. Raises :class:`SeedFileError`."""
        seeds = read_seeds(path)
        text = "".join(json.dumps(s.model_dump(), ensure_ascii=False) + "\n" for s in seeds)
        target = self.run.file("seeds.jsonl")
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            for entry in self.run.manifest["stages"].values():
                entry["status"] = "stale"
            self.run.save()
        return seeds

    def seeds(self) -> list[SeedTask]:
        """The run's seed tasks. Raises :class:`StageInputMissing` before :meth:`set_seeds`."""
        if not self.run.file("seeds.jsonl").exists():
            raise StageInputMissing(f"no seeds.jsonl in {self.run.path}: give --seeds")
        return read_seeds(self.run.file("seeds.jsonl"))

    # -- stages ----------------------------------------------------------------------------
    def describe(self) -> StageOutput:
        """SkelBuilder stage 1 (see :func:`.skel.describe_task`, :func:`.skel.deduplicate`)."""
        seeds = self.seeds()
        with self._bar("skel_1_descriptions", len(seeds)) as advance:
            output = run_items(seeds, lambda s: s.task_id, lambda s: describe_task(s, self.llm, self.settings),
                               concurrency=self.settings.max_concurrency, on_item=advance)
        if self.settings.dedup and not output.errors:
            descriptions = [EnvDescription.model_validate(i) for i in output.items]
            try:
                kept, duplicates = deduplicate(descriptions, self.llm, self.settings.dedup_threshold)
            except ModelError as exc:
                output.errors.append(ItemError(key="dedup", error=str(exc)))
            else:
                output.items = [d.model_dump(mode="json") for d in kept]
                output.rejected.extend(duplicates)
        return self._finish("skel_1_descriptions", output)

    def build(self) -> StageOutput:
        """SkelBuilder stage 2 (see :func:`.skel.build_environment`)."""
        descriptions = [EnvDescription.model_validate(i)
                        for i in self._input("skel_1_descriptions", "skel_1_descriptions.json")["items"]]
        with self._bar("skel_2_candidates", len(descriptions)) as advance:
            output = run_items(descriptions, lambda d: d.env_id,
                               lambda d: build_environment(d, self.llm, self.client, self.settings),
                               concurrency=self.settings.max_concurrency, on_item=advance)
        return self._finish("skel_2_candidates", output)

    def check(self) -> StageOutput:
        """SkelBuilder stage 3 (see :func:`.skel.check_environment`); writes the kept
        environments to ``env_metadata.json`` (EnvScaler environment metadata)."""
        candidates = [EnvCandidate.model_validate(i)
                      for i in self._input("skel_2_candidates", "skel_2_candidates.json")["items"]]
        with self._bar("skel_3_quality", len(candidates)) as advance:
            output = run_items(candidates, lambda c: c.env_id,
                               lambda c: check_environment(c, self.llm, self.client, self.settings),
                               concurrency=self.settings.max_concurrency, on_item=advance)
        by_id = {c.env_id: c for c in candidates}
        metadata: dict[str, Any] = {}
        for item in output.items:
            report = QualityReport.model_validate(item)
            if report.kept:
                metadata[report.env_id] = environment_metadata(by_id[report.env_id], report)
            else:
                output.rejected.append(Rejection(
                    key=report.env_id, reason="quality check",
                    detail=f"pass_acc {report.pass_acc:.2f} (min {self.settings.min_pass_acc}), not_fail_acc "
                           f"{report.not_fail_acc:.2f} (min {self.settings.min_not_fail_acc}) over "
                           f"{report.total_count} tool calls"))
        write_json(self.run.file("env_metadata.json"), metadata)
        return self._finish("skel_3_quality", output, {"kept": sorted(metadata)})

    def scenarios(self) -> StageOutput:
        """ScenGenerator (see :func:`.scen.generate_scenarios`); writes
        ``env_scenarios.json`` (EnvScaler scenario format)."""
        self._input("skel_3_quality", "skel_3_quality.json")
        metadata: dict[str, dict[str, Any]] = self._input("skel_3_quality", "env_metadata.json")
        with self._bar("scen_scenarios", len(metadata)) as advance:
            output = run_items(list(metadata), lambda env_id: env_id,
                               lambda env_id: generate_scenarios(env_id, metadata[env_id], self.llm, self.client,
                                                                 self.settings),
                               concurrency=self.settings.max_concurrency, on_item=advance)
        drafts = [ScenarioDraft.model_validate(i) for i in output.items]
        write_json(self.run.file("env_scenarios.json"), scenario_records(drafts, metadata))
        return self._finish("scen_scenarios", output)

    def register(self) -> list[dict[str, Any]]:
        """Register the kept environments and their scenarios through the API
        (``sandpit.importers.envscaler.import_files``: each scenario is instantiated and its
        checks run once on the initial state). Writes ``registered.json``; returns its items."""
        self._input("scen_scenarios", "env_scenarios.json")
        envs, scenarios = self.run.file("env_metadata.json"), self.run.file("env_scenarios.json")
        total = len(self.run.read("env_metadata.json")) + len(self.run.read("env_scenarios.json"))
        with self._bar("register", total) as advance:
            reports = import_files(self.client, envs, scenarios, check=True,
                                   on_item=(lambda _r: advance()) if advance else None)
        items = [{"kind": r.kind, "key": r.key, "status": r.status, "sandpit_id": r.sandpit_id,
                  "reasons": r.reasons} for r in reports]
        write_json(self.run.file("registered.json"), items)
        rejected = sum(1 for r in reports if r.status == "refused")
        self.run.finish_stage("register", {}, partial=False,
                              counts={"items": len(items) - rejected, "rejected": rejected, "errors": 0})
        return items

    def run_all(self, *, register: bool = False) -> dict[str, str]:
        """Every stage in order, skipping ``done`` ones; stops after a ``partial`` stage
        (its unfinished items need a rerun first). Returns stage -> ``done`` |
        ``skipped`` | ``partial`` | ``not run``."""
        steps: list[tuple[str, Callable[[], Any]]] = [
            ("skel_1_descriptions", self.describe), ("skel_2_candidates", self.build),
            ("skel_3_quality", self.check), ("scen_scenarios", self.scenarios)]
        if register:
            steps.append(("register", self.register))
        outcome = {stage: "not run" for stage in STAGES}
        for stage, fn in steps:
            if self.run.stage_done(stage):
                outcome[stage] = "skipped"
                continue
            fn()
            outcome[stage] = self.run.manifest["stages"][stage]["status"]
            if outcome[stage] == "partial":
                break
        return outcome

    # -- report ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """:func:`summarize` of the run, with this invocation's model usage as ``usage``."""
        return {**summarize(self.run), "usage": self.llm.usage.as_dict()}


STAGE_LABELS = {"skel_1_descriptions": "describe", "skel_2_candidates": "build", "skel_3_quality": "check",
                "scen_scenarios": "scenarios"}


def summarize(run: RunDir) -> dict[str, Any]:
    """Counts for the final table from a run directory's files (no model or API call):
    seeds, candidates, built, kept, rejected by ``<stage>: <reason>``, scenarios, checks
    valid/total/flagged, unfinished items, registered environments and scenarios, and
    ``usage_total`` (model usage summed over the manifest's recorded invocations)."""
    def read(name: str) -> Any:
        try:
            return run.read(name)
        except (OSError, ValueError):
            return None

    rejected: Counter[str] = Counter()
    errors = 0
    for stage, label in STAGE_LABELS.items():
        data = read(f"{stage}.json") or {}
        for rejection in data.get("rejected", []):
            rejected[f"{label}: {rejection['reason']}"] += 1
        errors += len(data.get("errors", []))
    drafts = [ScenarioDraft.model_validate(i) for i in (read("scen_scenarios.json") or {}).get("items", [])]
    checks = [c for d in drafts for c in d.checks]
    registered = read("registered.json") or []
    seeds_path = run.file("seeds.jsonl")
    total: Counter[str] = Counter()
    for invocation in run.manifest.get("runs", []):
        total.update({k: v for k, v in (invocation.get("usage") or {}).items() if isinstance(v, int)})
    return {
        "seeds": len(read_seeds(seeds_path)) if seeds_path.exists() else 0,
        "candidates": len((read("skel_1_descriptions.json") or {}).get("items", [])),
        "built": len((read("skel_2_candidates.json") or {}).get("items", [])),
        "kept": len(read("env_metadata.json") or {}),
        "rejected": dict(sorted(rejected.items())),
        "scenarios": len(drafts),
        "checks_valid": sum(c.valid for c in checks),
        "checks_total": len(checks),
        "checks_flagged": sum(bool(c.flags) for c in checks),
        "unfinished": errors,
        "registered_environments": sum(1 for r in registered if r["kind"] == "environment"
                                       and r["status"] == "imported"),
        "registered_scenarios": sum(1 for r in registered if r["kind"] == "scenario" and r["status"] == "imported"),
        "usage_total": dict(total),
    }
