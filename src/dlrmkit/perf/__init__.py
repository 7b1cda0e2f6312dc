"""Performance tools for `dlrmkit bench` and `dlrmkit plan --simulate`: step profiles, a
plain-PyTorch reference loop, a scaling simulator, plots and optional fast kernels."""
