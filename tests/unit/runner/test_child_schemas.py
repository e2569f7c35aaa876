"""Tool-schema derivation (``sandbox_images/runner/child_schemas.py``) on trusted test classes,
and the host-side validation of what a sandbox returns (``check_tool_schemas``).

In production the derivation only ever runs inside a sandbox, on untrusted classes; here
it runs on the classes below, which are this test's own code. They spell annotations the
way LLM-written environments do (``typing.List``, ``Optional``...), hence no UP rules.
"""
# ruff: noqa: UP006, UP007, UP035, UP037, UP045, UP033

import collections.abc
import copy
import dataclasses
import enum
import functools
import time
import typing
from typing import Annotated, Any, Dict, List, Literal, NewType, Optional, Tuple, TypedDict, TypeVar, Union

import pytest
from sandpit.executor.results import check_tool_schemas
from sandpit.sandbox_images.runner import child_schemas, limits
from sandpit.sandbox_images.runner.child_schemas import SchemaLimitError, annotation_schema, describe_class
from sandpit.sandbox_images.runner.protocol import ProtocolViolation


def tools_of(cls: type) -> dict[str, dict]:
    """``{name: function entry}``; every result must also pass the host validation."""
    tools, _ = describe_class(cls)
    assert check_tool_schemas(copy.deepcopy(tools)) == tools
    return {tool["function"]["name"]: tool["function"] for tool in tools}


def names_of(cls: type) -> list[str]:
    return [tool["function"]["name"] for tool in describe_class(cls)[0]]


# -- shape, order, which methods are tools ------------------------------------------------------
class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Base:
    def __init__(self, init_config: dict) -> None:
        self.items: list = []

    def inherited(self, x: int) -> int:
        """A tool defined on the base class."""
        return x

    def overridden(self, y: str) -> str:
        """Base description.

        Args:
            y: The y value.
        """
        return y

    def shadowed(self) -> None:
        """Hidden by a data attribute in the subclass."""


class Shop(Base):
    """Class docstrings are not tool descriptions."""

    shadowed = None
    LIMIT = 3
    _private_table: dict = {}

    def add_item(self, name: str, quantity: int = 1, tags: Optional[List[str]] = None) -> dict:
        """Add an item to the cart.

        Args:
            name (str): Item name.
            quantity (int): How many units.
            tags (List[str], optional): Labels to attach.

        Returns:
            dict: the cart.
        """
        return {}

    def overridden(self, y: str) -> str:
        return y

    @staticmethod
    def version(detail: bool = False) -> str:
        """Static tools have no self."""
        return "1"

    @classmethod
    def create(cls, code: str) -> "Shop":
        """Class methods drop cls."""
        return cls({})

    @property
    def total(self) -> int:
        raise RuntimeError("a getter must never run")

    @functools.cached_property
    def cached(self) -> int:
        raise RuntimeError("a getter must never run")

    class Nested:
        def method(self) -> None:
            pass

    def _helper(self) -> None:
        pass

    def __len__(self) -> int:
        return 0

    def __private(self) -> None:
        pass


def test_tool_entry_shape_and_envscaler_semantics() -> None:
    tools = tools_of(Shop)
    assert tools["add_item"] == {
        "name": "add_item",
        "description": "Add an item to the cart.",
        "parameters": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "Item name."},
                "quantity": {"type": "integer", "description": "How many units.", "default": 1},
                "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels to attach.",
                         "default": None},
            },
            "required": ["name"],
            "additionalProperties": False,
        },
    }
    full, _ = describe_class(Shop)
    assert all(set(tool) == {"type", "function"} and tool["type"] == "function" for tool in full)


def test_order_is_definition_order_most_derived_first_and_exclusions() -> None:
    # Shop's own methods in __dict__ order (an override keeps the subclass's position),
    # then Base's; properties, cached_property, nested classes, data attributes, private
    # and dunder names, and a base method shadowed by a data attribute are not tools.
    assert names_of(Shop) == ["add_item", "overridden", "version", "create", "inherited"]


