"""The workers' settings: the broker, Celery's time limits and events, and the guards that
replace or stop a worker (tasks, memory, a stall), and the requeue of lost messages."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from gleaner.config.base import Part

# The broker URLs Gleaner can use: kombu's Redis transports.
REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "unix://", "sentinel://")


class WorkerSettings(Part):
    """The Celery side's knobs (``gleaner.workers``)."""

    broker_url: str | None = Field(
        default=None, description="Redis URL of the Celery broker; unset runs tasks in process."
    )
    task_soft_time_limit: int = Field(
        default=900, gt=0, description="Seconds before a task is asked to stop (SoftTimeLimit)."
    )
    task_time_limit: int = Field(
        default=960, gt=0, description="Seconds before a task's worker child is killed."
    )
    task_events: bool = Field(
        default=False,
        description="Workers send task events (what Flower and `celery events` show).",
    )
    broker_visibility_timeout: int = Field(
        default=3_600,
        gt=0,
        description="Seconds before Redis redelivers an unacknowledged task; above the limits.",
    )
    worker_max_tasks_per_child: int = Field(
        default=10_000,
        gt=0,
        description="Tasks before a worker child is replaced (a last bound on slow leaks).",
    )
    worker_max_memory_per_child: int = Field(
        default=512,
        ge=0,
        description="Resident MB after which a worker child is replaced once its task ends "
        "(bounds leaks, litellm's included); 0 turns the check off.",
    )
    worker_stall_seconds: int = Field(
        default=120,
        ge=0,
        description="A worker with a free slot that takes no message while some wait on its "
        "queues for this long exits (code 70) to be restarted; 0 turns the check off.",
    )
    requeue_after_seconds: int = Field(
        default=900,
        gt=0,
        description="A pending job sent this long ago whose message is not on its queue is "
        "sent again.",
    )

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str | None) -> str | None:
        # Celery takes any kombu transport, but Gleaner's queues, sweep and health read Redis.
        if value is not None and not value.startswith(REDIS_SCHEMES):
            scheme = value.partition("://")[0] if "://" in value else "no scheme"
            raise ValueError(f"must be a Redis URL ({', '.join(REDIS_SCHEMES)}), got {scheme}")
        return value

    @model_validator(mode="after")
    def _check_limits(self) -> WorkerSettings:
        # A task must be stopped before Redis hands its message to another worker.
        if not self.task_soft_time_limit < self.task_time_limit < self.broker_visibility_timeout:
            raise ValueError(
                "GLEANER_TASK_SOFT_TIME_LIMIT < GLEANER_TASK_TIME_LIMIT < "
                "GLEANER_BROKER_VISIBILITY_TIMEOUT must hold, got "
                f"{self.task_soft_time_limit}, {self.task_time_limit}, "
                f"{self.broker_visibility_timeout}"
            )
        return self
