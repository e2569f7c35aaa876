"""EnvScaler's RL episode, restated from its documented semantics, for parity tests.

This file is never imported on the host: it is read as text and sent, with
``child_render.py`` and an environment, to ``POST /v1/execute`` (the parity test, ``sandpit
rl envscaler``), so the reference episode runs inside a sandbox exactly like any other
untrusted code. It restates, in our own words, EnvScaler's RL environment
(``rl/roll/pipeline/agentic/env/envscaler_env``: ``base_env.py``, ``rl_non_conv_env.py``,
``utils/env_util.py``, ``utils/parse_util.py``):

* ``reset``: ``random.seed(seed)`` when a seed is given; the environment's code is run as a
  module named ``dynamic_env`` (``exec`` without a file name, so its frames are
  ``<string>``); the instance is ``cls(config)`` (``cls({})`` for an empty one), ``cls()``
  after a ``TypeError``, then ``setattr`` of every key; the introduction is built from the
  record's ``environment_introduction`` and ``constraints_rules``; the tools are the
  record's own; the first observation is the task (kind ``user``);
* ``step``: raw text is structured (``<think>``, the first ``<tool_call>`` JSON object,
  the text around them; an unclosed tag, JSON that does not parse or lacks
  ``name``/``arguments`` fail with "struct response"); a structure is turned into an
  action (a call wins over text; text alone is ``chat_with_user``; string arguments are
  ``json.loads``-ed; anything failing is "to action"); validity is a truthy name the
  instance ``hasattr`` (or ``chat_with_user``) and object arguments (``content`` for
  ``chat_with_user``); ``chat_with_user`` ends the episode with ``Task finished`` and the
  reward; any other action's observation is ``f"{getattr(instance, name)(**arguments)}"``
  (kind ``tool``); an exception ends the episode with reward 0.0 and ``Error:
  <Exception>\\n`` + ``traceback.format_exc()``;
* the reward: the checks' boolean results (a check that raises or returns a non-bool
  gives ``None``) summed over their number, rounded to 4 places; each check runs with a
  deep copy of the initial state as its ``initial_state`` global.

One normalization, the one Sandpit documents: this module's own frames (its file name is
``envscaler_reference.py``: EnvScaler's ``base_env.py``) are taken out of a traceback.

``run(source, class_name, record, scenario, requests, render, seed=None)`` returns
``{"introduction", "tools", "observation", "initial_state", "steps"}``; a step is
``{"observation", "role", "terminated", "reward", "state_diff"}`` (the diff rendered with
``render``, the rendering Sandpit serves). ``requests`` are Sandpit step bodies, given to
EnvScaler as it would get them: ``text`` as the raw string, ``function`` as a structured
response holding that one call, ``name``/``arguments`` as an action already parsed.
"""

# No `from __future__ import annotations` here: exec() inherits the caller's future flags,
# and environment code (dataclasses among it) must compile as EnvScaler compiles it.
import copy
import json
import random
import re
import traceback
import types

OWN_FILE = "envscaler_reference.py"


def init_env_class(source, class_name):
    module = types.ModuleType("dynamic_env")
    exec(source, module.__dict__)  # noqa: S102 - runs only inside a sandbox
    if not hasattr(module, class_name):
        raise ValueError(f"Class '{class_name}' not found in provided env_class_code.")
    return getattr(module, class_name)


def init_env_instance(cls, init_config):
    config = copy.deepcopy(init_config)
    try:
        instance = cls(config) if config and isinstance(config, dict) else cls({})
    except TypeError:
        instance = cls()
    if config:
        for key, value in config.items():
            setattr(instance, key, value)
    return instance


def state_info(instance):
    return copy.deepcopy({k: v for k, v in vars(instance).items() if not (k.startswith("__") and k.endswith("__"))})


def state_diff(old, new):
    out = {}
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


def run_check(source, initial, final):
    scope = {"__builtins__": __builtins__, "initial_state": copy.deepcopy(initial)}
    try:
        exec(source, scope)  # noqa: S102 - runs only inside a sandbox
        if "check_func" not in scope:
            return None
        result = scope["check_func"](final)
    except Exception:  # noqa: BLE001 - a failing check counts as not passed
        return None
    return result if isinstance(result, bool) else None


def reward(checks, initial, final):
    results = [run_check(c["check_func"], initial, final) for c in checks]
    return round(sum(r for r in results if r is not None) / len(results), 4)


def introduction(record):
    rules = "".join("- " + rule + "\n" for rule in record.get("constraints_rules", []))
    return ("# Environment Information\n\n## Brief Introduction:  \n" + record["environment_introduction"]
            + "\n\n## Environment Rules / Constraints:  \n" + rules)


