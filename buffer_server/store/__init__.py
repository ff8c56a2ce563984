"""The durable store (SQLite, WAL, synchronous=FULL): idempotent writes by uid, group rules,
leases and pruning (`buffer_store.py`), with the append-only body log (`bodylog.py`), the JSON
reply cache (`jsoncache.py`) and the ingest workers that parse uploads (`ingest.py`).

May import: slime_ext.trajectory, krl_common.
"""
