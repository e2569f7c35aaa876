"""The unit of work: :class:`Database` hands out read sessions and write transactions.

Every service reaches the control database through one instance (created in the app's
lifespan): ``with db.read() as s: ...`` for reads, ``with db.write() as s: ...`` for a
transaction that commits when the block ends (and rolls back when it raises);
``with db.write_connection() as conn: ...`` is the same transaction on a Core connection,
for hot paths that only run prepared Core statements (no ORM session: about half the
CPU of a small write on SQLite). SQLite has
one writer at a time and its busy handler sleeps in growing steps (up to 100 ms) when
writers collide, so on SQLite writers queue on an in-process lock instead (FIFO-ish, no
sleeping); other databases go straight in. On SQLite, ``write_connection`` transactions
run on one Core connection the instance keeps between them (the writer's own, used only
under that lock): checking a connection out of the pool and back in cost as much CPU as
a step's whole write. A transaction that fails returns that connection to the pool
(reset there) and the next one takes a fresh one; :meth:`Database.close` returns it at
shutdown. A database failure (``SQLAlchemyError``) is
:class:`~sandpit.api.errors.ServiceUnavailable` (503, ``Retry-After: 1``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Executable,
    Result,
    RowMapping,
    ScalarResult,
    Table,
    delete,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Mapper, Session, sessionmaker

from ..errors import ServiceUnavailable

_Model = TypeVar("_Model")


class Database:
    """Sessions of one engine (see the module docstring)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        bind = sessions.kw["bind"]
        self.engine: Engine = bind
        self.dialect: str = bind.dialect.name
        """``sqlite``, ``postgresql``, ..."""
        self._write_lock = threading.Lock()
        self._serialize_writes = self.dialect == "sqlite"
        self._writer: Connection | None = None
        """SQLite: the Core connection ``write_connection`` keeps between transactions
        (used only under ``_write_lock``; None until the first, and after a failure)."""

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A session for reads (objects stay usable after the block). Raises
        ServiceUnavailable when the database fails."""
        try:
            with self.sessions() as db:
                yield db
        except SQLAlchemyError as exc:
            raise ServiceUnavailable(f"database error: {type(exc).__name__}", retry_after=1) from exc

    @contextmanager
    def read_connection(self) -> Iterator[Connection]:
        """A Core connection for reads, for hot paths that run prebuilt Core statements
        (no ORM session, and a statement built once: its construction and cache key cost
        more than a small query itself). Raises ServiceUnavailable when the database
        fails."""
        with self._translated(), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction, committed at the end of the block (one writer at a time on
        SQLite). Raises ServiceUnavailable when the database fails."""
        if self._serialize_writes:
            with self._write_lock, self.read() as db, db.begin():
                yield db
        else:
            with self.read() as db, db.begin():
                yield db

    @contextmanager
    def write_connection(self) -> Iterator[Connection]:
        """A transaction on a Core connection (same lock and error translation as
        :meth:`write`), committed at the end of the block. Raises ServiceUnavailable
        when the database fails."""
        if self._serialize_writes:
            with self._write_lock, self._translated():
                conn = self._writer
                if conn is None:
                    conn = self._writer = self.engine.connect()
                try:
                    with conn.begin():
                        yield conn
                except BaseException:
                    self._writer = None  # back to the pool, whose reset rolls back what is left
                    conn.close()
                    raise
        else:
            with self._translated(), self.engine.begin() as conn:
                yield conn

    def write_free(self) -> bool:
        """Whether a :meth:`write_connection` transaction would start now without waiting
        for this process's other writers: on SQLite, nobody holds the writers' lock (a
        hint: another thread may take it first); on other databases always False (a
        commit is a round trip to the server, never done where waiting is not allowed)."""
        return self._serialize_writes and not self._write_lock.locked()

    def delete_found(self, table: Table, where: ColumnElement[bool]) -> int:
        """Delete the rows of ``table`` matching ``where``; returns how many. A read looks
        for one first and the write transaction is opened only when it finds one, so a
        periodic sweep that finds nothing (expired keys, expired sessions) never waits
        for, nor holds up, the writers (on SQLite, the steps' group commits). Raises
        ServiceUnavailable (database)."""
        with self.read_connection() as conn:
            if conn.execute(select(text("1")).select_from(table).where(where).limit(1)).first() is None:
                return 0
        with self.write_connection() as conn:
            return int(conn.execute(delete(table).where(where)).rowcount or 0)

    def close(self) -> None:
        """Return the connection ``write_connection`` keeps (SQLite) to the pool; the next
        write takes a new one. Call it before disposing of the engine (the app's lifespan
        does); safe to call twice."""
        with self._write_lock:
            conn, self._writer = self._writer, None
        if conn is not None:
            conn.close()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise ServiceUnavailable(f"database error: {type(exc).__name__}", retry_after=1) from exc

    def ping(self) -> None:
        """``SELECT 1``; raises the driver's error when the database does not answer."""
        with self.sessions() as db:
            db.execute(text("SELECT 1"))


