"""Read-only views of one evaluation for the web viewer: its episodes a page at a time
(10,000 rows never load at once), the histogram of its rewards computed in the database,
and one episode's stored result (trajectory and checks, readable after its env is gone).
Every read first checks the evaluation is the caller's (NotFound otherwise, as the API).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import case, func, select
from sqlalchemy.orm import defer

from ..db import models
from ..db.database import Database
from ..errors import NotFound
from ..services.common import owned
from ..services.quotas import TenantContext

HISTOGRAM_BINS = 10
"""Reward histogram bins over [0, 1]: ``[0, 0.1)``, ..., ``[0.9, 1.0]`` (1.0 in the last)."""


@dataclass(frozen=True)
class Histogram:
    """Finished, scored episodes per reward bin; ``outside`` counts rewards out of [0, 1]."""

    counts: list[int]
    outside: int

    @property
    def peak(self) -> int:
        """The largest bin count (at least 1, to scale bars by)."""
        return max([1, *self.counts])


class EvaluationListings:
    """Paged reads of an evaluation's episodes (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def episodes(self, ctx: TenantContext, evaluation_id: str, status: str | None, limit: int,
                 offset: int) -> tuple[list[models.EvaluationEpisode], int]:
        """A page of the evaluation's episodes in index order (transcripts and
        trajectories not loaded), optionally of one ``status``; and how many matched.
        Raises NotFound (unknown evaluation or another tenant's)."""
        row = models.EvaluationEpisode
        query = select(row).where(row.evaluation_id == evaluation_id)
        if status:
            query = query.where(row.status == status)
        with self.db.read() as db:
            owned(db, models.EvaluationJob, evaluation_id, ctx.tenant, "evaluation")
            total = db.scalar(select(func.count()).select_from(query.subquery())) or 0
            rows = db.scalars(query.options(defer(row.transcript), defer(row.trajectory), defer(row.tool_calls),
                                            defer(row.checks))
                              .order_by(row.index).limit(limit).offset(offset)).all()
        return list(rows), total

    def histogram(self, ctx: TenantContext, evaluation_id: str) -> Histogram:
        """Rewards of the evaluation's ``done`` episodes in :data:`HISTOGRAM_BINS` bins
        (one grouped query; the bin is a ``CASE`` on the reward, which SQLite and
        PostgreSQL compute alike, where a cast of ``reward * 10`` would truncate on one and
        round on the other). Raises NotFound."""
        row = models.EvaluationEpisode
        bins = [(row.reward < (index + 1) / HISTOGRAM_BINS, index) for index in range(HISTOGRAM_BINS - 1)]
        bin_of = case((row.reward < 0, -1), (row.reward > 1, -1), *bins, else_=HISTOGRAM_BINS - 1)
        with self.db.read() as db:
            owned(db, models.EvaluationJob, evaluation_id, ctx.tenant, "evaluation")
            found = db.execute(select(bin_of, func.count()).where(
                row.evaluation_id == evaluation_id, row.status == "done", row.reward.is_not(None))
                .group_by(bin_of)).all()
        counts, outside = [0] * HISTOGRAM_BINS, 0
        for index, count in found:
            if 0 <= index < HISTOGRAM_BINS:
                counts[index] += int(count)
            else:
                outside += int(count)
        return Histogram(counts=counts, outside=outside)

    def episode(self, ctx: TenantContext, evaluation_id: str, index: int) -> models.EvaluationEpisode:
        """One episode's stored result (with trajectory, checks and transcript). Raises
        NotFound (unknown evaluation, another tenant's, or no such index)."""
        with self.db.read() as db:
            owned(db, models.EvaluationJob, evaluation_id, ctx.tenant, "evaluation")
            found = db.get(models.EvaluationEpisode, (evaluation_id, index))
        if found is None:
            raise NotFound(f"episode {index} of evaluation {evaluation_id[:64]!r} not found")
        return found
