"""Seed files, the run manifest and resumption, on SkelBuilder stage 1 (which needs the
model only): not-stateful and malformed seeds are rejected and reported, near-duplicate
descriptions dropped by embedding similarity, and an interrupted stage (the endpoint has
no answer for one seed) resumes without repeating finished model calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_openai import Rule, ScriptedLLM
from sandpit.client import Client
from sandpit.synthesis.pipeline import Pipeline, SeedFileError, StageInputMissing, read_seeds, summarize
from sandpit.synthesis.rundir import RunDir
from sandpit.synthesis.settings import SynthSettings

P = "# sandpit-prompt "
LIBRARY = {"environment_summary": "City library lending",
           "environment_introduction": "A city library with books and members who borrow books."}


def js(value: object) -> str:
    return "```json\n" + json.dumps(value) + "\n```"


def rules() -> list[Rule]:
    return [
        Rule(contains=[P + "judge_stateful", "2+2"], content=js({"stateful": False, "reason": "arithmetic"})),
        Rule(contains=[P + "judge_stateful"], content=js({"stateful": True})),
        Rule(contains=[P + "infer_environment", "Dune"], content=js(LIBRARY)),
        Rule(contains=[P + "infer_environment", "Emma"], content=js(LIBRARY)),  # a near-identical environment
        Rule(contains=[P + "infer_environment", "parcel"], content="A parcel warehouse, I believe."),
    ]


def write_seeds(path: Path, tasks: list[str]) -> Path:
    path.write_text("".join(json.dumps({"task_id": f"s{i}", "task": t}) + "\n" for i, t in enumerate(tasks)))
    return path


def pipeline(run: Path, server: ScriptedLLM) -> Pipeline:
    settings = SynthSettings(base_url=server.base_url, model="scripted", retries=1, attempts=2,
                             dedup_threshold=0.95)
    client = Client("http://127.0.0.1:9")  # stage 1 never calls the Sandpit API
    return Pipeline(RunDir(run), settings, client, llm=settings.model_client(run / "llm_cache"))


def test_stage_one_rejects_reports_and_resumes(tmp_path: Path) -> None:
    seeds = write_seeds(tmp_path / "seeds.jsonl", ["Ada borrows Dune (B1).", "What is 2+2?",
                                                    "Track parcel P7 in the warehouse.", "Bo borrows Emma (B2).",
                                                    "Reserve a table at the Blue Fox."])
    run = tmp_path / "run"
    with ScriptedLLM(rules()) as server:
        first = pipeline(run, server)
        first.set_seeds(seeds)
        outcome = first.run_all()
        first.close()
        assert outcome["skel_1_descriptions"] == "partial" and outcome["skel_2_candidates"] == "not run"
        stage = json.loads((run / "skel_1_descriptions.json").read_text())
        assert [e["key"] for e in stage["errors"]] == ["s4"]  # no answer for the Blue Fox: unfinished
        asked = len(server.chat_requests())

        server.rules.insert(0, Rule(contains=[P + "infer_environment", "Blue Fox"], content=js({
            "environment_summary": "Restaurant reservations",
            "environment_introduction": "Tables, seats and evening bookings of one restaurant."})))
        second = pipeline(run, server)
        with pytest.raises(StageInputMissing, match="skel_1_descriptions is partial"):
            second.build()  # a partial stage is no input for the next one
        second.describe()
        second.close()
        new = server.chat_requests()[asked:]
    # only the unfinished seed reached the model again (stateful judgement was cached too)
    assert [m["messages"][0]["content"].split()[2] for m in new] == ["infer_environment"]
    stage = json.loads((run / "skel_1_descriptions.json").read_text())
    assert stage["errors"] == []
    assert [d["env_id"] for d in stage["items"]] == ["env_s0", "env_s4"]
    reasons = {r["key"]: r["reason"] for r in stage["rejected"]}
    assert reasons == {"s1": "not stateful", "s2": "malformed output", "env_s3": "duplicate"}
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["stages"]["skel_1_descriptions"]["status"] == "done"
    usage = manifest["runs"][1]["usage"]  # one chat and the dedup embeddings of the new set of descriptions
    assert usage["cached"] >= 5 and usage["requests"] == 2 and usage["by_prompt"] == {"infer_environment": 1}
    summary = summarize(RunDir(run))
    assert summary["rejected"] == {"describe: duplicate": 1, "describe: malformed output": 1,
                                   "describe: not stateful": 1}
    assert summary["seeds"] == 5 and summary["candidates"] == 2


def test_stages_refuse_to_run_without_their_input(tmp_path: Path) -> None:
    with ScriptedLLM(rules()) as server:
        p = pipeline(tmp_path / "run", server)
        with pytest.raises(StageInputMissing, match="seeds"):
            p.describe()
        with pytest.raises(StageInputMissing, match="skel_1_descriptions"):
            p.build()
        p.close()


def test_new_seeds_make_every_stage_stale(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.finish_stage("skel_1_descriptions", {"items": []}, partial=False, counts={})
    assert run.stage_done("skel_1_descriptions")
    with ScriptedLLM(rules()) as server:
        p = pipeline(tmp_path / "run", server)
        p.set_seeds(write_seeds(tmp_path / "a.jsonl", ["one"]))
        assert not p.run.stage_done("skel_1_descriptions")
        p.close()


@pytest.mark.parametrize("content, message", [
    ('{"task": "ok"}\nnot json\n', ":2: not JSON"),
    ('{"task": ""}\n', "non-empty 'task'"),
    ('{"task_id": "a", "task": "x"}\n{"task_id": "a", "task": "y"}\n', "duplicate task ids: a"),
])
def test_bad_seed_files(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "seeds.jsonl"
    path.write_text(content)
    with pytest.raises(SeedFileError, match=message):
        read_seeds(path)


def test_seed_ids_default_to_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "seeds.jsonl"
    path.write_text('\n{"task": "a"}\n{"task": "b", "id": "x"}\n')
    assert [(s.task_id, s.task) for s in read_seeds(path)] == [("seed0002", "a"), ("x", "b")]


def test_cli_stage_commands_resume_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sandpit.synth_cli import synth_app
    from typer.testing import CliRunner

    seeds = write_seeds(tmp_path / "seeds.jsonl", ["Ada borrows Dune (B1).", "Reserve a table at the Blue Fox."])
    run = str(tmp_path / "run")
    with ScriptedLLM(rules()) as server:
        for name, value in {"BASE_URL": server.base_url, "MODEL": "scripted", "RETRIES": "1"}.items():
            monkeypatch.setenv(f"SANDPIT_SYNTH_{name}", value)
        runner = CliRunner()
        first = runner.invoke(synth_app, ["describe", "--run-dir", run, "--seeds", str(seeds)])
        assert first.exit_code == 1 and "1 unfinished item(s): rerun to resume" in first.output
        [cause] = json.loads((tmp_path / "run" / "skel_1_descriptions.json").read_text())["errors"]
        assert cause["key"] == "s1" and cause["error"]
        assert f"  s1: {' '.join(cause['error'].splitlines())}\n" in first.output  # the recorded cause, as written
        refused = runner.invoke(synth_app, ["build", "--run-dir", run])
        assert refused.exit_code == 2 and "partial" in refused.output
        server.rules.insert(0, Rule(contains=[P + "infer_environment", "Blue Fox"], content=js({
            "environment_summary": "Restaurant", "environment_introduction": "Tables and bookings."})))
        second = runner.invoke(synth_app, ["describe", "--run-dir", run])
        assert second.exit_code == 0, second.output
        done = runner.invoke(synth_app, ["describe", "--run-dir", run])
        assert "is done" in done.output
    report = runner.invoke(synth_app, ["report", "--run-dir", run])
    assert report.exit_code == 0 and "environment candidates" in report.output
