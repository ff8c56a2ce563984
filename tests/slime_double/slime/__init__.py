"""TEST DOUBLE of the `slime` package (see tests/slime_double/__init__.py). Not slime."""

IS_TEST_DOUBLE = True
