"""Clients of the two services an episode talks to: the eval server (`eval_client.py`, with
the kernel backends of its requests in `backends.py`) and SGLang's token-in/token-out
`/generate` (`sglang_client.py`).

May import: eval_server.schema, krl_common.
"""
