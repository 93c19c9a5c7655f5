"""Hostile-client tests reuse the RPC test helpers of tests/backend/rpc (the raw client, the server launcher)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backend" / "rpc"))