def test_static_and_class_methods_and_inherited_docs() -> None:
    tools = tools_of(Shop)
    assert tools["version"]["parameters"]["properties"] == {
        "detail": {"type": "boolean", "description": "", "default": False}}
    assert tools["create"]["parameters"]["properties"] == {"code": {"type": "string", "description": ""}}
    assert tools["create"]["parameters"]["required"] == ["code"]
    # no docstring on the override: the base method's is used
    assert tools["overridden"]["description"] == "Base description."
    assert tools["overridden"]["parameters"]["properties"]["y"]["description"] == "The y value."


def test_empty_class_and_object_methods() -> None:
    class Empty:
        pass

    assert describe_class(Empty) == ([], [])


def test_not_a_class() -> None:
    def function() -> None:
        pass

    class Forged:
        @property
        def __class__(self):  # pretends to be a class to isinstance()
            return type

    for value in (function, 42, Forged()):
        with pytest.raises(TypeError, match="expected a class"):
            describe_class(value)  # type: ignore[arg-type]


# -- parameters ------------------------------------------------------------------------------------
class Params:
    def mixed(self, a, /, b: int, *args: int, c: str, d: float = 0.5, **kwargs: Any) -> None:
        """Positional-only, *args and **kwargs are not properties."""

    def optional(self, required_opt: Optional[int], defaulted_opt: Optional[int] = None,
                 union_opt: Union[str, None] = "x", pipe_opt: int | None = 3) -> None:
        """Optional[X] is X's schema; required unless it has a default."""

    def defaults(self, plain: list = [1, "a", None], mapping: dict = {"k": [1.5]},  # noqa: B006
                 obj: object = object(), tup: tuple = (1, 2), nan: float = float("nan"),
                 color: Color = Color.GREEN, level: Level = Level.HIGH, huge: str = "x" * 5000) -> None:
        pass

    def no_annotations(self, x, y=2):
        pass


def test_parameter_kinds() -> None:
    tools, notes = describe_class(Params)
    mixed = {t["function"]["name"]: t["function"] for t in tools}["mixed"]["parameters"]
    assert mixed == {
        "type": "object",
        "properties": {"b": {"type": "integer", "description": ""}, "c": {"type": "string", "description": ""},
                       "d": {"type": "number", "description": "", "default": 0.5}},
        "required": ["b", "c"],
        "additionalProperties": True,
    }
    assert any("positional-only parameter 'a'" in note for note in notes)


def test_optional_parameters() -> None:
    params = tools_of(Params)["optional"]["parameters"]
    assert params["required"] == ["required_opt"]
    assert params["properties"] == {
        "required_opt": {"type": "integer", "description": ""},
        "defaulted_opt": {"type": "integer", "description": "", "default": None},
        "union_opt": {"type": "string", "description": "", "default": "x"},
        "pipe_opt": {"type": "integer", "description": "", "default": 3},
    }


def test_defaults_only_when_json_native() -> None:
    props = tools_of(Params)["defaults"]["parameters"]["properties"]
    assert props["plain"]["default"] == [1, "a", None]
    assert props["mapping"]["default"] == {"k": [1.5]}
    for name in ("obj", "tup", "nan", "huge"):
        assert "default" not in props[name], name
    assert props["color"] == {"type": "string", "enum": ["red", "green"], "description": "", "default": "green"}
    assert props["level"] == {"type": "integer", "enum": [1, 2], "description": "", "default": 2}


def test_unannotated_parameters_have_no_type() -> None:
    params = tools_of(Params)["no_annotations"]["parameters"]
    assert params["properties"] == {"x": {"description": ""}, "y": {"description": "", "default": 2}}
    assert params["required"] == ["x"]


