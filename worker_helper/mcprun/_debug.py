"""The progress reporter's debug lines, on the rank's stderr under MCPRUN_PROGRESS_DEBUG=1."""

import os
import sys


def debug(message):
    if os.environ.get("MCPRUN_PROGRESS_DEBUG") == "1":
        sys.stderr.write(f"mcprun progress: {message}\n")
