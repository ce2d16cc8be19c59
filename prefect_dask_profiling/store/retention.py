"""Retention and links: reports expire (an S3 lifecycle rule, or a sweep), links are presigned.

Only ``reports/`` expires: a run's record and the index are what history is judged on.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

from prefect_dask_profiling.errors import InvalidInput
from prefect_dask_profiling.store import layout, s3
from prefect_dask_profiling.store.access import FileInfo, StoreAccess
from prefect_dask_profiling.store.tables import first_line

logger = logging.getLogger(__name__)


class Retention(StoreAccess):
    """The retention side of :class:`~prefect_dask_profiling.store.runs.RunStore`."""

    def ensure_lifecycle(self, retention_days: int) -> str | None:
        """On S3, make sure ``reports/`` expires after ``retention_days`` (merged by rule ID).

        Returns ``None`` when the rule is in place (or the backend keeps none), else a warning
        (missing permission, missing bucket, unreachable endpoint): it never raises for those.
        """
        if isinstance(retention_days, bool) or not isinstance(retention_days, int) \
                or retention_days < 1:
            raise InvalidInput("retention_days must be a whole number >= 1, "
                               f"got {retention_days!r}")
        plan = self.backend.lifecycle(retention_days)
        if plan is None:
            return None
        try:
            self._check_reachable()
            self.backend.put_lifecycle(plan)
        except Exception as exc:
            self.breaker.trip_if_unreachable(exc)
            code = s3.error_code(exc)
            cause = f"{code}: {first_line(exc)}" if code else self._describe(exc)
            fix = (f"grant {plan.permissions}, or "
                   if isinstance(exc, PermissionError) else "retry later, or ")
            message = self._redact(
                f"could not set the lifecycle rule on bucket {plan.container!r} ({cause}): "
                f"objects under {plan.expiring} will not expire automatically; {fix}run "
                f"`dask-profiling sweep --store {self.url}` regularly")
            logger.warning(message)
            return message
        return None

    def sweep(self, older_than_days: float, now: datetime | None = None) -> list[str]:
        """Delete whole ``reports/<pipeline>/<run_id>/`` folders whose newest file is too old.

        Nothing outside ``reports/`` is touched. A folder with any file of unknown age, or a
        name that is not ours, is kept. Returns the locations of the removed folders.
        """
        if isinstance(older_than_days, bool) or not isinstance(older_than_days, int | float) \
                or not math.isfinite(older_than_days) or older_than_days <= 0:
            raise InvalidInput("older_than_days must be a positive number, "
                               f"got {older_than_days!r}")
        cutoff = (now or datetime.now(UTC)) - timedelta(days=older_than_days)
        ages: dict[tuple[str, str], list[datetime | None]] = {}
        for rel, info in self._find(layout.REPORTS).items():
            run = layout.parse_report(rel)
            if run is not None:
                ages.setdefault(run, []).append(mtime(info))
        removed = []
        for (pipeline, run_id), mtimes in sorted(ages.items()):
            if None in mtimes or max(mtimes) >= cutoff:  # unknown age or still fresh: keep
                continue
            rel = layout.report_dir(pipeline, run_id)
            try:
                self.memory.forget()
                self.fs.rm(self._path(rel), recursive=True, **self._kw)
            except Exception as exc:
                logger.warning("could not remove %s: %s", self.location(rel),
                               self._describe(exc))
                continue
            removed.append(self.location(rel))
        return removed

    def presign(self, location: str, expires_s: int) -> str | None:
        """A presigned HTTPS GET link to an S3 ``location`` valid for ``min(expires_s, 7 days)``.

        ``None`` for non-S3 stores, when signing fails, or when the credentials carry a
        session token (the link would contain it).
        """
        if isinstance(expires_s, bool) or not isinstance(expires_s, int) or expires_s <= 0:
            raise InvalidInput(f"expires_s must be a positive whole number, got {expires_s!r}")
        rel = self._relative(location)
        try:
            return self.backend.presign(rel, expires_s)
        except Exception as exc:
            logger.warning("could not sign a link to %s: %s", self.location(rel),
                           self._describe(exc))
            return None


def mtime(info: FileInfo) -> datetime | None:
    """A file's modification time from a listing's ``info`` (s3fs or local), if it has one."""
    for key in ("LastModified", "last_modified", "mtime", "modified", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value if value.tzinfo else value.replace(tzinfo=UTC)
        if isinstance(value, int | float) and math.isfinite(value) and value > 0:
            return datetime.fromtimestamp(value, UTC)
    return None