# -- annotations -----------------------------------------------------------------------------------
UserId = NewType("UserId", str)
Bound = TypeVar("Bound", bound=int)
Constrained = TypeVar("Constrained", str, bytes)
Free = TypeVar("Free")


class Point(TypedDict):
    x: int


@dataclasses.dataclass
class Box:
    size: int


class Opaque:
    pass


STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


@pytest.mark.parametrize(("annotation", "expected"), [
    (str, STR), (bytes, STR), (int, INT), (float, NUM), (bool, BOOL), (None, {"type": "null"}),
    (type(None), {"type": "null"}), (Any, {}), (object, {}), (Opaque, {}),
    (list, {"type": "array"}), (List, {"type": "array"}), (List[int], {"type": "array", "items": INT}),
    (list[str], {"type": "array", "items": STR}), (typing.Sequence[float], {"type": "array", "items": NUM}),
    (collections.abc.Sequence[bool], {"type": "array", "items": BOOL}),
    (collections.abc.Iterable[int], {"type": "array", "items": INT}),
    (tuple[int, ...], {"type": "array", "items": INT}), (Tuple[int, int], {"type": "array", "items": INT}),
    (Tuple[int, str], {"type": "array", "items": {"anyOf": [INT, STR]}}), (tuple, {"type": "array"}),
    (set[str], {"type": "array", "items": STR}), (frozenset, {"type": "array"}),
    (List[Any], {"type": "array"}), (List[Opaque], {"type": "array"}),
    (dict, {"type": "object"}), (Dict[str, int], {"type": "object"}), (typing.Mapping[str, Any], {"type": "object"}),
    (collections.abc.MutableMapping, {"type": "object"}), (Point, {"type": "object"}), (Box, {"type": "object"}),
    (Optional[int], INT), (Union[int, None], INT), (int | None, INT), (Optional[List[str]], {"type": "array", "items": STR}),
    (Union[int, str], {"anyOf": [INT, STR]}), (int | str | None, {"anyOf": [INT, STR]}), (Union[int, Any], {}),
    (Union[List[int], Dict[str, int]], {"anyOf": [{"type": "array", "items": INT}, {"type": "object"}]}),
    (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}), (Literal[1, 2], {"type": "integer", "enum": [1, 2]}),
    (Literal[True], {"type": "boolean", "enum": [True]}), (Literal[1, 2.5], {"type": "number", "enum": [1, 2.5]}),
    (Literal["a", 1], {"enum": ["a", 1]}), (Literal["a", None], {"enum": ["a", None]}),
    (Color, {"type": "string", "enum": ["red", "green"]}), (Level, {"type": "integer", "enum": [1, 2]}),
    (Annotated[int, "meta"], INT), (UserId, STR), (Bound, INT), (Constrained, STR), (Free, {}),
    (List[List[List[List[List[List[List[List[int]]]]]]]], None),  # checked below: depth-capped
])
def test_annotation_schema(annotation: object, expected: dict | None) -> None:
    schema = annotation_schema(annotation)
    if expected is not None:
        assert schema == expected
    else:
        depth = 0
        while "items" in schema:
            schema, depth = schema["items"], depth + 1
        assert depth <= limits.MAX_SCHEMA_DEPTH + 1


def test_enum_with_unserializable_values_and_too_many_values() -> None:
    class Pair(enum.Enum):
        A = (1, 2)

    assert annotation_schema(Pair) == {}
    many = enum.Enum("Many", {f"V{i}": i for i in range(limits.MAX_ENUM_VALUES + 1)})
    assert annotation_schema(many) == INT


