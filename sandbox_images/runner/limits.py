"""Every size, count and time cap of the runner and of the host's checks of it, once.

Stdlib only, no imports: copied into the image with the other runner files and imported
by PID 1 (``pid1_*``), by the child processes (``child_*``) and on the host as
``sandpit.sandbox_images.runner.limits`` (``executor/``), so a cap that both sides apply
(the sandbox when it produces something, the host when it validates what came back) has
one definition. The profile's limits (memory, CPU, call timeout, output caps) are not
here: they come per sandbox from ``SANDPIT_LIMITS``; only their defaults are.

Units are in the names: ``_BYTES`` (UTF-8 bytes), ``_CHARS`` (characters), ``_S``
(seconds); a bare ``MAX_`` count is of items. :func:`check_files` (with
:func:`check_file_path`) applies the file caps of ``exec`` jobs: the host before sending,
PID 1 on receipt and the job process before writing.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# -- frames (protocol.py) ---------------------------------------------------------------
MAX_FRAME_BYTES = 64 * MiB
"""Largest frame between host and runner, and from a session process to the runner
(state snapshots are the largest); bigger kills the sender's side."""
MAX_FRAME_DEPTH = 200
"""Deepest nesting of arrays/objects accepted in a frame."""
MAX_ATTACHMENTS = 8
"""Most byte strings one frame from the host may carry after its JSON (``attached.py``)."""
HELLO_MAX_BYTES = 4096
"""Largest hello frame the host accepts from a starting runner."""
JOB_MAX_FRAME_BYTES = 1 * MiB
"""Largest frame a job process may send to PID 1 (one check's result is a few KiB)."""
CHECK_RESULT_MAX_BYTES = 64 * KiB
"""Largest result frame a check process may send to its zygote."""
MAX_GROUP_CALLS = 256
"""Most tool calls one ``calls`` request may carry (``pid1_groups``)."""
GROUP_PART_BYTES = 4 * MiB
"""Replies of a group PID 1 gathers before it sends them ahead as a part (``pid1_groups``)."""

# -- defaults of the per-sandbox limits (SANDPIT_LIMITS; ResourceProfile's defaults) -------
DEFAULT_CALL_TIMEOUT_S = 10.0
DEFAULT_SESSION_MEMORY_BYTES = 256 * MiB
DEFAULT_OUTPUT_CAP_BYTES = 64 * KiB
DEFAULT_OBSERVATION_CAP_BYTES = 1 * MiB
DEFAULT_SESSION_NOFILE = 256

# -- PID 1 ----------------------------------------------------------------------------------
CONNECT_TIMEOUT_S = 30.0
"""How long the runner retries connecting to the host's socket at start."""
CHANNEL_WATCH_S = 1.0
"""Seconds between the host channel's reads of replies that arrived while no caller
waited (its watcher thread; callers read their own replies)."""
TOKEN_MAX_CHARS = 1024
"""Most characters of the token file read."""
SESSION_ID_MAX_CHARS = 128
"""Longest session id a host request may name."""
CHILD_SEND_TIMEOUT_S = 5.0
"""Longest blocking send of a request to a session process."""
DEFER_MAX_S = 0.25
"""Longest delay (seconds) of a spare's or template's start while calls are in flight:
started right after a reply it would compete with that request for the CPU quota."""
REPLACE_MAX = 2
"""Times an open's process that died before it ever answered is replaced by another
(``pid1_sessions.Sessions.child_failed``). Two, because a session that kills every other
process of its sandbox kills the process forked ahead and the spare at once (the jobs
template too, whose fork then fails at once), and their exits may not be reaped yet when
the next open takes them; the third is spawned."""
QUIET_S = 0.01
"""Quiet (seconds: no event, no call in flight) that a spare's or an environment
template's start waits for before it begins (``pid1_loop.Loop.later``)."""
QUIET_MAX_S = 0.05
"""Longest wait (seconds) for QUIET_S of quiet: after it such a start waits only for
nothing to be in flight (back-to-back opens never leave 10 ms of quiet)."""
SESSION_STARTUP_S = 10.0
"""Time a newly spawned session process has to start (interpreter, limits, seccomp
filter) and answer ``hello`` before the request queued behind it. Its own time limit
(``call_timeout_s``) starts only at that answer: a process start is the runner's work,
not the environment's (in CI a restore into a fresh gVisor sandbox, every core busy,
used up a 1 s limit that way). Past it the request fails as ``crashed``."""
SPAWN_RETRY_S = 2.0
"""How long a session process start that hits the pids limit is retried (strays of a
killed fork bomb not reaped yet)."""
SWEEP_DEADLINE_S = 5.0
JOB_EXIT_WAIT_S = 0.05
"""Longest wait (seconds) for a killed job process to exit before the sweep that follows
(which reads every process of /proc again and again while it is dying): most die in
well under a millisecond of CPU; a slower one is left to the sweep."""
"""Longest wait for killed processes to die (seconds); past it the sweep fails and the
sandbox is not reused."""
JOBS_PER_SLOT = 8
"""Concurrent one-shot jobs per session slot of the sandbox (``max_sessions``)."""
DRAIN_MAX_READS = 64
"""Reads of a job's pipe when it ends (64 KiB each): bounded even if an escaped process
keeps writing into it."""
RECYCLE_MAX_PROBLEMS = 16
"""Most problems a ``recycle`` reply lists."""
BROKEN_MAX_CHARS = 2000
"""Longest reason kept for a session that cannot be re-created."""

