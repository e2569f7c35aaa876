"""EnvScaler's in-process episode, restated from its documented semantics, for parity tests.

This module is never imported by the tests' own process: the parity test sends its
source, together with ``child_render.py`` and an environment of our own, to ``POST
/v1/execute``, so the reference episode runs inside a sandbox exactly like any other
untrusted code. It mirrors EnvScaler's RL environment (``rl/roll/pipeline/agentic/env/
envscaler_env``: ``init_env_class``, ``init_env_instance``, ``get_state_info``,
``get_state_diff``, ``run_check_function``, ``calculate_reward``, ``step``): the module is
``dynamic_env``; the instance is ``cls(config)`` (``cls({})``), ``cls()`` after a
``TypeError``, then ``setattr`` of every key; the state is a deep copy of ``vars()``
without dunder keys; an action that names nothing on the instance (or has non-object
arguments) is ``Error: Invalid action``; one whose arguments do not parse is ``Error:
Failed to parse response to action``; ``chat_with_user`` ends a non-conversational episode
with ``Task finished`` and the reward; a tool that raises ends it with reward 0.0; the
reward is the mean of the checks' boolean results rounded to 4 places.

``run(source, class_name, init_config, checks, actions)`` returns one record per step:
``observation``, ``role`` (``tool``/``user``), ``terminated``, ``reward`` and ``state_diff``
rendered with ``render.render`` (the same rendering Sandpit serves).
"""

# No `from __future__ import annotations` here: exec() inherits the caller's future flags,
# and environment code (dataclasses among it) must compile as EnvScaler compiles it.
import copy
import json
import traceback
import types


def init_env_class(source: str, class_name: str) -> type:
    module = types.ModuleType("dynamic_env")
    exec(source, module.__dict__)  # noqa: S102 - runs only inside a sandbox
    if not hasattr(module, class_name):
        raise ValueError(f"Class '{class_name}' not found in provided env_class_code.")
    return getattr(module, class_name)


def init_env_instance(cls: type, init_config: dict | None) -> object:
    config = copy.deepcopy(init_config)
    try:
        instance = cls(config) if config and isinstance(config, dict) else cls({})
    except TypeError:
        instance = cls()
    if config:
        for key, value in config.items():
            setattr(instance, key, value)
    return instance


def state_info(instance: object) -> dict:
    return copy.deepcopy({k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))})


def state_diff(old: dict, new: dict) -> dict:
    out: dict = {}
    for key in set(old) | set(new):
        if key not in old:
            out[key] = {"added": new[key]}
        elif key not in new:
            out[key] = {"removed": old[key]}
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            nested = state_diff(old[key], new[key])
            if nested:
                out[key] = nested
        elif old[key] != new[key]:
            out[key] = {"changed": {"old": old[key], "new": new[key]}}
    return out


def run_check(source: str, initial: dict, final: dict) -> bool | None:
    scope = {"__builtins__": __builtins__, "initial_state": copy.deepcopy(initial)}
    try:
        exec(source, scope)  # noqa: S102 - runs only inside a sandbox
        if "check_func" not in scope:
            return None
        result = scope["check_func"](final)
    except Exception:  # noqa: BLE001 - a failing check counts as not passed
        return None
    return result if isinstance(result, bool) else None


def reward(checks: list[dict], initial: dict, final: dict) -> float:
    results = [run_check(c["check_func"], initial, final) for c in checks]
    return round(sum(r for r in results if r is not None) / len(results), 4)


def parse_action(action: dict) -> dict | None:
    """An OpenAI-style tool call ``{"function": {"name", "arguments"}}`` as ``{"name",
    "arguments"}``; None when its arguments do not parse to an object."""
    function = action["function"]
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return None
    if not function.get("name") or not isinstance(arguments, dict):
        return None
    return {"name": function["name"], "arguments": arguments}


def run(source: str, class_name: str, init_config: dict, checks: list, actions: list, render) -> list:
    instance = init_env_instance(init_env_class(source, class_name), init_config)
    initial = state_info(instance)
    last = initial
    records = []
    for raw in actions:
        action = parse_action(raw)
        terminated, score = False, 0.0
        if action is None:
            observation, role = "Error: Failed to parse response to action", "user"
        elif not (hasattr(instance, action["name"]) or action["name"] == "chat_with_user") or (
                action["name"] == "chat_with_user" and "content" not in action["arguments"]):
            observation, role = "Error: Invalid action", "user"
        elif action["name"] == "chat_with_user":
            observation, role, terminated = "Task finished", "user", True
            score = reward(checks, initial, state_info(instance))
        else:
            try:
                observation, role = f"{getattr(instance, action['name'])(**action['arguments'])}", "tool"
            except Exception:  # noqa: BLE001 - EnvScaler: the exception ends the episode
                observation, role, terminated = "Error: <Exception>\n" + traceback.format_exc(), "user", True
        current = state_info(instance)
        records.append({"observation": observation, "role": role, "terminated": terminated, "reward": score,
                        "state_diff": render(state_diff(last, current))[0]})
        last = current
        if terminated:
            break
    return records
