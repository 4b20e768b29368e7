"""Config-normalisation tests compare against transformers' config classes; keep their warnings quiet."""

from __future__ import annotations

import transformers

transformers.logging.set_verbosity_error()