# -- sessions ---------------------------------------------------------------------------------
MAX_SOURCE_BYTES = 4 * MiB
"""UTF-8 size of an environment's source (host, ``open_session``/``describe``)."""
TENANT_MAX_CHARS = 128
"""Longest tenant id (host)."""
TOOL_CALL_NAME_MAX_CHARS = 128
"""Longest tool name a call may give (host; longer is ``rejected`` without a round trip)."""
SESSION_TRACEBACK_CHARS = 4096
"""A tool's or an ``init``'s traceback, cut to this many characters (head and tail kept)."""
INIT_RETYPED_MAX = 32
"""At most this many ``init_config`` keys that replace a constructed attribute with a
value of another type are reported by an ``init`` (``child_instance.retyped_attributes``)."""
INIT_RETYPED_NAME_CHARS = 200
"""A reported key or type name is cut to this many characters."""
CONSTRUCTION_DETAIL_MAX_CHARS = 200
"""The ``detail`` of an open's ``construction`` verdict (``pid1_verdicts``: a template's
failure text; the host cuts it again to this)."""
JSON_NATIVE_MAX_DEPTH = 100
"""JSON values nested deeper than this are pickled (and rendered with a depth marker)
rather than sent as ``"j"``: frames may nest at most MAX_FRAME_DEPTH levels."""
KEYED_MIN_BYTES = 32 * KiB
"""JSON dicts and lists whose encoding is at least this large are tracked path by path
(``child_delta.py``): a call that changes a few records sends ``["k", {"v": 2, "ops":
[...]}]`` (set/delete/resize at a path) instead of the whole value; PID 1 and the host
apply it to their snapshots (``protocol.apply_keyed``)."""
TREE_MIN_BYTES = 16 * KiB
"""Inside a tracked value, a dict or list child whose ``marshal`` encoding is at least
this large gets buckets of its own (smaller children are compared bucket by bucket)."""
TREE_MAX_DEPTH = 32
"""Deepest level at which a tracked value gets a sub-tree (deeper ones are bucket members)."""
MAX_PATH_OPS = 4096
"""Most operations of one attribute's path delta; a call that changes more sends the
attribute whole."""
MAX_PATH_LENGTH = JSON_NATIVE_MAX_DEPTH
"""Longest path of a path-delta operation (host and PID 1 refuse longer ones)."""
DESCRIBE_ERROR_CHARS = 4096
"""A failed ``describe``'s observation, cut by PID 1 and checked again by the host."""
DESCRIBE_TRACEBACK_CHARS = 8192
"""A failed ``describe``'s traceback, cut by PID 1 and by the host."""

