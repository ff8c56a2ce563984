"""The durable store (SQLite, WAL, synchronous=FULL): idempotent writes by uid, group rules,
leases and pruning. `buffer_store.py` holds `BufferStore` (open, close, stats) and its
docstring tells the store's contracts; the class is composed of its parts: `writes.py` (put
and group commit), `groups.py` (the group rules in SQL, the policy version), `leases.py`
(lease / ack / release), `preparer.py` (the JSON preparer thread) over `core.py` (the shared
transaction and state). Beside them: `schema.py` (tables, version, migration), `rules.py`
(GroupRules and the drop reasons), `results.py` (what the API returns and raises), the
append-only body log (`bodylog.py`), the JSON reply cache (`jsoncache.py`) and the ingest
workers that parse uploads (`ingest.py`).

May import: slime_ext.trajectory, krl_common.
"""
