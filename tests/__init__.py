"""The test suite: a package, so that pytest puts the repository root on sys.path and ``tests.support``
(test-only helpers) and ``lab`` import by their full names."""
