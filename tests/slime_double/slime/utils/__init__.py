"""TEST DOUBLE (see tests/slime_double/__init__.py)."""