# -- tool schemas (child_schemas.py; the host validates against the same caps) ------------------
MAX_TOOLS = 512
"""Most public methods a class may have; more raise ``SchemaLimitError``."""
MAX_DESCRIPTION_CHARS = 4096
"""Longest tool or parameter description, characters; longer ones are cut."""
MAX_PARAMS = 128
"""Most parameters described per tool; a method with more gets the fallback schema."""
MAX_PARAM_NAME_CHARS = 128
"""Longest parameter name the host accepts in a schema."""
MAX_ENUM_VALUES = 256
"""Most ``enum`` values (Literal/Enum); with more, only the type is given."""
MAX_ENUM_CHARS = 64 * KiB
"""Most characters of all string ``enum`` values of one schema together; more: type only."""
MAX_SCHEMA_DEPTH = 6
"""Deepest nesting of ``items``/``anyOf`` in one parameter schema; deeper is ``{}``."""
MAX_ANY_OF = 32
"""Most members of one ``anyOf``; a larger union is ``{}`` (anything)."""
MAX_DEFAULT_CHARS = 1024
"""Longest JSON encoding of a ``default``; longer defaults are left out."""
MAX_DOC_SCAN_CHARS = 256 * KiB
"""Characters of a docstring that are parsed; the rest is ignored."""
MAX_ANNOTATION_CHARS = 1000
"""Longest string annotation that is parsed; longer ones are unknown types."""
MAX_SCHEMAS_BYTES = 4 * MiB
"""Largest UTF-8 JSON encoding of the whole tool list (the class's, in the session
process; PID 1 refuses a bigger ``describe`` reply)."""
MAX_NOTES = 64
"""Most notes of one ``describe`` (each at most MAX_NOTE_CHARS characters)."""
MAX_NOTE_CHARS = 512
MAX_NAME_CHARS = 64
"""Longest tool name (OpenAI function names: ``^[a-zA-Z0-9_-]{1,64}$``)."""

# -- rendering (child_render.py) --------------------------------------------------------------
RENDER_MAX_DEPTH = 64
"""Containers and objects nested deeper than this are rendered as a ``depth`` marker
(a rendering sits a few levels down a frame of at most MAX_FRAME_DEPTH levels)."""
RENDER_MAX_ITEMS = 100_000
"""Items of one container rendered; the rest is counted in an ``items`` marker."""
RENDER_MAX_BYTES = 8 * MiB
"""Approximate budget (UTF-8 bytes of strings, keys and scalars) of one attribute's
rendering; values past it become ``size`` markers."""
RENDER_MAX_REPR_CHARS = 4096
"""Longest ``repr`` kept in a ``$repr`` or marker."""

# -- one-shot jobs: check functions (child_checks.py, pid1_jobs.py, executor/jobs.py) ---------
MAX_CHECKS = 256
"""Checks in one ``checks`` request."""
MAX_CHECK_SOURCE_BYTES = 64 * KiB
"""UTF-8 size of one ``check_func`` source."""
MAX_CHECK_ITEM_CHARS = 4096
"""Length of one ``check_item`` (the check's description; never sent to the sandbox)."""
MAX_STATE_BYTES = 16 * MiB
"""JSON size of ``initial_state`` and of ``final_state``, each."""
RESULT_REPR_CHARS = 1024
"""A check's returned value is reported as its ``repr``, cut to this many characters."""
ERROR_CHARS = 4096
"""Cap on one check's ``error`` text."""
TRACEBACK_CHARS = 4096
"""Cap on one check's traceback (head and tail are kept)."""
CHECK_RESULT_TEXT_CAPS = {"result": RESULT_REPR_CHARS + 8, "error": ERROR_CHARS, "traceback": TRACEBACK_CHARS + 200}
"""What the zygote, PID 1 and the host accept for a check result's text fields (the
slack covers the ``...`` and ``characters cut`` markers)."""
STANDIN_NAME_CHARS = 200
"""Longest module or class name a check's stand-in class keeps (``child_standins.py``)."""
STANDIN_REPR_CHARS = 2000
"""Longest ``repr`` of a stand-in object (``child_standins.py``)."""
CHECK_OUTPUT_CAP_BYTES = 4096
"""What one check prints is kept up to this many bytes per stream (and at most the
profile's ``output_cap_bytes``); the rest is dropped and marked."""
STARTUP_S = 5.0
"""Time a checks process has to start and restore both states before its first check's
own time limit starts (it says ``ready``); included in the batch's budget."""
BATCH_SLACK_S = 5.0
"""A check batch may take ``timeout_s`` per check plus this (and STARTUP_S) in all
(process starts after timeouts and crashes); checks not started by then are not run."""
ZYGOTE_MAX_BATCHES = 32
"""Most check batches one zygote serves: a zygote whose batch ran every check in place
(read-only checks on plain states, ``child_checks``) waits for the next batch instead of
exiting, up to this many batches; then it exits and the next batch gets a fresh one."""
ZYGOTE_KEEP_MAX_BYTES = 32 * MiB
"""Most private memory a zygote may hold and still be kept for the next batch: one that
restored large states keeps their memory after it drops them (its allocator does not give
it back), which would count against its sandbox's admission until the next batch; it
exits instead, and the next batch gets a fresh zygote (its restore, not the fork, is
most of a large batch's time)."""
FORK_RETRY_S = 2.0
"""How long the zygote retries a fork that fails for want of a pid."""
READ_ONLY_CHECK_MAX_NODES = 20_000
"""A check source with more syntax nodes is not analysed for the read-only path
(``child_readonly.py``; bounds the analysis at a few milliseconds): it is forked."""
DEFAULT_CHECK_TIMEOUT_S = 5.0
"""Per-check limit when the caller gives none (host; capped by the profile's ``call_timeout_s``)."""