@pytest.mark.parametrize(("text", "expected"), [
    ("str", STR), ("List[int]", {"type": "array", "items": INT}), ("typing.List[str]", {"type": "array", "items": STR}),
    ("Optional[str]", STR), ("int | None", INT), ("Union[int, str]", {"anyOf": [INT, STR]}),
    ("Dict[str, Any]", {"type": "object"}), ("Literal['x', 'y']", {"type": "string", "enum": ["x", "y"]}),
    ("Missing", {}), ("Optional[Missing]", {}), ("List[Missing]", {"type": "array"}), ("'int'", INT),
    ("str, optional", STR), ("int or None", INT), ("List[str], optional", {"type": "array", "items": STR}),
    ("Directory, optional", {}), ("list of int", {}), ("Tuple[int, ...]", {"type": "array", "items": INT}),
    ("Literal[__import__('os')]", {}), ("x" * 5000, {}), ("", {}),
])
def test_string_annotations_are_parsed_not_evaluated(text: str, expected: dict) -> None:
    assert child_schemas.string_annotation_schema(text) == expected


def test_unresolvable_string_annotations_fall_back_to_parsing() -> None:
    class Deferred:
        def move(self, target: "Directory", depth: "Optional[int]" = None, names: "List[str]" = (),  # noqa: F821
                 mode: "Literal['a', 'b']" = "a") -> "Directory":  # noqa: F821
            """Move somewhere."""

        def broken(self, x: "List[", y: "int") -> None:  # noqa: F722
            pass

    tools = tools_of(Deferred)
    props = tools["move"]["parameters"]["properties"]
    assert props == {
        "target": {"description": ""},
        "depth": {"type": "integer", "description": "", "default": None},
        "names": {"type": "array", "items": STR, "description": ""},
        "mode": {"type": "string", "enum": ["a", "b"], "description": "", "default": "a"},
    }
    assert tools["move"]["parameters"]["required"] == ["target"]
    assert tools["broken"]["parameters"]["properties"] == {"x": {"description": ""}, "y": {**INT, "description": ""}}


def test_resolvable_string_annotations_use_get_type_hints() -> None:
    class Future:
        def run(self, point: "Point", box: "Box", color: "Color") -> None:
            pass

    props = tools_of(Future)["run"]["parameters"]["properties"]
    assert props["point"] == {"type": "object", "description": ""}
    assert props["color"]["enum"] == ["red", "green"]


# -- docstrings ------------------------------------------------------------------------------------
class Docs:
    def google(self, path: str, recursive: bool = False, mode: str = "r") -> None:
        """Copy a file
        somewhere   else.

        Some more   text of the summary.

        Args:
            path (str): Where the file is.
                Continued on a second line.
            recursive: Whether to recurse
                into directories.
            mode (str, optional): Open mode. Defaults to "r".

        Returns:
            None: nothing.
        """

    def arguments_section(self, a: int) -> None:
        """Summary.

        Arguments:
            a: first.
        """

    def parameters_section(self, a: int) -> None:
        """Summary.

        Parameters:
            a (int): first.

        Raises:
            ValueError: when a is negative.
        """

    def rest(self, name, count: int = 1) -> None:
        """Greet someone.

        :param str name: Who to greet,
            on two lines.
        :param count: How many times.
        :type name: str
        :returns: nothing
        """

    def rest_type_only(self, name) -> None:
        """Summary.

        :param name: The name.
        :type name: List[int]
        """

    def numpy(self, a, b=None) -> None:
        """Numpy style.

        Parameters
        ----------
        a : int
            The first.
        b : str, optional
            The second.

        Returns
        -------
        int
        """

    def doc_type_fallback(self, a, b: float, c) -> None:
        """Docstring types are used only without an annotation.

        Args:
            a (List[str]): As.
            b (str): An annotation wins.
            c (Directory): Unknown type.
        """

    def no_doc(self, a: int) -> None:
        pass


def test_google_docstring() -> None:
    tool = tools_of(Docs)["google"]
    assert tool["description"] == "Copy a file somewhere else. Some more text of the summary."
    assert tool["parameters"]["properties"] == {
        "path": {"type": "string", "description": "Where the file is. Continued on a second line."},
        "recursive": {"type": "boolean", "description": "Whether to recurse into directories.", "default": False},
        "mode": {"type": "string", "description": 'Open mode. Defaults to "r".', "default": "r"},
    }


