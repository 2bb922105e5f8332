"""Test fixtures that are code, not pytest fixtures: imported as `tests.support.<module>`.

`tests/` itself stays without `__init__.py` (the root conftest imports `ci_skip_guard` from its
own directory); `tests` is found as a namespace package through `pythonpath = ["."]`.
"""