THINK = re.compile(r"(?:<|@)think(?:>|@)\s*(.*?)(?:<|@)/think(?:>|@)", re.DOTALL | re.IGNORECASE)
THINK_OPEN = re.compile(r"(?:<|@)think(?:>|@)", re.IGNORECASE)
TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


def structure(text):
    """(ok, {"content", "tool_calls"}) of raw model output."""
    ok, text = True, text.strip()
    think = THINK.search(text)
    if not think and THINK_OPEN.search(text):
        ok = False
    calls = list(TOOL_CALL.finditer(text))
    first = calls[0] if calls else None
    if not first and "<tool_call>" in text and "</tool_call>" not in text:
        ok = False
    if think and first:
        content = text[think.end():first.start()].strip()
    elif think:
        content = text[think.end():].strip()
    elif first:
        content = text[:first.start()].strip()
    else:
        content = text
    tool_calls = None
    if first:
        try:
            body = json.loads(first.group(1))
        except ValueError:
            return False, None
        if "name" not in body or "arguments" not in body:
            return False, None
        tool_calls = [{"function": body}]
    return ok, {"content": content, "tool_calls": tool_calls}


def to_action(struct):
    """(ok, action) of a structured response."""
    try:
        if struct.get("tool_calls"):
            action = copy.deepcopy(struct["tool_calls"][0]["function"])
            if isinstance(action["arguments"], str):
                action["arguments"] = json.loads(action["arguments"])
            return True, action
        if struct.get("content"):
            return True, {"name": "chat_with_user", "arguments": {"content": struct["content"]}}
        return False, {}
    except Exception:  # noqa: BLE001 - EnvScaler: any failure is a parse failure
        return False, {}


def without_own_frames(text):
    """A traceback's text without this module's frames (one line each: no source line is
    found for a file that is not on disk)."""
    return "".join(line for line in text.splitlines(True) if not line.startswith(f'  File "{OWN_FILE}"'))


class Episode:
    def __init__(self, source, class_name, record, scenario, seed=None):
        if seed is not None:
            random.seed(seed)
        self.checks = scenario["checklist_with_func"]
        self.instance = init_env_instance(init_env_class(source, class_name), scenario["init_config"])
        self.initial = state_info(self.instance)
        self.last = self.initial
        self.introduction = introduction(record)
        self.tools = copy.deepcopy(record["tools"])
        self.observation = {"type": "user", "content": scenario["task"]}

    def valid(self, action):
        name = action.get("name")
        if not name:
            return False
        if not (hasattr(self.instance, name) or name == "chat_with_user"):
            return False
        params = action.get("arguments", {})
        return isinstance(params, dict) and not (name == "chat_with_user" and "content" not in params)

    def step(self, request, render):
        terminated, score = False, 0.0
        if "text" in request:
            ok, struct = structure(request["text"])
            action = None if not ok else to_action(struct)
            if action is None:
                observation = {"type": "user", "content": "Error: Failed to parse response to struct response"}
            elif not action[0]:
                observation = {"type": "user", "content": "Error: Failed to parse response to action"}
            action = action[1] if action is not None and action[0] else None
        elif "function" in request:
            ok, action = to_action({"content": None, "tool_calls": [{"function": request["function"]}]})
            if not ok:
                observation, action = {"type": "user", "content": "Error: Failed to parse response to action"}, None
        else:  # an action already parsed: its arguments are still decoded from JSON text
            call = {"name": request["name"], "arguments": request.get("arguments", {})}
            ok, action = to_action({"content": None, "tool_calls": [{"function": call}]})
            if not ok:
                observation, action = {"type": "user", "content": "Error: Failed to parse response to action"}, None
        if action is not None:
            if not self.valid(action):
                observation = {"type": "user", "content": "Error: Invalid action"}
            elif action["name"] == "chat_with_user":
                observation, terminated = {"type": "user", "content": "Task finished"}, True
                score = reward(self.checks, self.initial, state_info(self.instance))
            else:
                try:
                    result = getattr(self.instance, action["name"])(**action["arguments"])
                    observation = {"type": "tool", "content": f"{result}"}
                except Exception:  # noqa: BLE001 - EnvScaler: the exception ends the episode
                    observation = {"type": "user",
                                   "content": "Error: <Exception>\n" + without_own_frames(traceback.format_exc())}
                    terminated = True
        current = state_info(self.instance)
        record = {"observation": observation["content"], "role": observation["type"], "terminated": terminated,
                  "reward": score, "state_diff": render(state_diff(self.last, current))[0]}
        self.last = current
        return record


def run(source, class_name, record, scenario, requests, render, seed=None):
    episode = Episode(source, class_name, record, scenario, seed)
    steps = []
    for request in requests:
        steps.append(episode.step(request, render))
        if steps[-1]["terminated"]:
            break
    return {"introduction": episode.introduction, "tools": episode.tools, "observation": episode.observation,
            "initial_state": render(episode.initial)[0], "steps": steps}