@pytest.mark.parametrize("method", ["arguments_section", "parameters_section"])
def test_google_section_names(method: str) -> None:
    tool = tools_of(Docs)[method]
    assert tool["description"] == "Summary."
    assert tool["parameters"]["properties"]["a"]["description"] == "first."


def test_rest_docstring() -> None:
    tool = tools_of(Docs)["rest"]
    assert tool["description"] == "Greet someone."
    assert tool["parameters"]["properties"] == {
        "name": {"type": "string", "description": "Who to greet, on two lines."},
        "count": {"type": "integer", "description": "How many times.", "default": 1},
    }
    props = tools_of(Docs)["rest_type_only"]["parameters"]["properties"]
    assert props["name"] == {"type": "array", "items": INT, "description": "The name."}


def test_numpy_docstring() -> None:
    tool = tools_of(Docs)["numpy"]
    assert tool["description"] == "Numpy style."
    assert tool["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first."},
        "b": {"type": "string", "description": "The second.", "default": None},
    }


def test_docstring_types_only_without_annotations() -> None:
    props = tools_of(Docs)["doc_type_fallback"]["parameters"]["properties"]
    assert props["a"] == {"type": "array", "items": STR, "description": "As."}
    assert props["b"] == {"type": "number", "description": "An annotation wins."}
    assert props["c"] == {"description": "Unknown type."}
    assert tools_of(Docs)["no_doc"]["description"] == ""


class GorillaStyle:
    """Docstrings copied from BFCL's GorillaFileSystem (bfcl_eval 2026.3.23), bodies elided."""

    def pwd(self):
        """
        Return the current working directory path.
        Args:
            None
        Returns:
            current_working_directory (str): The current working directory path.

        """

    def ls(self, a: bool = False) -> Dict[str, List[str]]:
        """
        List the contents of the current directory.

        Args:
            a (bool): [Optional] Show hidden files and directories. Defaults to False.

        Returns:
            current_directory_content (List[str]): A list of the contents of the specified directory.
        """

    def cd(self, folder: str) -> Union[None, Dict[str, str]]:
        """
        Change the current working directory to the specified folder.

        Args:
            folder (str): The folder of the directory to change to. You can only change one folder level at a time.

        Returns:
            current_working_directory (str): The new current working directory path.
        """

    def mean(self, numbers: List[float]) -> Dict[str, float]:
        """
        Calculate the mean of a list of numbers.

        Args:
            numbers (List[float]): List of numbers to calculate the mean of.

        Returns:
            result (float): Mean of the numbers.
        """

    def _load_scenario(self, scenario: dict, long_context: bool = False) -> None:
        """
        Load a scenario into the file system.

        Args:
            scenario (dict): The scenario to load.
        """


def test_bfcl_docstrings() -> None:
    tools = tools_of(GorillaStyle)
    assert list(tools) == ["pwd", "ls", "cd", "mean"]
    assert tools["pwd"] == {"name": "pwd", "description": "Return the current working directory path.",
                            "parameters": {"type": "object", "properties": {}, "required": [],
                                           "additionalProperties": False}}
    assert tools["ls"]["parameters"]["properties"]["a"] == {
        "type": "boolean", "description": "Show hidden files and directories. Defaults to False.",
        "default": False}
    assert tools["cd"]["description"] == "Change the current working directory to the specified folder."
    assert tools["cd"]["parameters"]["properties"]["folder"] == {
        "type": "string",
        "description": "The folder of the directory to change to. You can only change one folder level at a time."}
    assert tools["cd"]["parameters"]["required"] == ["folder"]
    assert tools["mean"]["parameters"]["properties"]["numbers"] == {
        "type": "array", "items": NUM, "description": "List of numbers to calculate the mean of."}


# -- decorators ------------------------------------------------------------------------------------
def logged(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)
    return wrapper


