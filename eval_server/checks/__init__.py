"""What decides a candidate's verdict besides its speed: static rules on the Python source
(`static.py`, reading it through `source_ast.py`) and on CUDA/C++ sources (`cuda_static.py`),
runtime checks (`runtime.py`: launches, torch ops, threads, patched namespaces), output
comparison (`compare.py`, fused on the GPU by `close_kernel.py`), the physics floor
(`physics_floor.py`) and persisting-L2 control (`persisting_l2.py`).

May import: eval_server.schema.
"""