class CoreSession:
    """The part of an ORM session that the store's writers use (``get_bind``, ``execute``,
    ``scalar``, ``scalars``: :meth:`~.store.PendingBlobs.write`,
    :func:`~.configs.store_config`), over a Core connection of
    :meth:`Database.write_connection`: their own statements run as Core, without the ORM
    session's unit of work around them (which cost more than the statements on a step's
    or a create's write)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def get_bind(self) -> Engine | Connection:
        """The connection (its ``dialect`` picks the insert statement)."""
        return self.conn

    def execute(self, statement: Executable, rows: list[dict[str, Any]] | None = None) -> Result[Any]:
        """``statement`` with ``rows`` (an ``executemany``), or without parameters."""
        return self.conn.execute(statement, rows)

    def scalar(self, statement: Executable, parameters: dict[str, Any] | None = None) -> Any:
        """The first column of the first row of ``statement`` with ``parameters`` (None: no row)."""
        return self.conn.scalar(statement, parameters)

    def scalars(self, statement: Executable) -> ScalarResult[Any]:
        """The first column of every row of ``statement``."""
        return self.conn.scalars(statement)


def insert_objects(conn: Connection, *objects: object) -> None:
    """Insert new ORM ``objects`` through ``conn`` (Core), one statement each, in order:
    the attributes each was given become its row, its table's column defaults fill the
    rest. The objects stay transient (no session knows them), so they keep exactly the
    values given and read no default back (an autoincrement id stays None). For the rows
    of a write that only inserts (an env create's), at a fraction of an ORM flush's CPU."""
    for obj in objects:
        statement, columns = _inserts(type(obj))
        given = vars(obj)
        conn.execute(statement, {column: given[key] for key, column in columns if key in given})


def object_of(model: type[_Model], row: RowMapping) -> _Model:
    """A transient ``model`` object holding ``row`` (a Core result row of its table, every
    column): what a hot read gives its callers instead of an ORM load, at half its CPU.
    Read-only by contract: the object belongs to no session, so adding it to one would
    insert it again."""
    return model(**{key: row[column] for key, column in _inserts(model)[1]})


_INSERTS: dict[type, tuple[Executable, tuple[tuple[str, str], ...]]] = {}


def _inserts(model: type) -> tuple[Executable, tuple[tuple[str, str], ...]]:
    """The insert of ``model``'s table and its (attribute, column) names, built once per
    model (a race builds it twice, harmlessly)."""
    found = _INSERTS.get(model)
    if found is None:
        mapper: Mapper[Any] = inspect(model)
        found = _INSERTS[model] = (cast(Table, mapper.local_table).insert(),
                                   tuple((attr.key, attr.columns[0].name) for attr in mapper.column_attrs))
    return found

