"""``python -m sdqes_edge.cli``: the same as the ``sdqes-edge`` command."""

from sdqes_edge.cli import main

main()
