"""Daily budgets of harvest model calls: checked before each call, each call added after.

A budget is per owner (``GLEANER_BUDGET_OWNER_*_PER_DAY``) and per queued import
(``GLEANER_BUDGET_IMPORT_*_PER_DAY``), in tokens (prompt + completion) and in dollars where
litellm's cost map knows the model's price, per UTC day (``store.jobs.spend``). A call is made
only while the day's spend is under every limit; the call that crosses a limit is the last,
so a day ends at most one call over it (one per worker harvesting that owner at the same
moment). The transcript whose call is refused fails whole as ``budget_exceeded``: nothing
of it is written, and ``gleaner retry`` runs it on a later day.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from gleaner.harvest.errors import HarvestError
from gleaner.store import StorageFailure
from gleaner.store.jobs import spend

if TYPE_CHECKING:
    from gleaner.harvest.outcome import Counts
    from gleaner.store import Store

log = logging.getLogger(__name__)


class BudgetExceeded(HarvestError):
    """Raised before a model call when an owner or an import spent its day's budget."""

    reason = "budget_exceeded"


@dataclass(frozen=True)
class Limit:
    kind: spend.Kind
    key: str
    tokens: int | None
    usd: float | None


@dataclass
class Budget:
    """The budgets one harvest's model calls count against."""

    store: Store
    model: str
    limits: tuple[Limit, ...]
    priced: bool  # some limit is in dollars: each call's price is looked up

    def before_call(self) -> None:
        """BudgetExceeded when a limit is spent for today; else nothing."""
        day = spend.today()
        with self.store.connection() as conn:
            for limit in self.limits:
                spent = spend.spent(conn, limit.kind, limit.key, day)
                if limit.tokens is not None and spent.tokens >= limit.tokens:
                    what = f"{spent.tokens:,} of its {limit.tokens:,} tokens"
                    self._refuse(limit, what, "TOKENS", day)
                if limit.usd is not None and spent.cost_usd >= limit.usd:
                    what = f"${spent.cost_usd:.4f} of its ${limit.usd:.4f}"
                    self._refuse(limit, what, "USD", day)

    def _refuse(self, limit: Limit, what: str, unit: str, day: str) -> None:
        raise BudgetExceeded(
            f"{limit.kind} {limit.key!r} spent {what} today ({day} UTC; "
            f"GLEANER_BUDGET_{limit.kind.upper()}_{unit}_PER_DAY): no model call is made "
            "for it until tomorrow; `gleaner retry` runs this conversation then"
        )

    def after_call(self, cost: Counts) -> None:
        """Add one call (answered or not) to today's spend of every key it counts against."""
        tokens = cost.prompt_tokens + cost.completion_tokens
        dollars = 0.0
        if self.priced:  # litellm's cost map is loaded only for a budget in dollars
            dollars = price(self.model, cost.prompt_tokens, cost.completion_tokens) or 0.0
        day = spend.today()
        try:
            with self.store.transaction() as session:
                for limit in self.limits:
                    spend.add(
                        session,
                        limit.kind,
                        limit.key,
                        day,
                        calls=cost.model_calls,
                        tokens=tokens,
                        cost_usd=dollars,
                    )
        except StorageFailure:  # the answer is worth more than the count: keep going
            log.warning("could not add a model call's %d tokens to today's spend", tokens)


def budget_for(store: Store, owner: str, import_id: str | None) -> Budget | None:
    """The budgets a harvest of ``owner``'s (from ``import_id``, when queued by an import)
    counts against; None when none is set, or when no model makes calls (the offline
    harvester): then nothing is checked or counted, at no cost to a job."""
    settings = store.settings
    if not settings.harvest_model:
        return None
    limits = [
        Limit(
            "owner", owner, settings.budget_owner_tokens_per_day, settings.budget_owner_usd_per_day
        )
    ]
    if import_id is not None:
        limits.append(
            Limit(
                "import",
                import_id,
                settings.budget_import_tokens_per_day,
                settings.budget_import_usd_per_day,
            )
        )
    limits = [limit for limit in limits if limit.tokens is not None or limit.usd is not None]
    if not limits:
        return None
    priced = any(limit.usd is not None for limit in limits)
    return Budget(store, settings.harvest_model, tuple(limits), priced)


def price(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What litellm's cost map says the call cost in dollars; None when it does not know
    the model (a local server, say)."""
    if not _known(model):
        return None
    import litellm

    prompt, completion = litellm.cost_per_token(
        model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
    )
    return float(prompt + completion)


@cache
def _known(model: str) -> bool:
    import litellm

    try:
        litellm.cost_per_token(model=model, prompt_tokens=1, completion_tokens=1)
    except Exception:  # noqa: BLE001 - litellm raises plain exceptions for unknown models
        return False
    return True
