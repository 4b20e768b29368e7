"""ropeserve: the reference service for position encodings in LLM serving."""

__version__ = "0.1.0"
