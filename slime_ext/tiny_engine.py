"""Old path of the dry run's embedded engine, kept so `python -m slime_ext.tiny_engine` still works.

The engine lives in `slime_ext.dev_engine.engine` now (docs/LAUNCH.md); this module only runs it.
"""

from slime_ext.dev_engine.engine import main

if __name__ == "__main__":
    raise SystemExit(main())
