"""dlrmkit: hybrid-parallel DLRM training with embedding tables larger than one device."""

__version__ = "0.1.0"
