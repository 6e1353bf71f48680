"""Harvest's Prometheus metrics (prometheus_client's default registry): model calls, tokens
and cost by model, jobs finished by outcome and how long they ran.

Counted in the process that does the work; ``gleaner worker --metrics-port`` serves them
summed over its pool's processes (prometheus_client's multiprocess mode), the HTTP service
at ``/metrics`` (``workers.metrics``).
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

MODEL_CALLS = Counter(
    "gleaner_model_calls", "Harvest model calls made, answered or not, by model.", ["model"]
)
MODEL_TOKENS = Counter(
    "gleaner_model_tokens",
    "Tokens of harvest model calls, by model and kind (prompt, completion).",
    ["model", "kind"],
)
MODEL_COST = Counter(
    "gleaner_model_cost_usd",
    "Dollars of harvest model calls whose price litellm's cost map knows, by model.",
    ["model"],
)
JOBS_FINISHED = Counter(
    "gleaner_jobs_finished",
    "Harvest job runs that ended, by outcome (harvested, skipped, failed, ...).",
    ["status"],
)
JOB_SECONDS = Histogram(
    "gleaner_job_duration_seconds",
    "Wall time of one harvest job run, from its claim to its outcome.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
