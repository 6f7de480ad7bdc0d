"""Test-only stand-in for the ``mooncake`` package (tests/test_pd_server.py puts its parent directory on
the servers' PYTHONPATH): only ``mooncake.engine.TransferEngine``, a loopback TCP data plane."""
