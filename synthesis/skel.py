"""SkelBuilder (EnvScaler, arXiv 2601.05808, section "SkelBuilder"): seed tasks ->
environment descriptions -> environment classes -> quality-checked environments.

Stage 1, :func:`describe_task` + :func:`deduplicate`: judge whether a task needs a
stateful, domain-specific environment; infer its summary and introduction; optionally
drop near-duplicate descriptions by embedding cosine similarity.

Stage 2, :func:`build_environment`: state space (entities, attributes), constraints and
rules, the class definition, the operation list (query vs modify), each method's code,
the assembled class. Parsed on the host (``ast.parse``) and checked with the static
policy (``check_source``: AST analysis only); then ``POST /v1/validate`` (kind
``environment``) loads and instantiates the class *in a sandbox* and derives its tools.

Stage 3, :func:`check_environment`: test initial states, then EnvScaler's dual-agent loop:
a testing agent makes tool calls (positive and negative cases) on a real env created
through ``POST /v1/envs``; a checking agent judges each from the method's code, the
observation and the state diff (pass / warning / fail). Kept when ``pass_acc`` and
``not_fail_acc`` clear the thresholds.

No function here executes generated code: it goes to the Sandpit API as text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from sandpit.client import Client, EnvHandle, InvalidRequest, NotFound, PayloadTooLarge, StepResult
from sandpit.client.llm import ModelClient
from sandpit.policy import check_source

from .ask import ask
from .parsing import (
    MalformedOutput,
    assemble_class,
    extract_code,
    extract_function,
    extract_json,
    find_class,
    json_object,
    parse_module,
    python_identifier,
)
from .prompts import prompt_name, render
from .records import (
    CallCase,
    EnvCandidate,
    EnvDescription,
    Operation,
    QualityReport,
    Rejected,
    Rejection,
    SeedTask,
)
from .settings import SynthSettings

MAX_PROMPT_STATE_CHARS = 12_000


def _dump(value: Any, limit: int = MAX_PROMPT_STATE_CHARS) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=1, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "\n... (truncated)"


def _rules(rules: list[str]) -> str:
    return "\n".join(f"- {r}" for r in rules) or "(none)"


# -- stage 1 ---------------------------------------------------------------------------------
def describe_task(seed: SeedTask, llm: ModelClient, settings: SynthSettings) -> EnvDescription:
    """EnvScaler SkelBuilder stage 1, steps 1-2: judge statefulness, infer the environment.

    Returns the description (``env_id`` = ``env_<task_id>``).

    Raises:
        Rejected: ``not stateful``, or ``malformed output`` after ``settings.attempts``.
        ModelError: the model endpoint failed.
    """
    def judged(text: str) -> dict[str, Any]:
        return json_object(text, {"stateful": bool})

    verdict = ask(llm, render("judge_stateful", task=seed.task), judged, attempts=settings.attempts,
                  what="stateful judgement")
    if not verdict["stateful"]:
        raise Rejected("not stateful", str(verdict.get("reason", ""))[:500])

    def described(text: str) -> dict[str, Any]:
        value = json_object(text, {"environment_summary": str, "environment_introduction": str})
        if not value["environment_summary"].strip() or not value["environment_introduction"].strip():
            raise MalformedOutput("environment_summary and environment_introduction must not be empty")
        return value

    info = ask(llm, render("infer_environment", task=seed.task), described, attempts=settings.attempts,
               what="environment description")
    score = {k: info[k] if isinstance(info.get(k), int) and not isinstance(info.get(k), bool) else None
             for k in ("usefulness", "modelability")}
    slug = re.sub(r"[^A-Za-z0-9_]+", "_", seed.task_id)[:60]
    return EnvDescription(env_id=f"env_{slug}", task_id=seed.task_id, task=seed.task,
                          environment_summary=info["environment_summary"].strip(),
                          environment_introduction=info["environment_introduction"].strip(), **score)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def deduplicate(descriptions: list[EnvDescription], llm: ModelClient,
                threshold: float) -> tuple[list[EnvDescription], list[Rejection]]:
    """EnvScaler SkelBuilder stage 1, optional step 3: embed ``summary + introduction``
    (the endpoint's embeddings API) and drop each description whose cosine similarity to
    an earlier kept one is >= ``threshold``.

    Returns (kept in input order, rejections with reason ``duplicate``).

    Raises:
        ModelError: the embeddings endpoint failed.
    """
    if len(descriptions) < 2:
        return list(descriptions), []
    vectors = llm.embed([f"{d.environment_summary}\n{d.environment_introduction}" for d in descriptions])
    kept: list[tuple[EnvDescription, list[float]]] = []
    rejected: list[Rejection] = []
    for description, vector in zip(descriptions, vectors, strict=True):
        twin = next(((d, s) for d, v in kept if (s := _cosine(vector, v)) >= threshold), None)
        if twin is None:
            kept.append((description, vector))
        else:
            rejected.append(Rejection(key=description.env_id, reason="duplicate",
                                      detail=f"similarity {twin[1]:.3f} to {twin[0].env_id}"))
    return [d for d, _ in kept], rejected


# -- stage 2 ---------------------------------------------------------------------------------
def _state_space(text: str) -> dict[str, Any]:
    value = json_object(text, {"env_class_name": str, "state_space_definition": list, "constraints_rules": list})
    python_identifier(value["env_class_name"], "env_class_name")
    if not all(isinstance(e, dict) and isinstance(e.get("entity_name"), str) for e in value["state_space_definition"]):
        raise MalformedOutput("every state_space_definition item must be an object with an entity_name")
    value["constraints_rules"] = [str(r) for r in value["constraints_rules"]]
    return value


def _operations(text: str) -> list[Operation]:
    value = json_object(text, {"operation_list": list})
    operations: list[Operation] = []
    for item in value["operation_list"]:
        if not isinstance(item, dict):
            raise MalformedOutput("every operation_list item must be a JSON object")
        name = python_identifier(item.get("operation_name"), "operation_name")
        kind = item.get("operation_type")
        if kind not in ("query", "modify"):
            raise MalformedOutput(f"operation_type of {name!r} must be 'query' or 'modify', got {kind!r}")
        if name in {o.operation_name for o in operations}:
            raise MalformedOutput(f"operation {name!r} is listed twice")
        operations.append(Operation(operation_name=name, operation_type=kind,
                                    description=str(item.get("description", ""))))
    if not operations:
        raise MalformedOutput("operation_list must not be empty")
    return operations


def build_environment(description: EnvDescription, llm: ModelClient, client: Client,
                      settings: SynthSettings) -> EnvCandidate:
    """EnvScaler SkelBuilder stage 2 (logic modeling), steps 1-6, for one description.

    Returns the candidate with its code and the tools the sandbox derived.

    Raises:
        Rejected: ``malformed output`` (a step's answers stayed malformed), ``policy``
            (static policy errors), ``validation`` (the sandbox could not load or
            instantiate the class, or the API refused the code).
        ModelError, TRANSIENT_API_ERRORS: resumable failures.
    """
    common = {"summary": description.environment_summary, "introduction": description.environment_introduction}
    space = ask(llm, render("state_space", task=description.task, **common), _state_space,
                attempts=settings.attempts, what="state space")
    class_name, rules = space["env_class_name"], space["constraints_rules"]

    def class_def(text: str) -> str:
        code = extract_code(text)
        find_class(parse_module(code), class_name)
        return code

    definition = ask(llm, render("class_definition", class_name=class_name, rules=_rules(rules),
                                 state_space=_dump(space["state_space_definition"]), **common),
                     class_def, attempts=settings.attempts, what="class definition")
    operations = ask(llm, render("operations", class_name=class_name, introduction=description.environment_introduction,
                                 task=description.task, class_def=definition.rstrip(), rules=_rules(rules)),
                     _operations, attempts=settings.attempts, what="operation list")
    for operation in operations:
        def method(text: str, name: str = operation.operation_name) -> str:
            code = extract_function(text, name)
            node = parse_module(code).body[-1]
            args = getattr(getattr(node, "args", None), "args", [])
            if not args or args[0].arg != "self":
                raise MalformedOutput(f"{name} must take self as its first parameter")
            return code

        operation.code = ask(llm, render("method_code", class_def=definition.rstrip(), rules=_rules(rules),
                                         operation_name=operation.operation_name,
                                         operation_type=operation.operation_type,
                                         description=operation.description),
                             method, attempts=settings.attempts, what=f"method {operation.operation_name}")
    try:
        code = assemble_class(definition, class_name, [o.code for o in operations])
    except MalformedOutput as exc:
        raise Rejected("malformed output", f"assembling the class: {exc}") from None
    report = check_source(code, settings.policy)  # AST analysis only: nothing runs
    if not report.passed:
        first = next(f for f in report.findings if f.severity == "error")
        raise Rejected("policy", f"line {first.line} {first.rule}: {first.message}")
    try:
        verdict = client.validate({"kind": "environment", "source_code": code, "class_name": class_name,
                                   "init_config": {}, "policy": settings.policy})
    except (InvalidRequest, PayloadTooLarge) as exc:
        raise Rejected("validation", exc.message) from None
    if verdict.get("verdict") != "valid":
        raise Rejected("validation", "; ".join(verdict.get("reasons") or ["invalid"])[:2000])
    tools = verdict.get("tools") or []
    derived = {t.get("function", {}).get("name") for t in tools}
    missing = [o.operation_name for o in operations if o.operation_name not in derived]
    if missing:
        raise Rejected("validation", f"operations that are not tools of the class: {', '.join(missing)}")
    return EnvCandidate(env_id=description.env_id, task=description.task,
                        environment_summary=description.environment_summary,
                        environment_introduction=description.environment_introduction,
                        state_space_definition=space["state_space_definition"], constraints_rules=rules,
                        env_class_name=class_name, env_class_def=definition, operation_list=operations,
                        env_class_code=code, tools=tools,
                        policy_findings=[f.to_dict() for f in report.findings if f.severity == "warning"])


# -- stage 3 ---------------------------------------------------------------------------------
def init_config_list(text: str, count: int) -> list[dict[str, Any]]:
    """Parse ``{"init_configs": [{...}, ...]}`` (at least one object; the first ``count``).

    Raises:
        MalformedOutput: not that shape.
    """
    value = json_object(text, {"init_configs": list})
    configs: list[dict[str, Any]] = value["init_configs"]
    if not configs or not all(isinstance(c, dict) for c in configs):
        raise MalformedOutput("init_configs must be a non-empty list of JSON objects")
    return configs[:count]


def _judgement(text: str) -> dict[str, Any]:
    value = json_object(text, {"result": str})
    if value["result"] not in ("pass", "warning", "fail"):
        raise MalformedOutput(f"result must be 'pass', 'warning' or 'fail', got {value['result']!r}")
    return value


def _case_header(content: str) -> tuple[Literal["positive", "negative"], str]:
    try:
        value = extract_json(content)
    except MalformedOutput:
        value = {}
    if not isinstance(value, dict):
        value = {}
    kind = value.get("case_type")
    return ("negative" if kind == "negative" else "positive"), str(value.get("thought", ""))[:500]


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return raw


def _step(env: EnvHandle, name: str, arguments: str) -> StepResult:
    """One tool call on the env; a call the API refuses (unknown tool, arguments not
    matching the schema: 422) becomes a ``rejected`` result the checking agent judges."""
    try:
        return env.step_call({"type": "function", "function": {"name": name, "arguments": arguments}},
                             include=["state_diff"])
    except InvalidRequest as exc:
        return StepResult(env_id=env.id, step=-1, observation=f"Error: {exc.message}", status="rejected",
                          duration_ms=0.0)


def check_environment(candidate: EnvCandidate, llm: ModelClient, client: Client, settings: SynthSettings) -> QualityReport:
    """EnvScaler SkelBuilder stage 3 (quality evaluation) for one candidate.

    For each test initial state: an env is created from the candidate's code through the
    API; the testing agent (chat with the env's tools) makes up to
    ``settings.max_test_calls`` tool calls, each stepped on the env (``include=state_diff``)
    and judged by the checking agent. Returns the report; ``kept`` says whether
    ``pass_acc >= min_pass_acc`` and ``not_fail_acc >= min_not_fail_acc``.

    Raises:
        Rejected: ``malformed output`` (test states or judgements), ``quality check`` (a
            test state does not instantiate, or no tool call was made).
        ModelError, TRANSIENT_API_ERRORS: resumable failures.
    """
    rules = _rules(candidate.constraints_rules)
    configs = ask(llm, render("test_configs", class_name=candidate.env_class_name, code=candidate.env_class_code,
                              rules=rules, count=settings.test_configs_per_env),
                  lambda text: init_config_list(text, settings.test_configs_per_env),
                  attempts=settings.attempts, what="test initial states")
    codes = {o.operation_name: o.code for o in candidate.operation_list}
    cases: list[CallCase] = []
    for config in configs:
        try:
            env = client.envs.create(source_code=candidate.env_class_code, class_name=candidate.env_class_name,
                                     init_config=config)
        except (InvalidRequest, PayloadTooLarge, NotFound) as exc:
            raise Rejected("quality check", f"test initial state does not instantiate: {exc.message}") from None
        with env:
            messages: list[dict[str, Any]] = render(
                "test_agent", class_name=candidate.env_class_name, rules=rules,
                introduction=candidate.environment_introduction, state=_dump(env.state()))
            for _ in range(settings.max_test_calls):
                reply = llm.chat(messages, env.tools, label=prompt_name(messages))
                if not reply.tool_calls:
                    break
                messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in reply.tool_calls]})
                case_type, thought = _case_header(reply.text)
                for call in reply.tool_calls:
                    result = _step(env, call.name, call.arguments)
                    verdict = ask(llm, render(
                        "judge_call", class_name=candidate.env_class_name, rules=rules, case_type=case_type,
                        method_code=codes.get(call.name, "(not a tool of this environment)"),
                        tool_call=f"{call.name}({call.arguments})", status=result.status,
                        observation=result.observation[:4000], state_diff=_dump(result.state_diff or {}, 4000)),
                        _judgement, attempts=settings.attempts, what=f"judging {call.name}")
                    cases.append(CallCase(step=len(cases), function=call.name, case_type=case_type, thought=thought,
                                          parameters=_arguments(call.arguments), status=result.status,
                                          observation=result.observation[:4000], state_diff=result.state_diff,
                                          result=verdict["result"],
                                          check_reason=str(verdict.get("error_reason") or verdict.get("analysis")
                                                           or "")[:1000]))
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result.observation[:4000]})
    total = len(cases)
    if total == 0:
        raise Rejected("quality check", "the testing agent made no tool call")
    passed = sum(c.result == "pass" for c in cases)
    warned = sum(c.result == "warning" for c in cases)
    pass_acc, not_fail_acc = passed / total, (passed + warned) / total
    return QualityReport(env_id=candidate.env_id, init_config_list=configs, cases=cases, total_count=total,
                         pass_count=passed, warning_count=warned, fail_count=total - passed - warned,
                         pass_acc=pass_acc, not_fail_acc=not_fail_acc,
                         kept=pass_acc >= settings.min_pass_acc and not_fail_acc >= settings.min_not_fail_acc)


def environment_metadata(candidate: EnvCandidate, quality: QualityReport) -> dict[str, Any]:
    """EnvScaler's environment metadata record (``filtered_env_metadata.json`` value)."""
    record = candidate.model_dump(mode="json", exclude={"env_id", "policy_findings"})
    record["init_config_list"] = quality.init_config_list
    record["func_test_result"] = {"summary": {
        "total_count": quality.total_count, "pass_count": quality.pass_count,
        "warning_count": quality.warning_count, "fail_count": quality.fail_count,
        "pass_acc": quality.pass_acc, "not_fail_acc": quality.not_fail_acc}}
    return record