# -- one-shot jobs: scripts -----------------------------------------------------------------
MAX_CODE_BYTES = 4 * MiB
"""UTF-8 size of an ``exec`` script (and of the environment source sent with checks)."""
MAX_STDIN_BYTES = 4 * MiB
"""UTF-8 size of an ``exec`` job's stdin."""
MAX_FILES = 64
"""Files written into an ``exec`` job's working directory."""
MAX_FILE_BYTES = 4 * MiB
"""UTF-8 size of one file."""
MAX_FILES_TOTAL_BYTES = 8 * MiB
"""UTF-8 size of all files of one job (the work tmpfs may be smaller: the profile's
``tmpfs_mib``)."""
MAX_PATH_CHARS = 1024
MAX_PATH_DEPTH = 16
MAX_NAME_BYTES = 255
"""Longest component of a file path (bytes)."""
EXEC_ERROR_CHARS = 8192
"""Longest ``error`` text of a script run the host accepts."""
MAX_EXEC_CONCURRENCY = 8
"""Most snippets ``SandboxPool.execute_many`` runs at once (in one sandbox; host)."""
MAX_SNIPPETS = 1024
"""Most snippets in one ``SandboxPool.execute_many`` call (host)."""


def check_file_path(path: object) -> str:
    """Validate one key of an ``exec`` job's ``files``: a relative POSIX path inside the
    working directory. Returns it unchanged.

    Rejected (``ValueError`` naming the path): not a string; empty; longer than
    ``MAX_PATH_CHARS``; absolute; empty, ``.`` or ``..`` components (so also ``a//b`` and a
    trailing ``/``); more than ``MAX_PATH_DEPTH`` components; a component over
    ``MAX_NAME_BYTES`` bytes; NUL, other control characters, backslashes, or text that
    is not encodable as UTF-8 (lone surrogates).
    """
    if not isinstance(path, str):
        raise ValueError(f"file path {path!r} is not a string")
    shown = repr(path[:80])
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"file path {shown} must have 1 to {MAX_PATH_CHARS} characters")
    if any(ord(ch) < 0x20 or ch in "\x7f\\" for ch in path):
        raise ValueError(f"file path {shown} contains a control character or a backslash")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"file path {shown} is not valid text") from None
    if path.startswith("/"):
        raise ValueError(f"file path {shown} is absolute; paths are relative to the working directory")
    parts = path.split("/")
    if len(parts) > MAX_PATH_DEPTH:
        raise ValueError(f"file path {shown} is nested deeper than {MAX_PATH_DEPTH} levels")
    for part in parts:
        if part in ("", ".", ".."):
            raise ValueError(f"file path {shown} has an empty, '.' or '..' component")
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise ValueError(f"file path {shown} has a component over {MAX_NAME_BYTES} bytes")
    return path


def check_files(files: object) -> dict[str, str]:
    """Validate an ``exec`` job's ``files`` (``{relative path: text}``) against every file
    cap above; a path may not be both a file and a directory (``a`` and ``a/b``). Returns
    ``files`` unchanged. Raises ``ValueError`` naming the first offending entry."""
    if not isinstance(files, dict):
        raise ValueError("files must be an object mapping relative paths to text")
    if len(files) > MAX_FILES:
        raise ValueError(f"at most {MAX_FILES} files may be given (got {len(files)})")
    total = 0
    for path, text in files.items():
        check_file_path(path)
        if not isinstance(text, str):
            raise ValueError(f"file {path[:80]!r}: content must be text")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError(f"file {path[:80]!r}: content is not valid text") from None
        if size > MAX_FILE_BYTES:
            raise ValueError(f"file {path[:80]!r} has {size} bytes; at most {MAX_FILE_BYTES} are allowed")
        total += size
    if total > MAX_FILES_TOTAL_BYTES:
        raise ValueError(f"files total {total} bytes; at most {MAX_FILES_TOTAL_BYTES} are allowed")
    for path in files:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in files:
                raise ValueError(f"file path {path[:80]!r} lies under {'/'.join(parts[:depth])[:80]!r}, "
                                 "which is a file")
    return files

