"""Old path of the dry run's tiny model writer, kept so `python -m slime_ext.tiny_model` still works.

The code lives in `slime_ext.dev_engine.tiny_model` now; this module only runs it.
"""

from slime_ext.dev_engine.tiny_model import main

if __name__ == "__main__":
    raise SystemExit(main())