class Decorated:
    @logged
    def wrapped(self, item_id: str, limit: int = 10) -> list:
        """Wrapped with functools.wraps."""
        return []

    @functools.lru_cache(maxsize=None)  # noqa: B019 - a test class
    def cached(self, key: str) -> str:
        """Cached tool."""
        return key

    callable_object = functools.partial(print, "x")


def test_decorated_methods_keep_their_signature() -> None:
    tools = tools_of(Decorated)
    assert tools["wrapped"]["description"] == "Wrapped with functools.wraps."
    assert tools["wrapped"]["parameters"]["required"] == ["item_id"]
    assert tools["cached"]["parameters"]["properties"] == {"key": {"type": "string", "description": ""}}


# -- caps and hostile (trusted here) classes -------------------------------------------------------
def test_description_caps_and_huge_docstrings_are_cheap() -> None:
    def big(self, a: int) -> None:
        pass

    big.__doc__ = "word " * 2_000_000 + "\n\nArgs:\n    a: never read\n"  # 10 MB
    Huge = type("Huge", (), {"big": big})
    started = time.perf_counter()
    tool = tools_of(Huge)["big"]
    assert time.perf_counter() - started < 2.0
    assert len(tool["description"]) == limits.MAX_DESCRIPTION_CHARS
    assert tool["parameters"]["properties"]["a"]["description"] == ""

    def long_param(self, a: int) -> None:
        pass

    long_param.__doc__ = "Summary.\n\nArgs:\n    a: " + "x " * 10_000
    assert len(tools_of(type("P", (), {"long_param": long_param}))["long_param"]["parameters"]
               ["properties"]["a"]["description"]) <= limits.MAX_DESCRIPTION_CHARS


def test_too_many_tools() -> None:
    namespace = {f"tool_{i}": (lambda self: None) for i in range(limits.MAX_TOOLS + 1)}
    with pytest.raises(SchemaLimitError, match=f"more than {limits.MAX_TOOLS} public methods"):
        describe_class(type("Many", (), namespace))
    del namespace["tool_0"]
    assert len(describe_class(type("Enough", (), namespace))[0]) == limits.MAX_TOOLS


def test_total_size_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_schemas, "MAX_SCHEMAS_BYTES", 2000)  # the name it imported from limits
    namespace = {f"tool_{i}": (lambda self, a, b, c: None) for i in range(30)}
    with pytest.raises(SchemaLimitError, match="exceed 2000 bytes"):
        describe_class(type("Wide", (), namespace))


def test_too_many_parameters_and_bad_signatures_give_the_fallback_schema() -> None:
    many = {f"p{i}": int for i in range(limits.MAX_PARAMS + 1)}
    source_params = ", ".join(many)
    namespace: dict[str, Any] = {}
    exec(f"def wide(self, {source_params}):\n    'Wide tool.'\n", namespace)  # noqa: S102 - our own test code

    def forged(self, a: int) -> None:
        """Forged signature."""

    forged.__signature__ = "x" * 1_000_000  # type: ignore[attr-defined]
    Odd = type("Odd", (), {"wide": namespace["wide"], "forged": forged})
    tools, notes = describe_class(Odd)
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    fallback = {"type": "object", "properties": {}, "required": [], "additionalProperties": True}
    assert by_name["wide"] == {"name": "wide", "description": "Wide tool.", "parameters": fallback}
    assert by_name["forged"] == {"name": "forged", "description": "Forged signature.", "parameters": fallback}
    assert any("wide: more than" in note for note in notes)
    assert any("forged: signature unavailable" in note for note in notes)
    check_tool_schemas(tools)


def test_names_that_are_not_openai_function_names_are_skipped() -> None:
    Named = type("Named", (), {"café": lambda self: None, "x" * 65: lambda self: None, "ok": lambda self: None})
    tools, notes = describe_class(Named)
    assert [t["function"]["name"] for t in tools] == ["ok"]
    assert len(notes) == 2


