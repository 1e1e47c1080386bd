"""``python -m sdqes_edge.cli``: the same as the ``sdqes-edge`` command."""

from sdqes_edge.cli import main

if __name__ == "__main__":  # not again in a process the command starts (sample.sample_frames_in_parallel)
    main()
