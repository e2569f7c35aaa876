"""ScenGenerator (EnvScaler, arXiv 2601.05808, section "ScenGenerator"): for each kept
environment, initial state configs, a task for each, a checklist per task and a check
function per checklist item.

Every check function is validated through ``POST /v1/validate`` (kind
``check_function``) on the scenario's real initial state, read from an env created
through the API: it must run and return a bool. A check for an item that expects a change
(``expects_change``) and is already true on the initial state is suspicious. Invalid or
suspicious check functions are regenerated with feedback, up to ``settings.attempts``
answers; a check still suspicious after that is kept with the flag
``true_on_initial_state``; one still invalid is dropped. A scenario without any valid
check function is rejected.
"""

from __future__ import annotations

import ast
from typing import Any

from sandpit.client import Client, InvalidRequest, NotFound, PayloadTooLarge
from sandpit.client.llm import ModelClient

from .ask import ask
from .parsing import MalformedOutput, extract_code, json_object, parse_module
from .prompts import prompt_name, render
from .records import CheckRecord, Rejected, Rejection, ScenarioDraft
from .settings import SynthSettings
from .skel import _dump, _rules, init_config_list


def _tools_text(tools: list[dict[str, Any]]) -> str:
    lines = []
    for tool in tools:
        function = tool.get("function", tool)
        params = ", ".join((function.get("parameters") or {}).get("properties", {}))
        lines.append(f"- {function.get('name')}({params}): {str(function.get('description', '')).strip()[:300]}")
    return "\n".join(lines) or "(none)"


def _checklist(text: str) -> list[CheckRecord]:
    value = json_object(text, {"checklist": list})
    items = []
    for entry in value["checklist"]:
        if isinstance(entry, str):
            entry = {"check_item": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("check_item"), str) or not entry["check_item"].strip():
            raise MalformedOutput("every checklist item must be an object with a non-empty check_item")
        items.append(CheckRecord(check_item=entry["check_item"].strip()[:4000],
                                 expects_change=bool(entry.get("expects_change", False))))
    if not items:
        raise MalformedOutput("the checklist must not be empty")
    return items


def _check_source(text: str) -> str:
    code = extract_code(text)
    tree = parse_module(code)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check_func"]
    if not functions:
        raise MalformedOutput("the code must define a module-level function check_func(final_state)")
    if len(functions[0].args.args) != 1:
        raise MalformedOutput("check_func must take exactly one parameter, final_state")
    return code


def generate_check(check: CheckRecord, task: str, initial_state: dict[str, Any], llm: ModelClient, client: Client,
                   settings: SynthSettings) -> CheckRecord:
    """EnvScaler ScenGenerator step 3 (check function) for one checklist item, validated
    and regenerated as the module docstring says. Returns ``check`` filled in (``valid``,
    ``attempts``, ``flags``, ``errors``); never raises :class:`Rejected`.

    Raises:
        ModelError, TRANSIENT_API_ERRORS: resumable failures.
    """
    history: list[dict[str, Any]] = render("check_function", task=task, check_item=check.check_item,
                                           state=_dump(initial_state))
    suspicious: str | None = None
    for attempt in range(1, settings.attempts + 1):
        check.attempts = attempt
        reply = llm.chat(history, label=prompt_name(history))
        problem: str | None = None
        try:
            code = _check_source(reply.text)
        except MalformedOutput as exc:
            problem = str(exc)
        else:
            try:
                verdict = client.validate({"kind": "check_function", "source_code": code, "cases": [
                    {"initial_state": initial_state, "final_state": initial_state}]})
            except (InvalidRequest, PayloadTooLarge) as exc:
                verdict = {"verdict": "invalid", "reasons": [exc.message], "cases": []}
            cases = verdict.get("cases") or []
            if verdict.get("verdict") != "valid":
                problem = "the check function is invalid: " + "; ".join(verdict.get("reasons") or ["?"])[:1500]
            elif check.expects_change and cases and cases[0].get("passed"):
                suspicious = code
                problem = ("the check function already returns True on the initial state, before any step, but the "
                           "item says something has been changed: compare final_state with initial_state")
            else:
                check.check_func, check.valid, check.flags = code, True, []
                return check
        check.errors.append(problem[:2000])
        history += [{"role": "assistant", "content": reply.text}, render("retry", error=problem)[1]]
    if suspicious is not None:
        check.check_func, check.valid, check.flags = suspicious, True, ["true_on_initial_state"]
    return check


