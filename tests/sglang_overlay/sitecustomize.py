"""Start-up hook of the test-only SGLang CPU overlay (``specenergy_sglang_overlay``).

Python imports this at start-up in any process that has ``tests/sglang_overlay`` on its
``PYTHONPATH``. It loads the overlay only into an SGLang server asked to speculate and into that
server's child processes (``specenergy_sglang_overlay.wanted``); every other process runs
unmodified. Where the overlay refuses to load (another SGLang release, a real ``sgl_kernel``), the
process exits with the reason: a server must not start half-patched.
"""

import os
import sys

from specenergy_sglang_overlay import OverlayRefused
from specenergy_sglang_overlay import activate
from specenergy_sglang_overlay import wanted

if wanted(sys.orig_argv, os.environ):
    try:
        activate()
    except OverlayRefused as exc:
        # An Exception here would only be printed ("Error in sitecustomize") and the server would
        # start without the overlay; SystemExit stops the interpreter with this message.
        raise SystemExit(f"specenergy SGLang CPU overlay refused to load: {exc}") from exc