# -- templates (pid1_templates.py, child_template.py) ------------------------------------------
TEMPLATE_FORK_TIMEOUT_S = 2.0
"""Longest wait of PID 1 for a template's answer to ``fork`` (the template forks twice and
reports the new session's pid); past it the template is killed and the environment's
sessions start the normal way until it is rebuilt (TEMPLATE_REBUILDS)."""
TEMPLATE_REBUILDS = 3
"""How often a template that failed for a reason that may not recur (it loaded or forked
too late, died, closed its channel, answered a pid PID 1 could not verify: what a machine
too loaded for the deadlines causes) is built again until the sandbox is recycled; a
verdict (``unsuitable``) or a protocol violation is never retried."""
TEMPLATE_REBUILD_BACKOFF_S = 5.0
"""Wait before the first rebuild of a failed template (seconds); each later one waits four
times the one before (5, 20, 80 s)."""
TEMPLATE_REPARENT_S = 1.0
"""Longest wait of a forked session for its intermediate parent to exit (it is then a
child of PID 1)."""
FORK_AHEAD_DEFAULT = 2
"""How many templates of one sandbox keep a session process forked ahead of their next
open when the host's limits do not say (``forks_ahead``; the templates forked from most
recently): each such process is one more idle process of the sandbox (copy-on-write, about
1.4 MiB of its own), and it takes the template's fork, about 1 to 5 ms of PID 1's and the
template's time, off that open's path."""
FORK_AHEAD_MAX_PER_SANDBOX = 8
"""The largest ``forks_ahead`` a runner accepts (a larger value is taken as this one)."""
TEMPLATE_MAX_PER_SANDBOX = 8
"""Most template processes one sandbox keeps (one per environment source and class);
further environments start their sessions the normal way."""
TEMPLATE_CHECK_MAX_NODES = 200_000
"""Sources with more syntax-tree nodes than this are not templated (the check's own cost)."""
TEMPLATE_FRAME_MAX_BYTES = 4096
"""Largest frame a template may send to PID 1 (its answers are a few dozen bytes)."""
CONFIG_TEMPLATE_MAX_PER_SANDBOX = 4
"""Most config templates (an environment instance constructed once from one
``init_config``, sessions forked from it) one sandbox keeps; the least recently used is
killed to make room for a new one (only one used before the new config's previous open:
``pid1_templates``)."""
CONFIG_TEMPLATE_MEMORY_FRACTION = 0.5
"""A config template is only built while the sandbox's cgroup uses less than this
fraction of its memory limit (a template holds a whole constructed state), after killing
the fewest least recently used config templates whose private memory makes room."""
CONFIG_CACHE_MAX_BYTES = 32 * MiB
"""Bytes of ``init_config`` JSON PID 1 keeps by hash (least recently used out), so a
repeated config is sent as its hash; configs of open sessions stay referenced beyond it."""
CONFIG_HASH_CHARS = 64
"""A config's key: the SHA-256 hex digest of its exact JSON bytes (key order and
``1``/``1.0``/``true`` distinct)."""

# -- the Ray backend's host link (executor/ray/link.py, gRPC; host side only, never in a sandbox)
LINK_HELLO_TIMEOUT_S = 10.0
"""Seconds a new host link connection has to finish its TLS handshake before it is closed."""
LINK_MAX_EXTRA_DEPTH = 16
"""Nesting levels a host link body may have beyond MAX_FRAME_DEPTH (the envelope around
a tool call's result)."""
LINK_CONNECT_TIMEOUT_S = 5.0
"""Seconds to open a host link before the request goes through Ray instead."""
LINK_RETRY_AFTER_S = 5.0
"""Seconds after a failed host link open before the next attempt (meanwhile: through Ray)."""
LINK_MAX_CALLS = 1024
"""Calls one sandbox host serves at once on its link, running or waiting for a worker
(gRPC's ``maximum_concurrent_rpcs``: HTTP/2 carries every request of a replica on one
connection); more are answered RESOURCE_EXHAUSTED before anything runs."""
LINK_KEEPALIVE_S = 20.0
"""Seconds between keepalive pings on a host link connection (both ends)."""
LINK_KEEPALIVE_TIMEOUT_S = 10.0
"""Seconds a keepalive ping may go unanswered before the connection counts as dead."""
LINK_IDLE_S = 600.0
"""Seconds a host link connection may go without a call before the host closes it."""
