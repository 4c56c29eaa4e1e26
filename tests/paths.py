"""Where the tests find the repository and the real default bundle."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BUNDLE = Path(os.environ.get("SPECRT_TEST_BUNDLE", ROOT / "engines" / "default"))
