"""The ORM's declarative base, on the Core tables' ``METADATA``: every mapped model derives
from it (``store.schema.models``, ``store.schema.records``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime
from sqlalchemy.orm import DeclarativeBase

from gleaner.store.schema.tables import METADATA


class Base(DeclarativeBase):
    metadata = METADATA
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: DateTime(timezone=True),
    }
