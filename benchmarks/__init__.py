"""sdqes_edge.benchmarks: what it costs to run each model form, measured side by side (``sdqes-edge bench``)."""
