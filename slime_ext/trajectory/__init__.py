"""The trajectory record the buffer stores and the trainer reads (`record.py`, the one
definition) and its packed binary form with the upload and batch-reply framing (`codec.py`).

May import: krl_common.
"""