def initial_state(client: Client, code: str, class_name: str, init_config: dict[str, Any]) -> dict[str, Any]:
    """The state right after instantiating the class with ``init_config``, read from an env
    created (and deleted) through the API.

    Raises:
        Rejected: ``invalid init_config`` (the API refused it, or instantiation failed).
    """
    try:
        with client.envs.create(source_code=code, class_name=class_name, init_config=init_config) as env:
            return env.state()
    except (InvalidRequest, PayloadTooLarge, NotFound) as exc:
        raise Rejected("invalid init_config", exc.message) from None


def generate_scenarios(env_id: str, record: dict[str, Any], llm: ModelClient, client: Client,
                       settings: SynthSettings) -> list[ScenarioDraft | Rejection]:
    """EnvScaler ScenGenerator steps 1-3 for one kept environment (its EnvScaler metadata
    ``record``). Returns one entry per initial state config: a draft (at least one valid
    check function) or the scenario's rejection (key ``<env_id>_t<i>``; reasons
    ``invalid init_config``, ``malformed output``, ``no valid check function``).

    Raises:
        Rejected: ``malformed output`` (the init configs themselves).
        ModelError, TRANSIENT_API_ERRORS: resumable failures.
    """
    class_name, code, tools = record["env_class_name"], record["env_class_code"], record.get("tools") or []
    configs = ask(llm, render("init_configs", class_name=class_name, code=code, count=settings.scenarios_per_env,
                              introduction=record.get("environment_introduction", ""),
                              rules=_rules(record.get("constraints_rules") or [])),
                  lambda text: init_config_list(text, settings.scenarios_per_env),
                  attempts=settings.attempts, what="scenario initial states")
    drafts: list[ScenarioDraft | Rejection] = []
    for index, config in enumerate(configs):
        task_id = f"{env_id}_t{index}"
        try:
            state = initial_state(client, code, class_name, config)
            task = ask(llm, render("scenario_task", class_name=class_name, tools=_tools_text(tools),
                                   introduction=record.get("environment_introduction", ""), state=_dump(state)),
                       lambda text: _task(text), attempts=settings.attempts, what="task")
            checklist = ask(llm, render("checklist", task=task, state=_dump(state), tools=_tools_text(tools)),
                            _checklist, attempts=settings.attempts, what="checklist")
        except Rejected as exc:
            drafts.append(Rejection(key=task_id, reason=exc.reason, detail=exc.detail[:2000]))
            continue
        checks = [generate_check(c, task, state, llm, client, settings) for c in checklist]
        if not any(c.valid for c in checks):
            last = "; ".join(c.errors[-1] for c in checks if c.errors)
            drafts.append(Rejection(key=task_id, reason="no valid check function", detail=last[:2000]))
            continue
        drafts.append(ScenarioDraft(env_id=env_id, task_id=task_id, task=task, init_config=config, checks=checks))
    return drafts


def _task(text: str) -> str:
    task: str = json_object(text, {"task": str})["task"]
    if not task.strip():
        raise MalformedOutput("task must not be empty")
    return task.strip()


def scenario_records(drafts: list[ScenarioDraft], metadata: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """EnvScaler scenario list (``env_scenario.json``) from the drafts."""
    return [d.envscaler(metadata[d.env_id]["env_class_name"]) for d in drafts if d.env_id in metadata]
