"""HTTP layer (FastAPI): thin routes over positions, rope, serving and lint."""

from ropeserve.api.app import create_app

__all__ = ["create_app"]
