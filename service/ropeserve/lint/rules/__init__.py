"""Rule modules, one per family; importing this package registers every rule in ``findings.RULES``."""

from ropeserve.lint.rules import extension, length, mrope, numerics, pairing, positions, ranges, schema

__all__ = ["extension", "length", "mrope", "numerics", "pairing", "positions", "ranges", "schema"]
