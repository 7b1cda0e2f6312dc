"""Placement-free checkpoints: each table stored as one logical tensor (shards stitched), written
atomically with checksums, loadable under any world size and plan.

save_load.py  save, verify and load a checkpoint (torch.distributed.checkpoint's planner)
storage.py    raw tensor bytes and JSON metadata under DCP: no pickle
state.py      the logical state of a model and its optimizers
manifest.py   manifest.json, read as untrusted input
dirs.py       step_N folders, the `latest` pointer, pruning
legacy.py     the first checkpoint format, read without running code
"""
