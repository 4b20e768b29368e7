"""RoPE math tests compare against transformers' rotary modules; keep their config warnings quiet."""

from __future__ import annotations

import transformers

transformers.logging.set_verbosity_error()
