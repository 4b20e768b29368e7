"""One log format for the whole process: every line on stderr is a JSON object.

Each line has ``time`` (ISO-8601, UTC, milliseconds), ``level``, ``logger`` and ``message``; access lines add
the request's fields (see ``api/middleware.py``). uvicorn's own lines (start, shutdown, drain, errors) take the
same format through :func:`logging_config`, which ``ropeserve serve`` hands to uvicorn as its ``log_config``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FIELDS_ATTRIBUTE = "fields"
"""``logger.info(message, extra={"fields": {...}})`` adds these keys to the JSON line."""
ACCESS_LOGGER = "ropeserve.access"
"""One line per request, at info whatever the log level (``ROPESERVE_ACCESS_LOG`` turns it off)."""
SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi", "ropeserve")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, extra fields, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        time = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        entry: dict[str, Any] = {
            "time": time.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, FIELDS_ATTRIBUTE, {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def json_handler() -> logging.Handler:
    """A stderr handler writing :class:`JsonFormatter` lines."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    return handler


def logging_config(level: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict (uvicorn's ``log_config``): uvicorn and ropeserve log JSON to stderr."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": f"{__name__}.JsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
        "loggers": {
            **{name: {"handlers": ["stderr"], "level": level.upper(), "propagate": False} for name in SERVER_LOGGERS},
            ACCESS_LOGGER: {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        },
    }
