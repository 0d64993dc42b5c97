"""What a simulation tells its user: recompilations and their causes (``recompilation``), the
real compiler's figures per graph (``compile_report``), per-chip HBM bars (``memory_view``),
and which torch_xla 2.9 names are simulated (``support_matrix``)."""