def test_hostile_metaclass_is_never_consulted() -> None:
    class Hostile(type):
        def __getattribute__(cls, name):
            raise RuntimeError(f"metaclass __getattribute__({name})")

        def __getattr__(cls, name):
            raise RuntimeError("metaclass __getattr__")

        def __dir__(cls):
            raise RuntimeError("metaclass __dir__")

    class Env(metaclass=Hostile):
        __doc__ = "d" * 1_000_000
        __signature__ = "s" * 1_000_000

        def tool(self, a: int) -> int:
            """Still described."""
            return a

        @property
        def exploding(self):
            raise RuntimeError("getter ran")

    assert list(tools_of(Env)) == ["tool"]


def test_hostile_annotation_becomes_unknown_type() -> None:
    class Exploding:
        def __hash__(self):
            raise RuntimeError("hash")

        def __eq__(self, other):
            raise RuntimeError("eq")

    def tool(self, a, b: int) -> None:
        pass

    tool.__annotations__ = {"a": Exploding(), "b": int}
    tools, _ = describe_class(type("Weird", (), {"tool": tool}))
    props = tools[0]["function"]["parameters"]["properties"]
    assert props["a"] == {"description": ""} and props["b"] == {**INT, "description": ""}


# -- host validation ---------------------------------------------------------------------------------
def valid_tool(name: str = "tool", **schema: Any) -> dict:
    prop = {"type": "string", "description": "x", **schema}
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": {
        "type": "object", "properties": {"a": prop}, "required": ["a"], "additionalProperties": False}}}


def mutate(path: tuple, value: Any) -> dict:
    tool = valid_tool()
    target = tool
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return tool


@pytest.mark.parametrize("tools", [
    {"not": "a list"}, "tools", [valid_tool()] * 2, [valid_tool(f"t{i}") for i in range(limits.MAX_TOOLS + 1)],
    [mutate(("type",), "method")], [mutate(("extra",), 1)], [mutate(("function", "name"), "_private")],
    [mutate(("function", "name"), "a b")], [mutate(("function", "name"), 7)],
    [mutate(("function", "description"), "x" * (limits.MAX_DESCRIPTION_CHARS + 1))],
    [mutate(("function", "description"), None)], [mutate(("function", "strict"), True)],
    [mutate(("function", "parameters", "type"), "array")],
    [mutate(("function", "parameters", "required"), ["b"])], [mutate(("function", "parameters", "required"), ["a", "a"])],
    [mutate(("function", "parameters", "additionalProperties"), "yes")],
    [mutate(("function", "parameters", "properties"), {"a b": {"description": ""}})],
    [mutate(("function", "parameters", "properties", "a", "description"), KeyError)],
    [mutate(("function", "parameters", "properties", "a", "type"), "date")],
    [mutate(("function", "parameters", "properties", "a", "format"), "uri")],
    [mutate(("function", "parameters", "properties", "a", "enum"), [{"a": 1}])],
    [mutate(("function", "parameters", "properties", "a", "enum"), [])],
    [mutate(("function", "parameters", "properties", "a", "anyOf"), [{"type": "string"}])],
    [mutate(("function", "parameters", "properties", "a", "default"), "x" * (limits.MAX_DEFAULT_CHARS + 1))],
    [mutate(("function", "parameters", "properties", "a", "items"), {"items": {"items": {"items": {"items": {
        "items": {"items": {"items": {"items": {}}}}}}}}})],
])
def test_host_rejects_malformed_tool_lists(tools: object) -> None:
    with pytest.raises(ProtocolViolation):
        check_tool_schemas(tools)


def test_host_accepts_what_the_sandbox_produces() -> None:
    for cls in (Shop, Params, Docs, GorillaStyle, Decorated):
        tools, _ = describe_class(cls)
        assert check_tool_schemas(tools) is tools
